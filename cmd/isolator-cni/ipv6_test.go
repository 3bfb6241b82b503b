package main

import (
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// withIPv6 makes the env's namespace reader report the host's IPv6 address
// and default route via the router's link-local address too.
func withIPv6(e *env) {
	read := e.plugin.ReadNS
	e.plugin.ReadNS = func(nsPath, ifname string) (nsIface, error) {
		ifc, err := read(nsPath, ifname)
		if err == nil {
			ifc.Addrs6 = []net.IPNet{{IP: net.ParseIP("2001:db8::1"), Mask: net.CIDRMask(64, 128)}}
			ifc.Gateway6 = net.ParseIP("fe80::2")
		}
		return ifc, err
	}
}

// TestAddReportsBothFamilies: a container with IPv6 gets both addresses
// and both default routes in its result (also as 0.4.0), and CHECK
// compares each with the interface's addresses of its family.
func TestAddReportsBothFamilies(t *testing.T) {
	e := newEnv(t)
	withIPv6(e)
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings))); err != nil {
		t.Fatal(err)
	}
	res, err := types100.NewResult(e.out.Bytes())
	if err != nil {
		t.Fatalf("result %s: %v", e.out, err)
	}
	r := res.(*types100.Result)
	if len(r.IPs) != 2 || len(r.Routes) != 2 {
		t.Fatalf("result = %s, want two addresses and two routes", e.out)
	}
	v4, v6 := r.IPs[0], r.IPs[1]
	if v4.Address.String() != "198.18.0.1/24" || *v4.Interface != 1 {
		t.Errorf("IPv4 = %+v", v4)
	}
	if v6.Address.String() != "2001:db8::1/64" || *v6.Interface != 1 || v6.Gateway.String() != "fe80::2" {
		t.Errorf("IPv6 = %+v", v6)
	}
	if r.Routes[1].Dst.String() != "::/0" || r.Routes[1].GW.String() != "fe80::2" {
		t.Errorf("IPv6 route = %+v", r.Routes[1])
	}

	prev := `,"prevResult":` + e.out.String()
	if err := e.plugin.Check(cmdArgs("c1", e.conf("1.1.0", twoMappings+prev))); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	bad := strings.Replace(prev, "2001:db8::1/64", "2001:db8::1/128", 1)
	ce := cniErr(t, e.plugin.Check(cmdArgs("c1", e.conf("1.1.0", twoMappings+bad))), ErrCheckFailed)
	if !strings.Contains(ce.Msg, "2001:db8::1/128") || !strings.Contains(ce.Msg, "2001:db8::1/64") {
		t.Errorf("message = %q", ce.Msg)
	}
	bad = strings.Replace(prev, `"gateway": "fe80::2"`, `"gateway": "fe80::3"`, 1)
	if bad == prev {
		t.Fatalf("no IPv6 gateway in %s", prev)
	}
	ce = cniErr(t, e.plugin.Check(cmdArgs("c1", e.conf("1.1.0", twoMappings+bad))), ErrCheckFailed)
	if !strings.Contains(ce.Msg, "fe80::3") {
		t.Errorf("message = %q", ce.Msg)
	}

	e.out.Reset()
	if err := e.plugin.Add(cmdArgs("c2", e.conf("0.4.0", ""))); err != nil {
		t.Fatal(err)
	}
	old, err := types040.NewResult(e.out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if r := old.(*types040.Result); len(r.IPs) != 2 || r.IPs[1].Address.String() != "2001:db8::1/64" {
		t.Errorf("0.4.0 result = %s", e.out)
	}
}

// scratchNS is a new network namespace and a netlink handle in it, both
// closed when the test ends; it skips the test when not root.
func scratchNS(t *testing.T) (*nshandle.NS, *netlink.Handle) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	ns, err := nshandle.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return ns, h
}

// TestReadNSIfaceIPv6: readNSIface reads a real namespace's eth0: its IPv4
// address and gateway, its global IPv6 address (not the link-local one)
// and its IPv6 default gateway.
func TestReadNSIfaceIPv6(t *testing.T) {
	ns, h := scratchNS(t)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "x0"}); err != nil {
		t.Fatal(err)
	}
	eth, _ := h.LinkByName("eth0")
	x0, _ := h.LinkByName("x0")
	for _, a := range []string{"198.18.0.1/24", "2001:db8::1/64", "fe80::1/64"} {
		addr, _ := netlink.ParseAddr(a)
		addr.Flags = unix.IFA_F_NODAD
		if err := h.AddrAdd(eth, addr); err != nil {
			t.Fatal(err)
		}
	}
	h.LinkSetUp(x0)
	if err := h.LinkSetUp(eth); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*netlink.Route{
		{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP("198.18.0.2")},
		{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP("fe80::2"), Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}},
	} {
		if err := h.RouteAdd(r); err != nil {
			t.Fatal(err)
		}
	}
	ifc, err := readNSIface(fmt.Sprintf("/proc/self/fd/%d", ns.Fd()), "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if cidrs(ifc.Addrs) != "198.18.0.1/24" || ifc.Gateway.String() != "198.18.0.2" ||
		cidrs(ifc.Addrs6) != "2001:db8::1/64" || ifc.Gateway6.String() != "fe80::2" {
		t.Errorf("read %s gw %v, IPv6 %s gw %v", cidrs(ifc.Addrs), ifc.Gateway, cidrs(ifc.Addrs6), ifc.Gateway6)
	}
}

