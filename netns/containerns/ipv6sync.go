package containerns

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/hostlink"
)

// SyncIPv6 brings the IPv6 addresses and routes of a configured
// container's eth0 (named eth0, through h, a handle opened inside its
// namespace) in line with v6, the host's IPv6 now (a daemon restarted
// after the host's addresses changed): the new addresses and routes
// first, then the addresses and routes that are no longer the host's go
// (their connections could not work anyway: the host no longer has the
// address, and its veth filters no longer let it through). The
// container keeps no IPv6 when it was created without (no IPv6 address
// on eth0: turning it on takes the settings only Configure writes).
// Its routes through eth0 get mtu (the host's) as their MTU metric.
func SyncIPv6(h *netlink.Handle, eth0 string, v6 *hostlink.IPv6, mtu int) error {
	eth, err := h.LinkByName(eth0)
	if err != nil {
		return fmt.Errorf("container %s: %w", eth0, err)
	}
	have, err := h.AddrList(eth, netlink.FAMILY_V6)
	if err != nil {
		return fmt.Errorf("container %s addresses: %w", eth0, err)
	}
	if len(have) == 0 {
		return nil
	}
	if err := addAddrs6(h, eth, v6); err != nil {
		return err
	}
	if err := postIPv6Up(h, eth.Attrs().Index, v6, mtu); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, a := range addrs6(v6) {
		want[a.IP.String()] = true
	}
	for _, a := range have {
		if want[a.IP.String()] || a.IP.IsMulticast() {
			continue
		}
		if err := h.AddrDel(eth, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("container %s old address %s: %w", eth0, a.IPNet, err)
		}
	}
	return delStaleRoutes6(h, eth, v6)
}

// delStaleRoutes6 deletes eth's IPv6 routes of the main table that are
// not the kernel's own and not among v6's (a default route via a router
// the host no longer uses, say).
func delStaleRoutes6(h *netlink.Handle, eth netlink.Link, v6 *hostlink.IPv6) error {
	rs, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: eth.Attrs().Index, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("container %s IPv6 routes: %w", eth.Attrs().Name, err)
	}
	for _, r := range rs {
		if r.Protocol == unix.RTPROT_KERNEL || wantedRoute6(r, v6) {
			continue
		}
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("container IPv6 route %s via %s: %w", r.Dst, r.Gw, err)
		}
	}
	return nil
}

// ip6RoutePrioUser is the metric the kernel gives an IPv6 route added
// without one (IP6_RT_PRIO_USER).
const ip6RoutePrioUser = 1024

// wantedRoute6 says whether r is one of v6's routes (as postIPv6Up adds
// them).
func wantedRoute6(r netlink.Route, v6 *hostlink.IPv6) bool {
	rdst := r.Dst
	if rdst == nil {
		rdst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	for _, w := range v6.Routes {
		if w.Dst == nil && w.Gw == nil {
			continue
		}
		dst := w.Dst
		if dst == nil {
			dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		prio := w.Priority
		if prio == 0 {
			prio = ip6RoutePrioUser
		}
		if rdst.String() == dst.String() && r.Gw.Equal(w.Gw) && r.Priority == prio {
			return true
		}
	}
	return false
}
