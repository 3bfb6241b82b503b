package neighsync

import (
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/test/sandbox"
)

// TestAddBeforeUp: a container added while its eth0 is down (as a new
// container's, just created) is served without reading its table; its
// first request once eth0 is up reaches the Syncer as a notification and
// is answered.
func TestAddBeforeUp(t *testing.T) {
	sb := sandbox.New(t)
	s, _, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V4)
	c := sb.StartContainer(t, "n1")
	ns := mustOpenNS(t, c.NetNS)
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "x0"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Add("n1", ns, "eth0"); err != nil {
		t.Fatal(err)
	}
	if reads := s.Stats().Reads; reads != 0 {
		t.Errorf("%d tables read at Add of a container whose eth0 is down, want none", reads)
	}
	eth0Up(t, h, net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)})
	askFrom(t, ns, sb.ClientIP)
	waitFor(t, s, "the client's MAC in n1", func() bool { return hasPermanent(h, sb.ClientIP, clientMAC) })
}

// TestAddReadsPendingRequests: a container whose eth0 is up at Add may have
// asked before (its kernel broadcast an ARP request the host keeps): Add
// reads its table and serves the pending request at once, not at the
// container's next try (10 s later here: retrans_time).
func TestAddReadsPendingRequests(t *testing.T) {
	sb := sandbox.New(t)
	s, _, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V4)
	c := sb.StartContainer(t, "n1")
	ns := mustOpenNS(t, c.NetNS)
	addr := net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}
	h := containerEth0(t, ns, addr)
	if err := sysctl.In(ns, func(d *sysctl.Dir) error { return d.Write("net/ipv4/neigh/eth0/retrans_time_ms", "10000") }); err != nil {
		t.Fatal(err)
	}
	askFrom(t, ns, sb.ClientIP)
	if !incomplete(h, sb.ClientIP) {
		t.Fatal("no pending request before Add")
	}
	if err := s.Add("n1", ns, "eth0"); err != nil {
		t.Fatal(err)
	}
	waitWithin(t, s, 3*time.Second, "the client's MAC in n1", func() bool { return hasPermanent(h, sb.ClientIP, clientMAC) })
}

// TestRemoveDuringRead: a container removed while its table is being read
// (without the lock) keeps its read socket until the read is over, then
// it is closed (its namespace released).
func TestRemoveDuringRead(t *testing.T) {
	sb := sandbox.New(t)
	s, _, _ := hostSyncer(t, sb, netlink.FAMILY_V4)
	ns := withEth0(t)
	if err := s.Add("x", ns, "eth0"); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	m := s.ctrs["x"]
	m.reading++ // a read under way
	s.mu.Unlock()
	s.Remove("x")
	if all, _ := routeSockets(t, ns); all != 1 {
		t.Fatalf("removed during a read: %d NETLINK_ROUTE sockets in its namespace, want its read socket still open", all)
	}
	s.mu.Lock()
	dropped := s.endRead(m)
	s.mu.Unlock()
	if all, _ := routeSockets(t, ns); !dropped || all != 0 {
		t.Errorf("after the read: dropped=%v, %d NETLINK_ROUTE sockets, want dropped and none", dropped, all)
	}
}

// TestAddNew: a container whose eth0 is up already, added with AddNew (a
// namespace its caller has just set up), is served without reading its
// table; its requests from then on are answered.
func TestAddNew(t *testing.T) {
	sb := sandbox.New(t)
	s, _, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V4)
	c := sb.StartContainer(t, "n1")
	ns := mustOpenNS(t, c.NetNS)
	h := containerEth0(t, ns, net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)})
	if err := s.AddNew("n1", ns, "eth0"); err != nil {
		t.Fatal(err)
	}
	if reads := s.Stats().Reads; reads != 0 {
		t.Errorf("%d tables read at AddNew, want none", reads)
	}
	askFrom(t, ns, sb.ClientIP)
	waitFor(t, s, "the client's MAC in n1", func() bool { return hasPermanent(h, sb.ClientIP, clientMAC) })
}
