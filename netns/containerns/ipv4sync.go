package containerns

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Host4 is what a container carries of the host's IPv4 side and link.
type Host4 struct {
	Addr    net.IPNet        // the host's primary IPv4 address; IP nil: it has none now
	Gateway net.IP           // IPv4 default gateway, nil for none
	MTU     int              // lo's MTU and the routes' through eth0 (0: left alone; eth0 gets EthMTU)
	LoMTU   int              // lo's MTU instead of MTU (0: MTU)
	MAC     net.HardwareAddr // eth0's and lo's MAC (nil: left alone)
}

// SyncIPv4 brings a configured container's eth0 and lo (named eth0 and
// lo, through h, a handle opened inside its namespace) in line with the
// host's IPv4 side now (the host was renumbered, got another gateway,
// MTU or MAC while the container ran, or while the daemon was down):
// make-before-break, the new address goes on first, then MTU and MAC,
// then the default route is replaced (or removed: no gateway, or no
// address), and only then do the addresses that are no longer the
// host's go (their connections could not work anyway: the host no
// longer has the address, and the veth filters no longer let it
// through). An address that stays is never touched.
func SyncIPv4(h *netlink.Handle, eth0, lo string, want Host4) error {
	if lo == "" {
		lo = "lo"
	}
	if want.Addr.IP != nil && want.Addr.IP.To4() == nil {
		return fmt.Errorf("container address %v is not IPv4", want.Addr.IP)
	}
	eth, err := h.LinkByName(eth0)
	if err != nil {
		return fmt.Errorf("container %s: %w", eth0, err)
	}
	have, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("container %s addresses: %w", eth0, err)
	}
	if err := addAddr4(h, eth, have, want.Addr); err != nil {
		return err
	}
	ethWant := want
	if want.MTU > 0 {
		ethWant.MTU = EthMTU // the routes carry want.MTU (mtu.go)
	}
	if err := syncLink(h, eth, ethWant); err != nil {
		return err
	}
	if l, err := h.LinkByName(lo); err != nil {
		return fmt.Errorf("container %s: %w", lo, err)
	} else if err := syncLink(h, l, want.lo()); err != nil {
		return err
	}
	if err := syncRoutes4(h, eth, want); err != nil {
		return err
	}
	for _, a := range have {
		if want.Addr.IP != nil && sameNet(*a.IPNet, want.Addr) {
			continue
		}
		if err := h.AddrDel(eth, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("container %s old address %s: %w", eth0, a.IPNet, err)
		}
	}
	if want.Addr.IP == nil || len(have) == 0 || (len(have) == 1 && sameNet(*have[0].IPNet, want.Addr)) {
		return nil
	}
	// Deleting a primary address deletes the secondaries of its subnet
	// (unless promote_secondaries): the new one may have gone with the
	// old, and the default route with both.
	now, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("container %s addresses: %w", eth0, err)
	}
	if err := addAddr4(h, eth, now, want.Addr); err != nil {
		return err
	}
	return syncRoutes4(h, eth, want)
}

// addAddr4 adds want to eth unless have lists it (IP nil: nothing).
func addAddr4(h *netlink.Handle, eth netlink.Link, have []netlink.Addr, want net.IPNet) error {
	if want.IP == nil {
		return nil
	}
	for _, a := range have {
		if sameNet(*a.IPNet, want) {
			return nil
		}
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: want.IP.To4(), Mask: want.Mask}}
	if err := h.AddrAdd(eth, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("container %s address %s: %w", eth.Attrs().Name, addr.IPNet, err)
	}
	return nil
}

// syncLink gives link l want's MTU and MAC when they differ.
func syncLink(h *netlink.Handle, l netlink.Link, want Host4) error {
	a := l.Attrs()
	if want.MTU > 0 && a.MTU != want.MTU {
		if err := h.LinkSetMTU(l, want.MTU); err != nil {
			return fmt.Errorf("container %s MTU %d: %w", a.Name, want.MTU, err)
		}
	}
	if len(want.MAC) == 6 && a.HardwareAddr.String() != want.MAC.String() {
		if err := h.LinkSetHardwareAddr(l, want.MAC); err != nil {
			return fmt.Errorf("container %s MAC %s: %w", a.Name, want.MAC, err)
		}
	}
	return nil
}

// syncDefault4 replaces eth's IPv4 default route by one via want's
// gateway, or deletes it when there is no gateway or no address.
func syncDefault4(h *netlink.Handle, eth netlink.Link, want Host4) error {
	idx := eth.Attrs().Index
	if want.Gateway != nil && want.Addr.IP != nil {
		r := &netlink.Route{LinkIndex: idx, Gw: want.Gateway.To4(), Scope: netlink.SCOPE_UNIVERSE, MTU: want.MTU}
		err := h.RouteReplace(r)
		if errors.Is(err, unix.ENETUNREACH) {
			// A gateway outside the container's subnet: the host reaches
			// it through another address of its own (a renumbering
			// under way); on eth0 it is on-link all the same.
			r.Flags = int(netlink.FLAG_ONLINK)
			err = h.RouteReplace(r)
		}
		if err != nil {
			return fmt.Errorf("container default route via %s: %w", want.Gateway, err)
		}
		return nil
	}
	rs, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: idx, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("container %s IPv4 routes: %w", eth.Attrs().Name, err)
	}
	for _, r := range rs {
		if r.Dst != nil && !(r.Dst.IP.IsUnspecified() && prefixLen(r.Dst) == 0) {
			continue
		}
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("container default route via %s: %w", r.Gw, err)
		}
	}
	return nil
}

func sameNet(a, b net.IPNet) bool {
	return a.IP.Equal(b.IP) && prefixLen(&a) == prefixLen(&b)
}

func prefixLen(n *net.IPNet) int {
	ones, _ := n.Mask.Size()
	return ones
}

// lo is what lo is synced to: LoMTU instead of MTU when both are set.
func (w Host4) lo() Host4 {
	if w.LoMTU > 0 && w.MTU > 0 {
		w.MTU = w.LoMTU
	}
	return w
}
