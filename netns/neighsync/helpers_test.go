package neighsync

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// hostSyncer starts a Syncer on the sandbox host's eth0 whose neighbour
// table of family fam was emptied first. It returns the Syncer, a handle
// in the host and the client's MAC.
func hostSyncer(t testing.TB, sb *sandbox.Sandbox, fam int) (*Syncer, *netlink.Handle, string) {
	t.Helper()
	hns, err := nshandle.Open(sb.Host.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hns.Close() })
	hh, err := hns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hh.Close)
	eth0, err := hh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := hh.NeighList(eth0.Attrs().Index, fam)
	for _, n := range ns {
		hh.NeighDel(&n)
	}
	s, err := Start(hns, hh, eth0.Attrs().Index, net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ch, err := sb.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := ch.LinkByName("eth0")
	ch.Close()
	if err != nil {
		t.Fatal(err)
	}
	return s, hh, cl.Attrs().HardwareAddr.String()
}

// askingContainer starts container name in sb (servedContainer), then a
// datagram to dst makes it need dst's MAC. It returns its namespace and a
// handle in it.
func askingContainer(t *testing.T, sb *sandbox.Sandbox, s *Syncer, name string, addr net.IPNet, dst net.IP) (*nshandle.NS, *netlink.Handle) {
	t.Helper()
	n, h := servedContainer(t, sb, s, name, addr)
	askFrom(t, n, dst)
	return n, h
}

// servedContainer starts container name in sb: its own eth0 (a veth to x0
// in its namespace: no path to the wire) with address addr, served by s.
// It returns its namespace and a handle in it.
func servedContainer(t *testing.T, sb *sandbox.Sandbox, s *Syncer, name string, addr net.IPNet) (*nshandle.NS, *netlink.Handle) {
	t.Helper()
	c := sb.StartContainer(t, name)
	n := mustOpenNS(t, c.NetNS)
	h := containerEth0(t, n, addr)
	if err := s.Add(name, n, "eth0"); err != nil {
		t.Fatal(err)
	}
	return n, h
}

// containerEth0 gives namespace n an eth0 (a veth to x0 in n), up, with
// address addr, and returns a handle in n.
func containerEth0(t *testing.T, n *nshandle.NS, addr net.IPNet) *netlink.Handle {
	t.Helper()
	h, err := n.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "x0"}); err != nil {
		t.Fatal(err)
	}
	eth0Up(t, h, addr)
	return h
}

// eth0Up sets eth0 and x0 up (handle h) and gives eth0 address addr; it
// returns eth0.
func eth0Up(t testing.TB, h *netlink.Handle, addr net.IPNet) netlink.Link {
	t.Helper()
	for _, l := range []string{"eth0", "x0"} {
		ll, err := h.LinkByName(l)
		if err == nil {
			err = h.LinkSetUp(ll)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	e, err := h.LinkByName("eth0")
	if err == nil {
		err = h.AddrAdd(e, &netlink.Addr{IPNet: &addr, Flags: unix.IFA_F_NODAD})
	}
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// askFrom sends a datagram to dst from namespace n: n needs dst's MAC.
func askFrom(t *testing.T, n *nshandle.NS, dst net.IP) {
	t.Helper()
	if err := n.Do(func() error {
		u, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: dst, Port: 9})
		if err != nil {
			return err
		}
		defer u.Close()
		_, err = u.Write([]byte("x"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// hasPermanent reports whether h's eth0 has a permanent entry ip -> mac.
func hasPermanent(h *netlink.Handle, ip net.IP, mac string) bool {
	fam := netlink.FAMILY_V6
	if ip.To4() != nil {
		fam = netlink.FAMILY_V4
	}
	e, _ := h.LinkByName("eth0")
	ns, _ := h.NeighList(e.Attrs().Index, fam)
	for _, n := range ns {
		if n.IP.Equal(ip) && n.HardwareAddr.String() == mac && n.State == netlink.NUD_PERMANENT {
			return true
		}
	}
	return false
}

// waitFor waits (5 s at most) until cond holds.
func waitFor(t *testing.T, s *Syncer, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, s, 5*time.Second, what, cond)
}

// waitWithin waits (d at most) until cond holds.
func waitWithin(t *testing.T, s *Syncer, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !wait.Until(d, cond) {
		t.Fatalf("timed out waiting for %s (stats %+v)", what, s.Stats())
	}
}

func mustKey(ip net.IP) netip.Addr {
	a, ok := key(ip)
	if !ok {
		panic("not an address: " + ip.String())
	}
	return a
}
