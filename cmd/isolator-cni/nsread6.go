package main

import (
	"net"
	"strings"

	types "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// addIPv6 adds the interface's IPv6 addresses (interface index idx) and
// its IPv6 default route to r.
func addIPv6(r *types100.Result, idx int, ifc nsIface) {
	for _, a := range ifc.Addrs6 {
		r.IPs = append(r.IPs, &types100.IPConfig{Interface: types100.Int(idx), Address: a, Gateway: ifc.Gateway6})
	}
	if ifc.Gateway6 != nil && len(ifc.Addrs6) > 0 {
		r.Routes = append(r.Routes, &types.Route{
			Dst: net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
			GW:  ifc.Gateway6,
		})
	}
}

// cidrs formats addresses as "a/len, ...".
func cidrs(ns []net.IPNet) string {
	s := make([]string, len(ns))
	for i := range ns {
		s[i] = ns[i].String()
	}
	return strings.Join(s, ", ")
}

// family is what CHECK compares an address of prevResult with: the
// interface's addresses and gateway of that address's family.
func (n nsIface) family(ip net.IP) ([]net.IPNet, net.IP) {
	if ip.To4() == nil {
		return n.Addrs6, n.Gateway6
	}
	return n.Addrs, n.Gateway
}
