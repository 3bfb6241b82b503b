// Package hostlink reads link facts over netlink: the host namespace's
// public interface and loopback (name, index, address, MAC, MTU, gateway)
// that containers copy, and a veth's counters seen from its peer (also
// from a namespace's own sysfs, without rtnl: SysNet). It changes
// nothing. It is tested against scratch namespaces (root; the tests
// skip otherwise).
package hostlink

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Links are the facts about a host namespace's public interface and
// loopback that containers copy.
type Links struct {
	Eth0      string
	Eth0Index int
	Lo        string
	LoIndex   int
	Addr      net.IPNet        // primary IPv4 address of Eth0 and its prefix
	MAC       net.HardwareAddr // Eth0's MAC
	MTU       int              // Eth0's MTU
	LoMAC     net.HardwareAddr
	LoMTU     int
	Gateway   net.IP // IPv4 default gateway via Eth0 (main table), nil if none
}

// Read inspects the namespace of h. eth0 "" means the device of the
// IPv4 default route in the main table; lo "" means the first link with
// IFF_LOOPBACK. It fails clearly if eth0 has no IPv4 address.
func Read(h *netlink.Handle, eth0, lo string) (Links, error) {
	return read(h, eth0, lo, true)
}

// ReadNow is Read at run time, when the host follows its interface
// (the daemon watches it): eth0 without an IPv4 address is no error (Addr
// is left zero: the host lost its last one, and so do containers).
func ReadNow(h *netlink.Handle, eth0, lo string) (Links, error) {
	return read(h, eth0, lo, false)
}

func read(h *netlink.Handle, eth0, lo string, needAddr bool) (Links, error) {
	var hl Links
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return hl, fmt.Errorf("list IPv4 routes: %w", err)
	}
	var defaults []netlink.Route
	for _, r := range routes {
		if r.Dst == nil || (r.Dst.IP.IsUnspecified() && prefixLen(r.Dst) == 0) {
			defaults = append(defaults, r)
		}
	}

	var eth netlink.Link
	if eth0 == "" {
		if len(defaults) == 0 {
			return hl, errors.New("no IPv4 default route to pick the public interface from; name it explicitly")
		}
		eth, err = h.LinkByIndex(defaults[0].LinkIndex)
		if err != nil {
			return hl, fmt.Errorf("link of the default route (ifindex %d): %w", defaults[0].LinkIndex, err)
		}
	} else {
		eth, err = h.LinkByName(eth0)
		if err != nil {
			return hl, fmt.Errorf("public interface %q: %w", eth0, err)
		}
	}
	a := eth.Attrs()
	hl.Eth0, hl.Eth0Index, hl.MTU = a.Name, a.Index, a.MTU
	hl.MAC = append(net.HardwareAddr(nil), a.HardwareAddr...)
	if len(hl.MAC) != 6 {
		return hl, fmt.Errorf("public interface %s has no Ethernet MAC", hl.Eth0)
	}

	addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return hl, fmt.Errorf("addresses of %s: %w", hl.Eth0, err)
	}
	found := false
	for _, ad := range addrs {
		if ad.Flags&unix.IFA_F_SECONDARY != 0 || ad.IPNet == nil || ad.IP.To4() == nil {
			continue
		}
		hl.Addr = net.IPNet{IP: ad.IP.To4(), Mask: ad.Mask}
		found = true
		break
	}
	if !found && needAddr {
		return hl, fmt.Errorf("public interface %s has no IPv4 address", hl.Eth0)
	}

	for _, r := range defaults {
		if r.LinkIndex == hl.Eth0Index && r.Gw != nil {
			hl.Gateway = r.Gw.To4()
			break
		}
	}

	// The first loopback link: a namespace's loopback is made with it, as
	// ifindex 1; the list (every link, tens of ms with 1,000 containers) only
	// when it is not.
	var lol netlink.Link
	if lo == "" {
		lol = loopbackAt(h, 1)
	}
	switch {
	case lo != "":
		lol, err = h.LinkByName(lo)
		if err != nil {
			return hl, fmt.Errorf("loopback interface %q: %w", lo, err)
		}
	case lol == nil:
		links, err := h.LinkList()
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return hl, fmt.Errorf("list links: %w", err)
		}
		for _, l := range links {
			if l.Attrs().RawFlags&unix.IFF_LOOPBACK != 0 {
				lol = l
				break
			}
		}
		if lol == nil {
			return hl, errors.New("no loopback interface")
		}
	}
	hl.Lo, hl.LoIndex, hl.LoMTU = lol.Attrs().Name, lol.Attrs().Index, lol.Attrs().MTU
	hl.LoMAC = append(net.HardwareAddr(nil), lol.Attrs().HardwareAddr...)
	return hl, nil
}

// loopbackAt is h's link of ifindex idx if it is a loopback, else nil.
func loopbackAt(h *netlink.Handle, idx int) netlink.Link {
	l, err := h.LinkByIndex(idx)
	if err != nil || l.Attrs().RawFlags&unix.IFF_LOOPBACK == 0 {
		return nil
	}
	return l
}

func prefixLen(n *net.IPNet) int {
	ones, _ := n.Mask.Size()
	return ones
}

// Counters are a link's IFLA_STATS64 counters.
type Counters struct {
	RxBytes, RxPackets, RxErrors, RxDropped uint64
	TxBytes, TxPackets, TxErrors, TxDropped uint64
}

// PeerCounters reads the counters of the host end (ifindex idx) of a veth in
// h's namespace and returns them from the peer's point of view: what the
// host end transmitted the container received, so rx and tx are swapped.
func PeerCounters(h *netlink.Handle, idx int) (Counters, error) {
	l, err := h.LinkByIndex(idx)
	if err != nil {
		return Counters{}, fmt.Errorf("link %d: %w", idx, err)
	}
	s := l.Attrs().Statistics
	if s == nil {
		return Counters{}, fmt.Errorf("link %d: kernel returned no statistics", idx)
	}
	return Counters{
		RxBytes: s.TxBytes, RxPackets: s.TxPackets, RxErrors: s.TxErrors, RxDropped: s.TxDropped,
		TxBytes: s.RxBytes, TxPackets: s.RxPackets, TxErrors: s.RxErrors, TxDropped: s.RxDropped,
	}, nil
}
