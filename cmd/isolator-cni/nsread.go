package main

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// containerEthMTU is the MTU isolatord gives a container's eth0
// (containerns.EthMTU): the host's own datagrams over lo reach it whole,
// while its routes and lo carry the host's MTU (docs/fragments.md).
const containerEthMTU = 65535

// nsIface is what the container's interface looks like from inside its
// namespace: what the CNI result reports.
type nsIface struct {
	MAC     net.HardwareAddr
	MTU     int
	Addrs   []net.IPNet // IPv4 addresses with their prefix
	Gateway net.IP      // default route's gateway, nil if none
	// Addrs6 are the global IPv6 addresses (none when the container has
	// no IPv6), Gateway6 the IPv6 default route's gateway.
	Addrs6   []net.IPNet
	Gateway6 net.IP
}

// readNSIface reads ifname inside the network namespace at nsPath through a
// netlink socket opened there (rtnl.go): the link, then one dump of the
// addresses and one of the routes, both families at once. The plugin only
// reads: isolatord configured the namespace.
func readNSIface(nsPath, ifname string) (nsIface, error) {
	var out nsIface
	s, err := openRtnl(nsPath)
	if err != nil {
		return out, err
	}
	defer s.Close()
	l, err := s.linkByName(ifname)
	if err != nil {
		return out, fmt.Errorf("%s in %s: %w", ifname, nsPath, err)
	}
	out.MAC, out.MTU = l.mac, l.mtu
	if l.mtu == containerEthMTU {
		// isolatord's eth0: the MTU the container sends with is the
		// host's, on its routes and its lo (containerns.EthMTU).
		if lo, err := s.linkByName("lo"); err == nil {
			out.MTU = lo.mtu
		}
	}
	addrs, err := s.addresses(l.index)
	if err != nil {
		return out, fmt.Errorf("addresses of %s in %s: %w", ifname, nsPath, err)
	}
	for _, a := range addrs {
		switch {
		case a.family == unix.AF_INET:
			out.Addrs = append(out.Addrs, a.ipnet)
		case a.ipnet.IP.To4() == nil && a.ipnet.IP.IsGlobalUnicast():
			out.Addrs6 = append(out.Addrs6, a.ipnet)
		}
	}
	if out.Gateway, out.Gateway6, err = s.defaultGateways(l.index); err != nil {
		return out, fmt.Errorf("routes of %s in %s: %w", ifname, nsPath, err)
	}
	return out, nil
}

// address picks the interface's address for ip (the host IP isolatord
// reported); with ip empty, the first address.
func (n nsIface) address(ip string) (net.IPNet, bool) {
	want := net.ParseIP(ip)
	for _, a := range n.Addrs {
		if want == nil || a.IP.Equal(want) {
			return a, true
		}
	}
	return net.IPNet{}, false
}
