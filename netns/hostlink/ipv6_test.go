package hostlink

import (
	"fmt"
	"net"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func mustCIDR(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return net.IPNet{IP: ip, Mask: n.Mask}
}

// TestReadIPv6: the global addresses of eth0 (not a deprecated one), a
// usable link-local address
// (fe80::1, added without DAD, over the kernel's own, tentative for a
// second), and the routes through eth0 that are not the kernel's own: the
// default route via the router's link-local address and a static one.
func TestReadIPv6(t *testing.T) {
	hh := hostWithEth0(t)
	l, err := hh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	eth0 := l.Attrs().Index
	// The kernel's own link-local address is still in DAD (a second): it
	// stands in while there is no other.
	v4only, err := ReadIPv6(hh, eth0)
	if err != nil || v4only.HasGlobal() || v4only.Gateway() != nil || !v4only.LinkLocal.IP.IsLinkLocalUnicast() {
		t.Errorf("IPv4-only host: %+v %v (want no global address, no gateway, the tentative link-local one)", v4only, err)
	}

	for _, a := range []string{"2001:db8:6::1/64", "2001:db8:6:1::1/64", "fe80::1/64"} {
		n := mustCIDR(a)
		if err := hh.AddrAdd(l, &netlink.Addr{IPNet: &n, Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
	}
	// A deprecated address (preferred lifetime over) is not shared.
	dep := mustCIDR("2001:db8:6:2::1/64")
	if err := hh.AddrAdd(l, &netlink.Addr{IPNet: &dep, Flags: unix.IFA_F_NODAD, PreferedLft: 0, ValidLft: 600}); err != nil {
		t.Fatal(err)
	}
	router := net.ParseIP("fe80::2")
	static := mustCIDR("2001:db8:7::/48")
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: eth0, Gw: router, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}); err != nil {
		t.Fatal(err)
	}
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: eth0, Gw: router, Dst: &static, Priority: 100}); err != nil {
		t.Fatal(err)
	}
	v6, err := ReadIPv6(hh, eth0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range v6.Global {
		got = append(got, a.String())
	}
	slices.Sort(got)
	if want := []string{"2001:db8:6:1::1/64", "2001:db8:6::1/64"}; !slices.Equal(got, want) {
		t.Errorf("global addresses %v, want %v", got, want)
	}
	if v6.LinkLocal.String() != "fe80::1/64" {
		t.Errorf("link-local %v, want the usable fe80::1/64", v6.LinkLocal.String())
	}
	if !v6.HasGlobal() || !v6.Gateway().Equal(router) {
		t.Errorf("gateway %v, want %v", v6.Gateway(), router)
	}
	var routes []string
	for _, r := range v6.Routes {
		routes = append(routes, fmt.Sprintf("%v via %v metric %d", r.Dst, r.Gw, r.Priority))
	}
	slices.Sort(routes)
	// The prefix routes of the addresses, fe80::/64 and multicast are the
	// kernel's: left out.
	if want := []string{"2001:db8:7::/48 via fe80::2 metric 100", "<nil> via fe80::2 metric 1024"}; !slices.Equal(routes, want) {
		t.Errorf("routes %v, want %v", routes, want)
	}
}
