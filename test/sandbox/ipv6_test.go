package sandbox

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/traffic"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestIPv6Sandbox: WithIPv6 gives host and client a /64 of 2001:db8::/32
// of the sandbox's own, without DAD, and the host an IPv6 default route via
// the client's link-local address; TCP, UDP and ICMPv6 echo (through the
// traffic package and the isotraffic binary) work over it, and a sandbox
// without the option has no global IPv6 address.
func TestIPv6Sandbox(t *testing.T) {
	RequireRoot(t)
	before := rootNetState(t)
	bin := traffic.BinaryPath(t)
	s := New(t, WithIPv6())
	other := New(t, WithIPv6())
	plain := New(t)
	if s.HostIP6 == nil || s.ClientIP6 == nil || !s.RouterLL6.Equal(net.ParseIP(RouterLinkLocal6)) {
		t.Fatalf("IPv6 addresses %v %v %v", s.HostIP6, s.ClientIP6, s.RouterLL6)
	}
	doc := net.IPNet{IP: net.ParseIP("2001:db8::"), Mask: net.CIDRMask(32, 128)}
	if !doc.Contains(s.HostIP6) || !doc.Contains(s.ClientIP6) {
		t.Errorf("addresses outside 2001:db8::/32: %v %v", s.HostIP6, s.ClientIP6)
	}
	if n := s.IPv6Net(); !n.Contains(s.ClientIP6) || n.Contains(other.HostIP6) {
		t.Errorf("sandbox subnets: %v holds client %v? holds the other sandbox's %v?", n.String(), s.ClientIP6, other.HostIP6)
	}
	if plain.HostIP6 != nil {
		t.Errorf("sandbox without IPv6 has %v", plain.HostIP6)
	}

	hh, err := s.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	eth0, _ := hh.LinkByName("eth0")
	addrs, _ := hh.AddrList(eth0, netlink.FAMILY_V6)
	var global bool
	for _, a := range addrs {
		if a.IP.Equal(s.HostIP6) {
			global = a.Flags&unix.IFA_F_NODAD != 0 && a.Flags&unix.IFA_F_TENTATIVE == 0
		}
	}
	if !global {
		t.Errorf("host eth0 %v: want %v nodad, not tentative", addrs, s.HostIP6)
	}
	routes, _ := hh.RouteList(eth0, netlink.FAMILY_V6)
	var def bool
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "::/0") && r.Gw.Equal(s.RouterLL6) {
			def = true
		}
	}
	if !def {
		t.Errorf("host has no IPv6 default route via %v: %v", s.RouterLL6, routes)
	}
	ph, err := plain.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ph.Close()
	pe, _ := ph.LinkByName("eth0")
	paddrs, _ := ph.AddrList(pe, netlink.FAMILY_V6)
	for _, a := range paddrs {
		if a.IP.IsGlobalUnicast() {
			t.Errorf("sandbox without IPv6: host eth0 has %v", a.IPNet)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	hostAddr := net.JoinHostPort(s.HostIP6.String(), "7000")
	var srvs []*traffic.Server
	defer func() {
		for _, x := range srvs {
			x.Close()
		}
	}()
	if err := s.Host.Do(func() error {
		tcp, err := traffic.ServeTCP(ctx, "[::]:7000", "host")
		if err != nil {
			return err
		}
		srvs = append(srvs, tcp)
		udp, err := traffic.ServeUDP(ctx, "[::]:7000", "host")
		if err != nil {
			return err
		}
		srvs = append(srvs, udp)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, nw := range []string{"tcp", "udp", "tcp6", "udp6"} {
		var reply string
		err := s.Client.Do(func() (err error) {
			reply, err = traffic.Echo(ctx, nw, hostAddr, "v6", traffic.WithTimeout(5*time.Second))
			return err
		})
		if err != nil || reply != "host v6" {
			t.Errorf("client -> host %s over IPv6: %q, %v", nw, reply, err)
		}
	}
	// From a given source port (WithSource takes IPv6).
	err = s.Client.Do(func() error {
		_, err := traffic.Echo(ctx, "tcp6", hostAddr, "src", traffic.WithSource(fmt.Sprintf("[%s]:40001", s.ClientIP6)))
		return err
	})
	if err != nil {
		t.Errorf("echo from [%s]:40001: %v", s.ClientIP6, err)
	}
	// One ICMPv6 echo reply per request, both ways.
	var pr traffic.PingResult
	if err := s.Client.Do(func() (err error) {
		pr, err = traffic.PingStats(ctx, s.HostIP6, 2, 2*time.Second)
		return err
	}); err != nil || !pr.ExactlyOnce() {
		t.Errorf("client ping6 host: %+v, %v", pr, err)
	}
	out := s.Host.Run(t, bin, "ping", "--dst", s.ClientIP6.String(), "--count", "2")
	if !strings.Contains(out, `"per_seq":[1,1]`) {
		t.Errorf("isotraffic ping6: %s", out)
	}
	for _, x := range []*Sandbox{s, other, plain} {
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if after := rootNetState(t); after != before {
		t.Errorf("root namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
