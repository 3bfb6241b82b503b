package main

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nsIface is what the container's interface looks like from inside its
// namespace: what the CNI result reports.
type nsIface struct {
	MAC     net.HardwareAddr
	MTU     int
	Addrs   []net.IPNet // IPv4 addresses with their prefix
	Gateway net.IP      // default route's gateway, nil if none
	// Addrs6 are the global IPv6 addresses (none when the container has
	// no IPv6), Gateway6 the IPv6 default route's gateway (nsread6.go).
	Addrs6   []net.IPNet
	Gateway6 net.IP
}

// readNSIface reads ifname inside the network namespace at nsPath through a
// netlink socket opened there (no thread switches namespaces). The plugin
// only reads: isolatord configured the namespace.
func readNSIface(nsPath, ifname string) (nsIface, error) {
	var out nsIface
	nsh, err := netns.GetFromPath(nsPath)
	if err != nil {
		return out, fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		return out, fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	defer h.Close()
	link, err := h.LinkByName(ifname)
	if err != nil {
		return out, fmt.Errorf("%s in %s: %w", ifname, nsPath, err)
	}
	out.MAC = link.Attrs().HardwareAddr
	out.MTU = link.Attrs().MTU
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return out, fmt.Errorf("addresses of %s in %s: %w", ifname, nsPath, err)
	}
	for _, a := range addrs {
		if a.IPNet != nil {
			out.Addrs = append(out.Addrs, *a.IPNet)
		}
	}
	routes, err := h.RouteList(link, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return out, fmt.Errorf("routes of %s in %s: %w", ifname, nsPath, err)
	}
	for _, r := range routes {
		if isDefault(r.Dst) && r.Gw != nil {
			out.Gateway = r.Gw
			break
		}
	}
	if err := readIPv6(h, link, &out); err != nil {
		return out, fmt.Errorf("%w in %s", err, nsPath)
	}
	return out, nil
}

func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0 && dst.IP.IsUnspecified()
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
