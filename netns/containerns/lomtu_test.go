package containerns

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/netns/nshandle/nstest"
	"github.com/isolatord/isolatord/netns/veth"
)

// TestLoMTU: with LoMTU, Configure gives lo that MTU (eth0 EthMTU, the
// routes through eth0 the host's); SyncIPv4 keeps lo at LoMTU through a
// host MTU change, and without LoMTU puts lo back at the host's MTU.
func TestLoMTU(t *testing.T) {
	host, ctr := nstest.Scratch(t), nstest.Scratch(t)
	hh, ch := nstest.Netlink(t, host), nstest.Netlink(t, ctr)
	if _, err := veth.Create(hh, ctr, veth.Spec{Name: "isotest0", PeerName: "eth0", MAC: testMAC, MTU: EthMTU}); err != nil {
		t.Fatal(err)
	}
	addr := net.IPNet{IP: net.IPv4(198, 18, 0, 1), Mask: net.CIDRMask(24, 32)}
	gw := net.ParseIP("198.18.0.2")
	_, err := Configure(ctr, ch, Config{Eth0: "eth0", Addr: addr, MAC: testMAC, MTU: 1500, LoMTU: LoMTU, Gateway: gw,
		Ports: ephemeral.Range{Begin: 32768, End: 33791}})
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, lo, routes int) {
		t.Helper()
		l, _ := ch.LinkByName("lo")
		eth, _ := ch.LinkByName("eth0")
		if l.Attrs().MTU != lo || eth.Attrs().MTU != EthMTU {
			t.Errorf("%s: lo MTU %d, eth0 MTU %d; want %d, %d", when, l.Attrs().MTU, eth.Attrs().MTU, lo, EthMTU)
		}
		rs, _ := ch.RouteList(eth, netlink.FAMILY_V4)
		for _, r := range rs {
			if r.MTU != routes {
				t.Errorf("%s: route %s MTU %d, want %d", when, r.Dst, r.MTU, routes)
			}
		}
	}
	check("configured", LoMTU, 1500)
	if err := SyncIPv4(ch, "eth0", "lo", Host4{Addr: addr, Gateway: gw, MTU: 1400, LoMTU: LoMTU, MAC: testMAC}); err != nil {
		t.Fatal(err)
	}
	check("host MTU 1400", LoMTU, 1400)
	if err := SyncIPv4(ch, "eth0", "lo", Host4{Addr: addr, Gateway: gw, MTU: 1400, MAC: testMAC}); err != nil {
		t.Fatal(err)
	}
	check("no LoMTU", 1400, 1400)
}
