package containerns

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/netns/nshandle/nstest"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/netns/veth"
)

var testMAC = net.HardwareAddr{0x02, 0x18, 0x00, 0x00, 0x00, 0x01}

// TestConfigure reads back, inside the namespace, every setting Configure
// makes; those a fresh namespace may already hold (rp_filter, inherited
// from the initial namespace) are set to something else first, so that
// each value read back was written.
func TestConfigure(t *testing.T) {
	host, ctr := nstest.Scratch(t), nstest.Scratch(t)
	hh, ch := nstest.Netlink(t, host), nstest.Netlink(t, ctr)
	if _, err := veth.Create(hh, ctr, veth.Spec{Name: "isotest0", PeerName: "eth0", MAC: testMAC, MTU: 1400}); err != nil {
		t.Fatal(err)
	}
	err := sysctl.In(ctr, func(d *sysctl.Dir) error {
		for _, k := range []string{"all", "eth0", "lo"} {
			if err := d.Write("net/ipv4/conf/"+k+"/rp_filter", "2"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pe, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Eth0: "eth0", Addr: net.IPNet{IP: net.IPv4(198, 18, 0, 1), Mask: net.CIDRMask(24, 32)},
		MAC: testMAC, MTU: 1400, Gateway: net.ParseIP("198.18.0.2"),
		Ports: ephemeral.Range{Begin: 32768, End: 33791},
		Copy: []sysctl.Setting{
			{Name: "net/core/somaxconn", Value: "777"}, {Name: "net/ipv4/not_here", Value: "1"},
			{Name: "net/ipv4/tcp_keepalive_time", Value: "1234"}, {Name: "net/ipv4/tcp_rmem", Value: "4096 131072 1048576"},
		},
	}
	cl, err := Configure(ctr, ch, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cl.Eth0 != pe.Attrs().Index || cl.Lo == 0 {
		t.Fatalf("links %+v", cl)
	}
	want := map[string]string{
		"net/ipv4/ip_local_port_range":       "32768 33791",
		"net/ipv4/conf/eth0/accept_local":    "1",
		"net/ipv4/conf/lo/accept_local":      "1",
		"net/ipv4/conf/lo/route_localnet":    "1",
		"net/ipv4/conf/eth0/arp_ignore":      "8",
		"net/ipv4/conf/all/rp_filter":        "0",
		"net/ipv4/conf/eth0/rp_filter":       "0",
		"net/ipv4/conf/lo/rp_filter":         "0",
		"net/ipv4/tcp_keepalive_time":        "1234",
		"net/ipv4/tcp_rmem":                  "4096 131072 1048576",
		"net/ipv6/conf/all/disable_ipv6":     "1",
		"net/ipv6/conf/eth0/disable_ipv6":    "1",
		"net/ipv6/conf/lo/disable_ipv6":      "1",
		"net/ipv6/conf/default/disable_ipv6": "1",
		"net/core/somaxconn":                 "777",
	}
	err = sysctl.In(ctr, func(d *sysctl.Dir) error {
		for k, v := range want {
			got, err := d.Read(k)
			if err != nil || strings.Join(strings.Fields(got), " ") != v {
				t.Errorf("container %s = %q (%v), want %q", k, got, err, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lo, _ := ch.LinkByName("lo")
	eth, _ := ch.LinkByName("eth0")
	if !bytes.Equal(lo.Attrs().HardwareAddr, testMAC) || lo.Attrs().MTU != 1400 || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("container lo: %+v", lo.Attrs())
	}
	if eth.Attrs().Flags&net.FlagUp == 0 {
		t.Fatal("container eth0 down")
	}
	addrs, _ := ch.AddrList(eth, netlink.FAMILY_ALL)
	if len(addrs) != 1 || addrs[0].IPNet.String() != "198.18.0.1/24" {
		t.Fatalf("container eth0 addresses %v (IPv6 must be off)", addrs)
	}
	if eth.Attrs().MTU != EthMTU {
		t.Errorf("container eth0 MTU %d, want %d", eth.Attrs().MTU, EthMTU)
	}
	routes, _ := ch.RouteList(eth, netlink.FAMILY_V4)
	var gw bool
	for _, r := range routes {
		if r.MTU != 1400 {
			t.Errorf("container route %s via %s: MTU metric %d, want the host's 1400", r.Dst, r.Gw, r.MTU)
		}
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.Equal(net.ParseIP("198.18.0.2")) {
			gw = true
		}
	}
	if !gw {
		t.Fatalf("no default route via the gateway: %v", routes)
	}
}
