package main

import (
	"fmt"
	"net"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
)

// attachedIface is the container's eth0 as isolatord's Attach reported it
// (AttachResponse.eth0): what readNSIface would read in the namespace,
// without entering it. ok is false when the daemon sent none (the
// container was isolated before this call), and the plugin then reads the
// namespace.
func attachedIface(e *pb.AttachResponse_Interface) (ifc nsIface, ok bool, err error) {
	if e == nil {
		return nsIface{}, false, nil
	}
	ifc.MTU = int(e.GetMtu())
	if e.GetMac() != "" {
		if ifc.MAC, err = net.ParseMAC(e.GetMac()); err != nil {
			return nsIface{}, false, fmt.Errorf("eth0.mac: %w", err)
		}
	}
	if ifc.Addrs, err = cidrList("eth0.ipv4_addresses", e.GetIpv4Addresses()); err != nil {
		return nsIface{}, false, err
	}
	if ifc.Addrs6, err = cidrList("eth0.ipv6_addresses", e.GetIpv6Addresses()); err != nil {
		return nsIface{}, false, err
	}
	if ifc.Gateway, err = optionalIP("eth0.ipv4_gateway", e.GetIpv4Gateway()); err != nil {
		return nsIface{}, false, err
	}
	if ifc.Gateway6, err = optionalIP("eth0.ipv6_gateway", e.GetIpv6Gateway()); err != nil {
		return nsIface{}, false, err
	}
	if ifc.Gateway != nil {
		ifc.Gateway = ifc.Gateway.To4()
	}
	return ifc, true, nil
}

// cidrList parses addresses with their prefix length ("198.18.0.1/24"),
// keeping each address (not its network); IPv4 ones in their 4-byte form,
// as netlink gives them.
func cidrList(field string, ss []string) ([]net.IPNet, error) {
	var out []net.IPNet
	for i, s := range ss {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		if v4 := ip.To4(); v4 != nil && len(n.Mask) == net.IPv4len {
			ip = v4
		}
		out = append(out, net.IPNet{IP: ip, Mask: n.Mask})
	}
	return out, nil
}

// optionalIP parses an address, nil for "".
func optionalIP(field, s string) (net.IP, error) {
	if s == "" {
		return nil, nil
	}
	ip := net.ParseIP(s)
	if ip == nil {
		return nil, fmt.Errorf("%s: %q is not an IP address", field, s)
	}
	return ip, nil
}
