package hostlink

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IPv6 are the IPv6 facts of the host's public interface that containers
// copy when IPv6 is on.
type IPv6 struct {
	// Global are eth0's global-scope addresses with their prefixes, in the
	// kernel's order (DAD-failed ones left out: they are not the host's;
	// tentative ones kept: they are, unless their DAD fails). Deprecated
	// and temporary (privacy) addresses are left out: containers get an
	// address for as long as they live, and the host uses those for new
	// connections briefly or not at all.
	Global []net.IPNet
	// LinkLocal is eth0's link-local address (nil IP when it has none; a
	// usable one rather than a tentative one): the source of the host's
	// neighbour discovery, and the one containers carry so that what they
	// send matches the host's.
	LinkLocal net.IPNet
	// Routes are the IPv6 unicast routes of the main table through eth0
	// that are not the kernel's own (prefix routes of addresses,
	// fe80::/64, multicast): the default route via the router's
	// link-local address, routes learned from router advertisements and
	// static ones. Dst nil is the default route.
	Routes []Route6
}

// Route6 is one IPv6 route through the host's public interface.
type Route6 struct {
	Dst      *net.IPNet // nil: default route
	Gw       net.IP     // nil: on-link
	Priority int        // metric
}

// HasGlobal reports whether the host has a global IPv6 address to share.
func (h IPv6) HasGlobal() bool { return len(h.Global) > 0 }

// Gateway is the gateway of the IPv6 default route (nil if none).
func (h IPv6) Gateway() net.IP {
	for _, r := range h.Routes {
		if r.Dst == nil && r.Gw != nil {
			return r.Gw
		}
	}
	return nil
}

// ReadIPv6 reads the IPv6 addresses of link eth0 and its IPv6 routes in
// h's namespace. A namespace without IPv6 (kernel or interface) gives the
// zero IPv6 and no error.
func ReadIPv6(h *netlink.Handle, eth0 int) (IPv6, error) {
	var out IPv6
	link, err := h.LinkByIndex(eth0)
	if err != nil {
		return out, fmt.Errorf("link %d: %w", eth0, err)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_V6)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		if errors.Is(err, unix.EAFNOSUPPORT) {
			return out, nil
		}
		return out, fmt.Errorf("IPv6 addresses of %s: %w", link.Attrs().Name, err)
	}
	var tentativeLL net.IPNet
	for _, a := range addrs {
		if a.IPNet == nil || a.IP.To4() != nil || a.Flags&unix.IFA_F_DADFAILED != 0 {
			continue
		}
		n := net.IPNet{IP: append(net.IP(nil), a.IP...), Mask: append(net.IPMask(nil), a.Mask...)}
		switch {
		case a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE != 0:
			if tentativeLL.IP == nil {
				tentativeLL = n
			}
		case a.IP.IsLinkLocalUnicast():
			if out.LinkLocal.IP == nil {
				out.LinkLocal = n
			}
		case a.IP.IsGlobalUnicast() && a.Flags&(unix.IFA_F_DEPRECATED|unix.IFA_F_TEMPORARY) == 0:
			out.Global = append(out.Global, n)
		}
	}
	if out.LinkLocal.IP == nil {
		out.LinkLocal = tentativeLL
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V6,
		&netlink.Route{Table: unix.RT_TABLE_MAIN, LinkIndex: eth0},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		if errors.Is(err, unix.EAFNOSUPPORT) {
			return out, nil
		}
		return out, fmt.Errorf("IPv6 routes of %s: %w", link.Attrs().Name, err)
	}
	for _, r := range routes {
		if r.Type != unix.RTN_UNICAST || r.Protocol == unix.RTPROT_KERNEL || len(r.MultiPath) > 0 {
			continue
		}
		var dst *net.IPNet
		if r.Dst != nil && !(r.Dst.IP.IsUnspecified() && prefixLen(r.Dst) == 0) {
			dst = &net.IPNet{IP: append(net.IP(nil), r.Dst.IP...), Mask: append(net.IPMask(nil), r.Dst.Mask...)}
		}
		var gw net.IP
		if r.Gw != nil {
			gw = append(net.IP(nil), r.Gw...)
		}
		out.Routes = append(out.Routes, Route6{Dst: dst, Gw: gw, Priority: r.Priority})
	}
	return out, nil
}
