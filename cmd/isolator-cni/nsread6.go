package main

import (
	"errors"
	"fmt"
	"net"
	"strings"

	types "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
)

// readIPv6 adds link's global IPv6 addresses (the host's, when isolatord
// gives containers IPv6) and its IPv6 default gateway to out. A namespace
// with IPv6 disabled has none.
func readIPv6(h *netlink.Handle, link netlink.Link, out *nsIface) error {
	name := link.Attrs().Name
	addrs, err := h.AddrList(link, netlink.FAMILY_V6)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("IPv6 addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if a.IPNet != nil && a.IP.To4() == nil && a.IP.IsGlobalUnicast() {
			out.Addrs6 = append(out.Addrs6, *a.IPNet)
		}
	}
	routes, err := h.RouteList(link, netlink.FAMILY_V6)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("IPv6 routes of %s: %w", name, err)
	}
	for _, r := range routes {
		if isDefault(r.Dst) && r.Gw != nil {
			out.Gateway6 = r.Gw
			break
		}
	}
	return nil
}

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
