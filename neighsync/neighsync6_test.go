package neighsync

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/nshandle"
	"github.com/isolatord/isolatord/sysctl"
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
	ns, _ := hh.NeighList(eth0.Attrs().Index, netlink.FAMILY_V6)
	for _, n := range ns {
		hh.NeighDel(&n)
	}
	s, err := Start(hns, hh, eth0.Attrs().Index, net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v6 := sb.IPv6Net()
	if err := s.EnableIPv6([]net.IPNet{v6}, net.ParseIP("fe80::99"), sb.RouterLL6); err != nil {
		t.Fatal(err)
	}

	ch, err := sb.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := ch.LinkByName("eth0")
	ch.Close()
	if err != nil {
		t.Fatal(err)
	}
	clientMAC := cl.Attrs().HardwareAddr.String()

	ask := func(name string) *netlink.Handle {
		c := sb.StartContainer(t, name)
		n, err := nshandle.Open(c.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		h, err := n.Netlink()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "x0"}); err != nil {
			t.Fatal(err)
		}
		for _, l := range []string{"eth0", "x0"} {
			ll, _ := h.LinkByName(l)
			h.LinkSetUp(ll)
		}
		e, _ := h.LinkByName("eth0")
		if err := h.AddrAdd(e, &netlink.Addr{IPNet: &v6, Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
		if err := s.Add(name, n, "eth0"); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"net/ipv6/neigh/eth0/app_solicit", "net/ipv6/neigh/eth0/mcast_solicit"} {
			var v string
			err := sysctl.In(n, func(d *sysctl.Dir) (err error) { v, err = d.Read(k); return err })
			if want := map[bool]string{true: "3", false: "0"}[k == "net/ipv6/neigh/eth0/app_solicit"]; err != nil || v != want {
				t.Errorf("%s: %s = %q (%v), want %s", name, k, v, err, want)
			}
		}
		if err := c.Do(func() error {
			u, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: sb.ClientIP6, Port: 9})
			if err != nil {
				return err
			}
			defer u.Close()
			_, err = u.Write([]byte("x"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return h
	}
	has := func(h *netlink.Handle, ip net.IP, mac string) bool {
		e, _ := h.LinkByName("eth0")
		ns, _ := h.NeighList(e.Attrs().Index, netlink.FAMILY_V6)
		for _, n := range ns {
			if n.IP.Equal(ip) && n.HardwareAddr.String() == mac && n.State == netlink.NUD_PERMANENT {
				return true
			}
		}
		return false
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (stats %+v)", what, s.Stats())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	h1 := ask("n1")
	wait("the client's MAC in n1", func() bool { return has(h1, sb.ClientIP6, clientMAC) })
	wait("the router's MAC in n1", func() bool { return has(h1, sb.RouterLL6, clientMAC) })
	if st := s.Stats(); st.Kicks < 1 || st.Pushed < 2 {
		t.Errorf("stats %+v: want a host resolution and two writes", st)
	}
	kicks := s.Stats().Kicks
	h2 := ask("n2")
	wait("the client's MAC in n2", func() bool { return has(h2, sb.ClientIP6, clientMAC) })
	wait("the router's MAC in n2", func() bool { return has(h2, sb.RouterLL6, clientMAC) })
	if st := s.Stats(); st.Kicks != kicks {
		t.Errorf("the host knew the client: %d more resolutions", st.Kicks-kicks)
	}

	// When the host's entry goes, the containers' copies go too.
	if err := hh.NeighDel(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, Family: netlink.FAMILY_V6, IP: sb.ClientIP6}); err != nil {
		t.Fatal(err)
	}
	wait("the client's entry deleted in n1 and n2", func() bool {
		return !has(h1, sb.ClientIP6, clientMAC) && !has(h2, sb.ClientIP6, clientMAC)
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
