package dataplane

import (
	"fmt"

	"github.com/isolatord/isolatord/neighsync"
	"github.com/isolatord/isolatord/netns"
)

// Neighbours: no ARP frame reaches a container (the eth0 demux keeps ARP
// with the host); containers get their neighbours from the host's table
// through the neighbour syncer (package neighsync), started by PrepareHost.

// startNeigh starts the neighbour syncer on the host's public interface.
func (d *DataPlane) startNeigh(eth0 int) error {
	if d.neigh != nil { // a PrepareHost that failed later started it
		return nil
	}
	s, err := neighsync.Start(d.hostNS, d.h, eth0, d.log)
	if err != nil {
		return err
	}
	d.neigh = s
	return nil
}

// addNeigh makes the syncer serve container id in namespace ns.
func (d *DataPlane) addNeigh(id string, ns *netns.NS) error {
	if d.neigh == nil {
		return nil
	}
	if err := d.neigh.Add(id, ns, ContainerEth0); err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	return nil
}

// dropNeigh stops serving container id (its socket in the namespace is
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
