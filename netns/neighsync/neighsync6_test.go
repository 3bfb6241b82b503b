package neighsync

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/test/sandbox"
)

// TestContainerGetsHostNeighbourIPv6: the NDP twin of
// TestContainerGetsHostNeighbour. A container (its own eth0, the host's
// IPv6 address, no path to the wire) needs the client's MAC for an IPv6
// datagram: it sends no solicitation of its own (mcast_solicit=0) but asks
// the Syncer, which makes the host resolve the client and writes the entry
// into the container as permanent; a second container gets it from the
// host's table at once. Both got the router (the IPv6 gateway, a
// link-local address) at Add.
func TestContainerGetsHostNeighbourIPv6(t *testing.T) {
	sb := sandbox.New(t, sandbox.WithIPv6())
	s, hh, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V6)
	v6 := sb.IPv6Net()
	if err := s.EnableIPv6([]net.IPNet{v6}, net.ParseIP("fe80::99"), sb.RouterLL6); err != nil {
		t.Fatal(err)
	}
	ask := func(name string) *netlink.Handle {
		n, h := askingContainer(t, sb, s, name, v6, sb.ClientIP6)
		for k, want := range map[string]string{"net/ipv6/neigh/eth0/app_solicit": "3", "net/ipv6/neigh/eth0/mcast_solicit": "0"} {
			var v string
			err := sysctl.In(n, func(d *sysctl.Dir) (err error) { v, err = d.Read(k); return err })
			if err != nil || v != want {
				t.Errorf("%s: %s = %q (%v), want %s", name, k, v, err, want)
			}
		}
		return h
	}
	has := func(h *netlink.Handle, ip net.IP) func() bool {
		return func() bool { return hasPermanent(h, ip, clientMAC) }
	}
	h1 := ask("n1")
	waitFor(t, s, "the client's MAC in n1", has(h1, sb.ClientIP6))
	waitFor(t, s, "the router's MAC in n1", has(h1, sb.RouterLL6))
	if st := s.Stats(); st.Kicks < 1 || st.Pushed < 2 {
		t.Errorf("stats %+v: want a host resolution and two writes", st)
	}
	kicks := s.Stats().Kicks
	h2 := ask("n2")
	waitFor(t, s, "the client's MAC in n2", has(h2, sb.ClientIP6))
	waitFor(t, s, "the router's MAC in n2", has(h2, sb.RouterLL6))
	if st := s.Stats(); st.Kicks != kicks {
		t.Errorf("the host knew the client: %d more resolutions", st.Kicks-kicks)
	}

	// When the host's entry goes, the containers' copies go too.
	eth0, _ := hh.LinkByName("eth0")
	if err := hh.NeighDel(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, Family: netlink.FAMILY_V6, IP: sb.ClientIP6}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "the client's entry deleted in n1 and n2", func() bool {
		return !has(h1, sb.ClientIP6)() && !has(h2, sb.ClientIP6)()
	})
}

// TestResolvable6: the host resolves for containers only unicast
// neighbours on the link that are not its own addresses.
func TestResolvable6(t *testing.T) {
	s := &Syncer{}
	if s.resolvable(netip.MustParseAddr("2001:db8:1::2")) {
		t.Error("IPv6 resolvable before EnableIPv6")
	}
	n := net.IPNet{IP: net.ParseIP("2001:db8:1::1"), Mask: net.CIDRMask(64, 128)}
	if err := s.EnableIPv6([]net.IPNet{n}, net.ParseIP("fe80::1"), nil); err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]bool{
		"2001:db8:1::2":   true,
		"2001:db8:1::abc": true,
		"fe80::2":         true,
		"2001:db8:1::1":   false, // the host's own
		"fe80::1":         false, // the host's link-local
		"2001:db8:1::":    false, // subnet-router anycast
		"2001:db8:2::2":   false, // off-link
		"ff02::1":         false,
		"::1":             false,
		"::":              false,
	} {
		if got := s.resolvable(netip.MustParseAddr(addr)); got != want {
			t.Errorf("resolvable(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestWaitingIsBounded: a container asking for many addresses of the
// host's /64 that nobody has (the NDP exhaustion pattern) waits for
// MaxWaiting of them at most; the rest are refused and counted. When the
// host's resolutions fail, nothing is left waiting (it may ask again).
func TestWaitingIsBounded(t *testing.T) {
	sb := sandbox.New(t, sandbox.WithIPv6())
	s, _, _ := hostSyncer(t, sb, netlink.FAMILY_V6)
	v6 := sb.IPv6Net()
	if err := s.EnableIPv6([]net.IPNet{v6}, nil, nil); err != nil {
		t.Fatal(err)
	}
	askingContainer(t, sb, s, "n1", v6, sb.ClientIP6)
	const n = MaxWaiting + 44
	s.mu.Lock()
	m := s.ctrs["n1"]
	// its budget is not what this test is about
	bb := budgetBurst
	t.Cleanup(func() { s.mu.Lock(); budgetBurst = bb; s.mu.Unlock() })
	budgetBurst, m.budget.left = time.Hour, time.Hour
	base := mustKey(sb.IPv6Net().IP).As16()
	for i := range n {
		a := base
		a[13], a[14], a[15] = 0x77, byte(i>>8), byte(i)
		s.containerUpdateLocked(m, netlink.NeighUpdate{Type: unix.RTM_GETNEIGH,
			Neigh: netlink.Neigh{LinkIndex: m.eth0, Family: netlink.FAMILY_V6, IP: net.IP(a[:])}})
	}
	waits, waiting, st := len(m.waits), len(s.waiting), s.stats
	s.mu.Unlock()
	if waits != MaxWaiting || waiting > MaxWaiting || st.Refused < n-MaxWaiting {
		t.Errorf("after %d requests for unknown addresses: the container waits for %d, the syncer for %d addresses, stats %+v; want %d at most, %d+ refused",
			n, waits, waiting, st, MaxWaiting, n-MaxWaiting)
	}
	// The host gives up after its 3 solicitations a second apart.
	waitWithin(t, s, 20*time.Second, "the host's resolutions to fail", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(m.waits) == 0 && len(s.waiting) == 0
	})
}
