package hostlink

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/netns/nshandle/nstest"
	"github.com/isolatord/isolatord/netns/veth"
	"github.com/isolatord/isolatord/test/wait"
)

var testMAC = net.HardwareAddr{0x02, 0x18, 0x00, 0x00, 0x00, 0x01}

// hostWithEth0 builds a scratch "host" whose eth0 (198.18.0.1/24, default
// route via 198.18.0.2) is a veth to a scratch "client".
func hostWithEth0(t *testing.T) (hh *netlink.Handle) {
	host, client := nstest.Scratch(t), nstest.Scratch(t)
	hh = nstest.Netlink(t, host)
	idx, err := veth.Create(hh, client, veth.Spec{Name: "eth0", PeerName: "eth0", MAC: testMAC, MTU: 1400})
	if err != nil {
		t.Fatal(err)
	}
	eth := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}
	a, _ := netlink.ParseAddr("198.18.0.1/24")
	if err := hh.AddrAdd(eth, a); err != nil {
		t.Fatal(err)
	}
	if err := veth.Up(hh, idx); err != nil {
		t.Fatal(err)
	}
	ch := nstest.Netlink(t, client)
	ceth, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := netlink.ParseAddr("198.18.0.2/24")
	if err := ch.AddrAdd(ceth, ca); err != nil {
		t.Fatal(err)
	}
	if err := ch.LinkSetUp(ceth); err != nil {
		t.Fatal(err)
	}
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: net.ParseIP("198.18.0.2")}); err != nil {
		t.Fatal(err)
	}
	return hh
}

func TestRead(t *testing.T) {
	hh := hostWithEth0(t)
	lo, _ := hh.LinkByName("lo")
	hh.LinkSetUp(lo)
	hl, err := Read(hh, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if hl.Eth0 != "eth0" || hl.Lo != "lo" || hl.Addr.String() != "198.18.0.1/24" ||
		!bytes.Equal(hl.MAC, testMAC) || hl.MTU != 1400 || !hl.Gateway.Equal(net.ParseIP("198.18.0.2")) ||
		hl.LoIndex != lo.Attrs().Index || hl.Eth0Index == 0 {
		t.Fatalf("host links = %+v", hl)
	}
	if _, err := Read(hh, "nope0", ""); err == nil {
		t.Fatal("missing eth0 accepted")
	}
	if _, err := Read(hh, "lo", ""); err == nil || !strings.Contains(err.Error(), "no Ethernet MAC") {
		t.Fatalf("lo as eth0: %v", err)
	}
	// No default route: the public interface must be named, and then the
	// gateway is nil.
	if err := hh.RouteDel(&netlink.Route{LinkIndex: hl.Eth0Index, Gw: net.ParseIP("198.18.0.2")}); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(hh, "", ""); err == nil {
		t.Fatal("picked a public interface without a default route")
	}
	hl, err = Read(hh, "eth0", "lo")
	if err != nil || hl.Gateway != nil {
		t.Fatalf("named eth0 without default route: %+v %v", hl, err)
	}
}

func TestPeerCounters(t *testing.T) {
	host, ctr := nstest.Scratch(t), nstest.Scratch(t)
	hh, ch := nstest.Netlink(t, host), nstest.Netlink(t, ctr)
	idx, err := veth.Create(hh, ctr, veth.Spec{Name: "isocnt0", PeerName: "eth0", MAC: testMAC, MTU: 1500})
	if err != nil {
		t.Fatal(err)
	}
	veth.Up(hh, idx)
	eth, _ := ch.LinkByName("eth0")
	a, _ := netlink.ParseAddr("198.18.5.2/24")
	ch.AddrAdd(eth, a)
	ch.LinkSetUp(eth)
	// Peer address for the neighbour: a static entry so no ARP is needed.
	ch.NeighAdd(&netlink.Neigh{LinkIndex: eth.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("198.18.5.1"), HardwareAddr: testMAC})
	before, err := PeerCounters(hh, idx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	err = ctr.Do(func() error {
		c, err := net.Dial("udp4", "198.18.5.1:9")
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < n; i++ {
			if _, err := c.Write(make([]byte, 100)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var after Counters
	wait.Until(2*time.Second, func() bool {
		after, err = PeerCounters(hh, idx)
		if err != nil {
			t.Fatal(err)
		}
		return after.TxPackets-before.TxPackets >= n
	})
	if d := after.TxPackets - before.TxPackets; d < n {
		t.Fatalf("container tx packets grew by %d, want >= %d (rx/tx not swapped?)", d, n)
	}
	if after.TxBytes-before.TxBytes < n*100 {
		t.Fatalf("container tx bytes grew by %d", after.TxBytes-before.TxBytes)
	}
	if _, err := PeerCounters(hh, 999999); err == nil {
		t.Fatal("counters of a missing link")
	}

	// The same through the host namespace's own sysfs (a device of another
	// namespace, the test's, would not be found): other packets (IPv6
	// neighbour discovery) may come between the reads, so the netlink
	// figures are bracketed by two sysfs reads.
	s, err := OpenSysNet(host)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first, err := s.PeerCounters("isocnt0")
	if err != nil {
		t.Fatal(err)
	}
	nl, err := PeerCounters(hh, idx)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.PeerCounters("isocnt0")
	if err != nil {
		t.Fatal(err)
	}
	if first.TxPackets < after.TxPackets || first.TxBytes < after.TxBytes ||
		first.TxPackets > nl.TxPackets || nl.TxPackets > last.TxPackets ||
		first.TxBytes > nl.TxBytes || nl.TxBytes > last.TxBytes ||
		first.RxPackets > nl.RxPackets || nl.RxPackets > last.RxPackets {
		t.Fatalf("sysfs counters %+v then %+v, netlink between %+v", first, last, nl)
	}
	if _, err := s.PeerCounters("isocnt-missing"); err == nil {
		t.Fatal("sysfs counters of a missing link")
	}
	if _, err := s.PeerCounters("../isocnt0"); err == nil {
		t.Fatal("sysfs: a path accepted as a device name")
	}
}
