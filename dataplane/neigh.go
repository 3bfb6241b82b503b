package dataplane

import (
	"fmt"
	"net"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/neighsync"
	"github.com/isolatord/isolatord/netns/nshandle"
)

// Neighbours: no ARP frame reaches a container (the eth0 demux keeps ARP
// with the host); containers get their neighbours from the host's table
// through the neighbour syncer (package neighsync), started by PrepareHost.

// startNeigh starts the neighbour syncer on the host's public interface.
func (d *DataPlane) startNeigh(eth0 int, onLink net.IPNet, gateway net.IP) error {
	if d.neigh != nil { // a PrepareHost that failed later started it
		return nil
	}
	s, err := neighsync.Start(d.hostNS, d.h, eth0, onLink, gateway, d.log)
	if err != nil {
		return err
	}
	d.neigh = s
	return nil
}

// addNeigh makes the syncer serve container id in namespace ns, which
// Setup has just configured: it reads no neighbour table (a dump walks
// the machine's whole table; neighsync.AddNew): requests the container
// makes from now on reach the syncer as notifications.
func (d *DataPlane) addNeigh(id string, ns *nshandle.NS) error {
	if d.neigh == nil {
		return nil
	}
	if err := d.neigh.AddNew(id, ns, ContainerEth0); err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	return nil
}

// addNeighLater makes the syncer serve adopted container id, whose
// namespace (inode ino) is at path, in the background once recovery is
// over (neighsync.AddLater, released by Strays): serving its neighbour
// requests is not isolation, and opening a socket in each of 1,000
// namespaces delayed serving after a restart by over a second.
func (d *DataPlane) addNeighLater(id, path string, ino uint64) {
	if d.neigh != nil {
		d.neigh.AddLater(id, path, ContainerEth0, ino)
	}
}

// dropNeigh stops serving container id (its sockets in the namespace are
// closed, so the namespace can go).
func (d *DataPlane) dropNeigh(id string) {
	if d.neigh != nil {
		d.neigh.Remove(id)
	}
}

// NeighStats returns what the neighbour syncer did so far.
func (d *DataPlane) NeighStats() neighsync.Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.neigh == nil {
		return neighsync.Stats{}
	}
	return d.neigh.Stats()
}

// Echo replies: the eth0 demux learns which container sent an echo request
// from the device it reached eth0 from (tcfilter/echo.go): the container's
// veth, or its egress shaper's exit. Both are registered as origins.

// echoOriginShaper registers container id's shaper exit xi as an origin of
// its veth's echo requests.
func (d *DataPlane) echoOriginShaper(id string, xi int) error {
	vi, err := d.linkIndex(plane.VethName(id))
	if err != nil || vi == 0 {
		return err // no veth yet: Setup registers it with the veth
	}
	return d.eth0.SetEchoOrigin(xi, vi)
}

// adoptEchoOrigins registers a recovered container's veth and, if it has
// an egress limit, its shaper exit.
func (d *DataPlane) adoptEchoOrigins(id string, veth int, shaped bool) error {
	if err := d.eth0.SetEchoOrigin(veth, veth); err != nil || !shaped {
		return err
	}
	_, exit := ShaperNames(id)
	if xi, err := d.recoveryLinkIndex(exit); err == nil && xi > 0 {
		return d.eth0.SetEchoOrigin(xi, veth)
	}
	return nil
}

// dropEchoOrigins forgets a container's veth and, if it has an egress
// shaper pair (shaped), its exit (best effort: a stale origin only matters
// if its ifindex is reused, and then it points at a veth that is gone).
func (d *DataPlane) dropEchoOrigins(id string, veth int, shaped bool) {
	if veth == 0 {
		veth, _ = d.linkIndex(plane.VethName(id))
	}
	xi := 0
	if shaped {
		_, exit := ShaperNames(id)
		xi, _ = d.linkIndex(exit)
	}
	for _, i := range []int{veth, xi} {
		if err := d.eth0.DelEchoOrigin(i); err != nil {
			d.log.Warn("echo origin not removed", "container", id, "ifindex", i, "err", err)
		}
	}
}
