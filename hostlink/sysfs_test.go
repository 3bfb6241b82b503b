package hostlink

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/nshandle/nstest"
	"github.com/isolatord/isolatord/veth"
)

// TestSysNetPeerCounters reads a veth's counters through the namespace's
// own sysfs and finds the netlink figures, swapped the same way; a device
// of another namespace (the daemon's) is not seen.
func TestSysNetPeerCounters(t *testing.T) {
	host, ctr := nstest.Scratch(t), nstest.Scratch(t)
	hh, ch := nstest.Netlink(t, host), nstest.Netlink(t, ctr)
	idx, err := veth.Create(hh, ctr, veth.Spec{Name: "isosys0", PeerName: "eth0", MAC: testMAC, MTU: 1500})
	if err != nil {
		t.Fatal(err)
	}
	veth.Up(hh, idx)
	eth, _ := ch.LinkByName("eth0")
	a, _ := netlink.ParseAddr("198.18.5.2/24")
	ch.AddrAdd(eth, a)
	ch.LinkSetUp(eth)
	ch.NeighAdd(&netlink.Neigh{LinkIndex: eth.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("198.18.5.1"), HardwareAddr: testMAC})
	s, err := OpenSysNet(host)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 7
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
	// The peer's transmissions are counted on the host end as it
	// receives them, synchronously for a veth; other packets (IPv6
	// neighbour discovery) may come between the reads, so the netlink
	// figures are bracketed by two sysfs reads.
	first, err := s.PeerCounters("isosys0")
	if err != nil {
		t.Fatal(err)
	}
	nl, err := PeerCounters(hh, idx)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.PeerCounters("isosys0")
	if err != nil {
		t.Fatal(err)
	}
	if first.TxPackets < n || first.TxBytes < n*100 ||
		first.TxPackets > nl.TxPackets || nl.TxPackets > last.TxPackets ||
		first.TxBytes > nl.TxBytes || nl.TxBytes > last.TxBytes ||
		first.RxPackets > nl.RxPackets || nl.RxPackets > last.RxPackets {
		t.Fatalf("sysfs counters %+v then %+v, netlink between %+v (want tx packets >= %d)", first, last, nl, n)
	}
	if _, err := s.PeerCounters("lo0-missing"); err == nil {
		t.Fatal("counters of a missing link")
	}
	if _, err := s.PeerCounters("../isosys0"); err == nil {
		t.Fatal("a path accepted as a device name")
	}
}