// TestReadNSIfaceAgreesWithNetlink: on a namespace with more than isolatord
// makes (a secondary and a point-to-point address, another link with its
// own default route, a default route in another table, a route that is not
// the default), readNSIface reads what the netlink library reads for the
// same questions: eth0's MAC, MTU, IPv4 addresses, global IPv6 addresses,
// and the first default gateway out of eth0 in the main table per family.
func TestReadNSIfaceAgreesWithNetlink(t *testing.T) {
	ns, h := scratchNS(t)
	for _, v := range [][2]string{{"eth0", "x0"}, {"eth1", "x1"}} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: v[0], MTU: 1400}, PeerName: v[1]}); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]netlink.Link{}
	for _, n := range []string{"eth0", "x0", "eth1", "x1"} {
		l, err := h.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		links[n] = l
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	add := func(ifname, cidr, peer string) {
		t.Helper()
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			t.Fatal(err)
		}
		a.Flags = unix.IFA_F_NODAD
		if peer != "" {
			p, _ := netlink.ParseAddr(peer)
			a.Peer = p.IPNet
		}
		if err := h.AddrAdd(links[ifname], a); err != nil {
			t.Fatalf("address %s on %s: %v", cidr, ifname, err)
		}
	}
	add("eth0", "198.18.0.1/24", "")
	add("eth0", "198.18.0.9/24", "")
	add("eth0", "198.18.5.1/32", "198.18.5.2/32")
	add("eth0", "2001:db8::1/64", "")
	add("eth0", "2001:db8:1::1/64", "")
	add("eth0", "fe80::1/64", "")
	add("eth1", "198.18.1.1/24", "")
	add("eth1", "2001:db8:2::1/64", "")
	e0, e1 := links["eth0"].Attrs().Index, links["eth1"].Attrs().Index
	for _, r := range []*netlink.Route{
		{LinkIndex: e0, Dst: &net.IPNet{IP: net.IPv4(198, 18, 7, 0).To4(), Mask: net.CIDRMask(24, 32)}, Gw: net.ParseIP("198.18.0.3")},
		{LinkIndex: e0, Gw: net.ParseIP("198.18.0.4"), Table: 100},
		{LinkIndex: e1, Gw: net.ParseIP("198.18.1.2"), Priority: 5},
		{LinkIndex: e0, Gw: net.ParseIP("198.18.0.2"), Priority: 10},
		{LinkIndex: e0, Gw: net.ParseIP("fe80::2"), Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}},
	} {
		if err := h.RouteAdd(r); err != nil {
			t.Fatalf("route %v: %v", r, err)
		}
	}

	// The reference: the netlink library's answers.
	var want nsIface
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	want.MAC, want.MTU = l.Attrs().HardwareAddr, l.Attrs().MTU
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		addrs, err := h.AddrList(l, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			switch {
			case fam == netlink.FAMILY_V4:
				want.Addrs = append(want.Addrs, *a.IPNet)
			case a.IP.To4() == nil && a.IP.IsGlobalUnicast():
				want.Addrs6 = append(want.Addrs6, *a.IPNet)
			}
		}
		routes, err := h.RouteList(l, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range routes {
			ones := 0
			if r.Dst != nil {
				ones, _ = r.Dst.Mask.Size()
			}
			if (r.Dst == nil || (ones == 0 && r.Dst.IP.IsUnspecified())) && r.Gw != nil {
				if fam == netlink.FAMILY_V4 {
					want.Gateway = r.Gw
				} else {
					want.Gateway6 = r.Gw
				}
				break
			}
		}
	}
	got, err := readNSIface(fmt.Sprintf("/proc/self/fd/%d", ns.Fd()), "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("readNSIface read\n%+v\nthe netlink library\n%+v", got, want)
	}
	sorted := func(ns []net.IPNet) string {
		s := strings.Split(cidrs(ns), ", ")
		sort.Strings(s)
		return strings.Join(s, ", ")
	}
	if sorted(got.Addrs) != "198.18.0.1/24, 198.18.0.9/24, 198.18.5.1/32" || got.Gateway.String() != "198.18.0.2" || got.MTU != 1400 ||
		sorted(got.Addrs6) != "2001:db8:1::1/64, 2001:db8::1/64" || got.Gateway6.String() != "fe80::2" {
		t.Errorf("read %+v", got)
	}
	if _, err := readNSIface(fmt.Sprintf("/proc/self/fd/%d", ns.Fd()), "eth9"); err == nil || !strings.Contains(err.Error(), "eth9 in ") || !strings.Contains(err.Error(), "link not found") {
		t.Errorf("a missing link: %v", err)
	}
	if _, err := readNSIface("/nonexistent/ns", "eth0"); err == nil || !strings.Contains(err.Error(), "open network namespace /nonexistent/ns: no such file or directory") {
		t.Errorf("a missing namespace: %v", err)
	}
}
