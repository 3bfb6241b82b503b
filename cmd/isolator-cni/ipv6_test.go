package main

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/nshandle"
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

// TestReadNSIfaceIPv6: readNSIface reads a real namespace's eth0: its IPv4
// address and gateway, its global IPv6 address (not the link-local one)
// and its IPv6 default gateway.
func TestReadNSIfaceIPv6(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	ns, err := nshandle.New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
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
