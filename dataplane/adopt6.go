package dataplane

import (
	"fmt"

	"github.com/isolatord/isolatord/containerns"
	"github.com/isolatord/isolatord/nshandle"
)

// refreshContainerSide brings the inside of an adopted container whose
// veth filters were just re-installed (its alias named another layout,
// sink or set of host IPv6 addresses) in line with this run: eth0's IPv6
// addresses and routes become the host's current ones (containerns.
// SyncIPv6; a container created without IPv6 keeps none) and the
// filters on its lo and eth0 match the current host addresses. Without
// it, a restart with other host IPv6 addresses would leave the container
// sending from an address its veth now drops, and its lo steering by the
// old one.
func (d *DataPlane) refreshContainerSide(c Container, pinPath string) error {
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
	if d.v6 != nil {
		if err := containerns.SyncIPv6(ch, ContainerEth0, d.v6); err != nil {
			return err
		}
	}
	eth, err := ch.LinkByName(ContainerEth0)
	if err != nil {
		return fmt.Errorf("%s: %w", ContainerEth0, err)
	}
	lo, err := ch.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	cf := d.containerFilters(ch, lo.Attrs().Index, eth.Attrs().Index)
	if err := cf.Install(allRanges(c.Ephemeral, c.Ports, c.Shared)); err != nil {
		return fmt.Errorf("container filters: %w", err)
	}
	return nil
}
