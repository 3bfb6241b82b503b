package containerns

import (
	"net"
	"slices"
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/netns/nshandle/nstest"
	"github.com/isolatord/isolatord/netns/veth"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestSyncIPv6: a configured container whose host's IPv6 changed (one
// global address replaced, another router, a static route gone) gets
// exactly the new addresses and routes; one configured without IPv6 is
// left as it is.
func TestSyncIPv6(t *testing.T) {
	for _, withIPv6 := range []bool{true, false} {
		host, ctr := nstest.Scratch(t), nstest.Scratch(t)
		hh, ch := nstest.Netlink(t, host), nstest.Netlink(t, ctr)
		if _, err := veth.Create(hh, ctr, veth.Spec{Name: "isotest6", PeerName: "eth0", MAC: testMAC, MTU: 1400}); err != nil {
			t.Fatal(err)
		}
		v6 := hostIPv6()
		cfg := Config{
			Eth0: "eth0", Addr: net.IPNet{IP: net.IPv4(198, 18, 0, 1), Mask: net.CIDRMask(24, 32)},
			MAC: testMAC, MTU: 1400, Gateway: net.ParseIP("198.18.0.2"), Ports: ephemeral.Range{Begin: 40960, End: 40975},
		}
		if withIPv6 {
			cfg.IPv6 = &v6
		}
		cl, err := Configure(ctr, ch, cfg)
		if err != nil {
			t.Fatal(err)
		}
		now := hostlink.IPv6{
			Global:    []net.IPNet{v6.Global[0], mustCIDR("2001:db8:8::1/64")},
			LinkLocal: v6.LinkLocal,
			Routes:    []hostlink.Route6{{Gw: net.ParseIP("fe80::3"), Priority: 1024}},
		}
		if err := SyncIPv6(ch, "eth0", &now, 1400); err != nil {
			t.Fatalf("IPv6 %v: %v", withIPv6, err)
		}
		eth := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: cl.Eth0}}
		as, err := ch.AddrList(eth, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range as {
			got = append(got, a.IPNet.String())
		}
		slices.Sort(got)
		want := []string{"2001:db8:6::1/64", "2001:db8:8::1/64", "fe80::1/64"}
		if !withIPv6 {
			want = nil
		}
		if !slices.Equal(got, want) {
			t.Errorf("IPv6 %v: eth0 addresses %v, want %v", withIPv6, got, want)
		}
		rs, err := ch.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: cl.Eth0, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		var gws []string
		for _, r := range rs {
			if r.Protocol == unix.RTPROT_KERNEL {
				continue
			}
			gws = append(gws, r.Gw.String())
			if r.Dst != nil && r.Dst.String() == "2001:db8:7::/48" {
				t.Errorf("IPv6 %v: the static route the host no longer has is left", withIPv6)
			}
		}
		wantGws := []string{"fe80::3"}
		if !withIPv6 {
			wantGws = nil
		}
		if !slices.Equal(gws, wantGws) {
			t.Errorf("IPv6 %v: routes via %v, want %v (%v)", withIPv6, gws, wantGws, rs)
		}
	}
}
