package neighsync

import (
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// TestContainerGetsHostNeighbour: a container (its own eth0, the host's
// address, no path to the wire) needs the client's MAC. The host does not
// know it yet: the Syncer makes the host resolve it and writes the result
// into the container, which then has a permanent entry; a second
// container asking later gets it at once; after Remove nothing is written.
func TestContainerGetsHostNeighbour(t *testing.T) {
	sb := sandbox.New(t)
	s, _, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V4)
	addr := net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}
	has := func(h *netlink.Handle) func() bool {
		return func() bool { return hasPermanent(h, sb.ClientIP, clientMAC) }
	}
	_, h1 := askingContainer(t, sb, s, "n1", addr, sb.ClientIP)
	waitFor(t, s, "the client's MAC in n1", has(h1))
	if st := s.Stats(); st.Kicks < 1 || st.Pushed < 1 {
		t.Errorf("stats %+v: want a host resolution and a write", st)
	}
	kicks := s.Stats().Kicks
	_, h2 := askingContainer(t, sb, s, "n2", addr, sb.ClientIP)
	waitFor(t, s, "the client's MAC in n2", has(h2))
	if st := s.Stats(); st.Kicks != kicks {
		t.Errorf("the host knew the client: %d more resolutions", st.Kicks-kicks)
	}
	// an address off the host's subnet is never resolved for a container
	if s.resolvable(mustKey(net.IPv4(10, 1, 2, 3))) || s.resolvable(mustKey(sb.HostIP)) || !s.resolvable(mustKey(sb.ClientIP)) {
		t.Error("resolvable: wrong answer for 10.1.2.3, the host IP or the client")
	}
	s.Remove("n1")
	s.Remove("n1") // idempotent
}

// TestContainersShareOneReader: serving containers costs no goroutine per
// container (one reader, one socket for all; 1,000 subscriptions of the
// netlink library held over 100 MiB), and Remove and Close release every
// container.
func TestContainersShareOneReader(t *testing.T) {
	sb := sandbox.New(t)
	hns, err := nshandle.Open(sb.Host.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer hns.Close()
	hh, err := hns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	eth0, err := hh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(hns, hh, eth0.Attrs().Index, net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := runtime.NumGoroutine()
	const n = 30
	for i := range n {
		if err := s.Add(fmt.Sprintf("c%d", i), withEth0(t), "eth0"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Add("c0", withEth0(t), "eth0"); err != nil { // replacing an id releases the old namespace
		t.Fatal(err)
	}
	if g := runtime.NumGoroutine() - before; g > 2 {
		t.Errorf("%d containers served with %d more goroutines, want none per container", n, g)
	}
	s.mu.Lock()
	members := len(s.byNSID)
	s.mu.Unlock()
	if members != n {
		t.Errorf("%d namespaces mapped after %d containers (one replaced), want %d", members, n+1, n)
	}
	for i := range n / 2 {
		s.Remove(fmt.Sprintf("c%d", i))
	}
	s.mu.Lock()
	members = len(s.byNSID)
	s.mu.Unlock()
	if members != n-n/2 {
		t.Errorf("%d namespaces mapped after removing %d of %d, want %d", members, n/2, n, n-n/2)
	}
	s.Close()
	if len(s.byNSID) != 0 || len(s.ctrs) != 0 {
		t.Errorf("after Close: %d namespaces, %d containers left", len(s.byNSID), len(s.ctrs))
	}
}

// withEth0 returns a new namespace holding a veth pair eth0/x0.
func withEth0(t testing.TB) *nshandle.NS {
	t.Helper()
	ns, err := nshandle.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "x0"}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestAddLater: containers queued with AddLater are served in the
// background after Release; a Remove or an Add before their turn cancels them, and a
// path that now holds another namespace is refused (counted as an error).
func TestAddLater(t *testing.T) {
	sb := sandbox.New(t)
	hns := mustOpenNS(t, sb.Host.Path)
	hh, err := hns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	eth0, err := hh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(hns, hh, eth0.Attrs().Index, net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	path := func(ns *nshandle.NS) string { return fmt.Sprintf("/proc/self/fd/%d", ns.Fd()) }
	const n = 12
	for i := range n {
		ns := withEth0(t)
		s.AddLater(fmt.Sprintf("c%d", i), path(ns), "eth0", ns.Ino())
	}
	other := withEth0(t)
	s.AddLater("moved", path(other), "eth0", other.Ino()+1)
	s.Remove("c0")
	s.AddLater("c1", path(other), "eth0", other.Ino()) // queued again: the first is cancelled
	if err := s.Add("c2", withEth0(t), "eth0"); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	workers := s.later.workers
	s.mu.Unlock()
	if p := s.Pending(); p != n-1 || workers != 0 {
		t.Fatalf("before Release: %d pending (want %d), %d workers (want none)", p, n-1, workers)
	}
	s.Release()
	if !wait.Until(10*time.Second, func() bool { return s.Pending() == 0 }) {
		t.Fatalf("%d containers still pending after 10s", s.Pending())
	}
	s.mu.Lock()
	_, has0 := s.ctrs["c0"]
	_, hasMoved := s.ctrs["moved"]
	served, sockets := len(s.ctrs), len(s.byNSID)
	s.mu.Unlock()
	if has0 || hasMoved || served != n-1 || sockets != n-1 {
		t.Errorf("served %d containers (%d namespaces; c0 %v, moved %v), want %d without c0 and moved", served, sockets, has0, hasMoved, n-1)
	}
	if st := s.Stats(); st.Errors != 1 {
		t.Errorf("stats %+v: want one error (the namespace that changed)", st)
	}
	// a queued container whose syncer closes is never served
	s.AddLater("late", path(other), "eth0", other.Ino())
	s.Close()
	if len(s.byNSID) != 0 || len(s.ctrs) != 0 {
		t.Errorf("after Close: %d namespaces, %d containers left", len(s.byNSID), len(s.ctrs))
	}
}

func mustOpenNS(t testing.TB, path string) *nshandle.NS {
	t.Helper()
	ns, err := nshandle.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}
