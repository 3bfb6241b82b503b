package dataplane

import (
	"net"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
	"github.com/vishvananda/netlink"
)

func TestSaddr6Blocker(t *testing.T) {
	addr := func(idx int, s string) netlink.Addr {
		ip, n, _ := net.ParseCIDR(s)
		n.IP = ip
		return netlink.Addr{IPNet: n, LinkIndex: idx}
	}
	name := func(i int) string { return map[int]string{1: "lo", 2: "eth0", 3: "dum0"}[i] }
	for _, c := range []struct {
		addrs   []netlink.Addr
		blocker string
		global  bool
	}{
		{nil, "", false},
		{[]netlink.Addr{addr(1, "::1/128"), addr(2, "fe80::1/64")}, "", false},
		{[]netlink.Addr{addr(1, "::1/128"), addr(2, "fe80::1/64"), addr(2, "2001:db8::1/64")}, "", true},
		// link-local addresses of other links are no candidates for eth0's
		{[]netlink.Addr{addr(2, "2001:db8::1/64"), addr(3, "fe80::2/64"), addr(2, "198.18.0.1/24"), addr(3, "198.19.0.1/24")}, "", true},
		{[]netlink.Addr{addr(2, "2001:db8::1/64"), addr(3, "fd00::1/64")}, "dum0 holds fd00::1", true},
		{[]netlink.Addr{addr(1, "2001:db8:1::1/128"), addr(2, "2001:db8::1/64")}, "lo holds 2001:db8:1::1", true},
		{[]netlink.Addr{addr(3, "2001:db8:1::1/64")}, "dum0 holds 2001:db8:1::1", false},
	} {
		b, g := saddr6Blocker(c.addrs, 2, name)
		if b != c.blocker || g != c.global {
			t.Errorf("%v: blocker %q, eth0 global %v; want %q, %v", c.addrs, b, g, c.blocker, c.global)
		}
	}
}

// TestSaddr6Narrowing: with eth0 holding the host's only IPv6 addresses,
// the data plane narrows source selection to them (use_oif_addrs_only=1)
// and a host socket still picks eth0's global address; another link
// gaining an IPv6 address puts the value found back, losing it narrows
// again; a 1 the data plane did not write is left alone.
func TestSaddr6Narrowing(t *testing.T) {
	checkRootUnchanged(t)
	e := newFollowEnvMode(t, IPv6On, sandbox.WithIPv6()).env
	knob := "net.ipv6.conf." + e.sb.HostEth0 + ".use_oif_addrs_only"
	is := func(v string) func() bool {
		return func() bool { got, err := e.sb.Host.Sysctl(knob); return err == nil && got == v }
	}
	wait.For(t, 5*time.Second, knob+" = 1 after preparation", is("1"))
	if got, ok := e.info.Originals["sysctl/"+saddr6Knob(e.sb.HostEth0)]; !ok || got != "0" {
		t.Errorf("HostInfo.Originals: %q (recorded: %v), want the original 0 recorded", got, ok)
	}
	source := func() net.IP {
		t.Helper()
		var ip net.IP
		err := e.sb.Host.Do(func() error {
			c, err := net.Dial("udp6", client6Addr(e, 9))
			if err != nil {
				return err
			}
			defer c.Close()
			ip = c.LocalAddr().(*net.UDPAddr).IP
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return ip
	}
	if got := source(); !got.Equal(e.sb.HostIP6) {
		t.Errorf("narrowed: a host socket's source to the client is %s, want eth0's %s", got, e.sb.HostIP6)
	}

	h, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "isosd0"
	other := &netlink.Veth{LinkAttrs: la, PeerName: "isosd1"}
	if err := h.LinkAdd(other); err != nil {
		t.Fatal(err)
	}
	defer h.LinkDel(other)
	if err := h.LinkSetUp(other); err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr("2001:db8:5ad6::1/64")
	if err != nil {
		t.Fatal(err)
	}
	a.Flags = 0x02 // IFA_F_NODAD
	if err := h.AddrAdd(other, a); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, knob+" back to 0 with another link's address", is("0"))
	if got := source(); !got.Equal(e.sb.HostIP6) {
		t.Errorf("widened: a host socket's source to the client is %s, want eth0's %s", got, e.sb.HostIP6)
	}
	if err := h.AddrDel(other, a); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, knob+" = 1 again once the address is gone", is("1"))

	// A 1 written by someone else stays while another link has an address.
	if err := h.AddrAdd(other, a); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, knob+" back to 0", is("0"))
	if err := e.sb.Host.SetSysctl(knob, "1"); err != nil {
		t.Fatal(err)
	}
	b, err := netlink.ParseAddr("2001:db8:5ad7::1/64")
	if err != nil {
		t.Fatal(err)
	}
	b.Flags = 0x02
	passes := e.d.FollowStats().Passes
	if err := h.AddrAdd(other, b); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "a follower pass after another address", func() bool { return e.d.FollowStats().Passes > passes })
	if !is("1")() {
		t.Errorf("%s: a 1 the data plane did not write was changed", knob)
	}
}
