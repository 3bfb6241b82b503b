package dataplane

import (
	"fmt"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/containerns"
	"github.com/isolatord/isolatord/netns/nshandle"
)

// refreshHostVeth gives an adopted container's host veth (ifindex veth)
// the host's MTU and MAC now, and points its redirects at eth0 now (a
// restart after the host changed).
func (d *DataPlane) refreshHostVeth(c plane.Container, veth, via int) error {
	l, err := d.h.LinkByIndex(veth)
	if err != nil {
		return err
	}
	if l.Attrs().MTU != d.vethMTU(d.info.MTU) {
		if err := d.h.LinkSetMTU(l, d.vethMTU(d.info.MTU)); err != nil {
			return fmt.Errorf("%s MTU: %w", plane.VethName(c.ID), err)
		}
	}
	if !macEqual(l.Attrs().HardwareAddr, d.info.MAC) {
		if err := d.h.LinkSetHardwareAddr(l, d.info.MAC); err != nil {
			return fmt.Errorf("%s MAC: %w", plane.VethName(c.ID), err)
		}
	}
	return d.vethFilters(c.Slot, veth, via).Retarget(allRanges(c.Ephemeral, c.Ports, c.Shared))
}

// refreshContainerSide brings the inside of an adopted container whose
// veth filters were just re-installed (its alias named another layout,
// sink or set of host IPv6 addresses) in line with this run: eth0's IPv6
// addresses and routes become the host's current ones (containerns.
// SyncIPv6; a container created without IPv6 keeps none) and the
// filters on its lo and eth0 match the current host addresses. Without
// it, a restart with other host IPv6 addresses would leave the container
// sending from an address its veth now drops, and its lo steering by the
// old one. Its IPv4 address, default route, MTU and MAC become the
// host's too (containerns.SyncIPv4).
func (d *DataPlane) refreshContainerSide(c plane.Container, pinPath string) error {
	ns, err := nshandle.Open(pinPath)
	if err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	defer ns.Close()
	ch, err := ns.Netlink()
	if err != nil {
		return err
	}
	defer ch.Close()
	h4 := containerns.Host4{Gateway: d.info.Gateway, MTU: d.info.MTU, LoMTU: d.loMTU(), MAC: d.info.MAC}
	if !d.lost4 {
		h4.Addr = d.info.IP
	}
	if err := containerns.SyncIPv4(ch, ContainerEth0, "lo", h4); err != nil {
		return err
	}
	if d.v6 != nil {
		if err := containerns.SyncIPv6(ch, ContainerEth0, d.v6, d.info.MTU); err != nil {
			return err
		}
	}
	cf, err := d.containerFiltersIn(ch)
	if err != nil {
		return err
	}
	if err := cf.Install(allRanges(c.Ephemeral, c.Ports, c.Shared)); err != nil {
		return fmt.Errorf("container filters: %w", err)
	}
	return nil
}
