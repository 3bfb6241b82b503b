package dataplane

import (
	"fmt"

	"github.com/isolatord/isolatord/isolator/plane"
)

// claim reserves c's ID and slot for a Setup in progress (checked against
// the plumbed containers and the other setups in progress).
func (d *DataPlane) claim(c plane.Container) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rootQdiscs = nil // qdiscs may change: the recovery cache is no longer valid
	if err := d.ready(); err != nil {
		return err
	}
	if _, ok := d.ctrs[c.ID]; ok {
		return fmt.Errorf("%w: %s", ErrExists, c.ID)
	}
	if _, ok := d.settingUp[c.ID]; ok {
		return fmt.Errorf("%w: %s (being set up)", ErrExists, c.ID)
	}
	if other, ok := d.slots[c.Slot]; ok {
		return fmt.Errorf("%w: slot %d is used by container %s", ErrExists, c.Slot, other)
	}
	for other, slot := range d.settingUp {
		if slot == c.Slot {
			return fmt.Errorf("%w: slot %d is used by container %s (being set up)", ErrExists, c.Slot, other)
		}
	}
	if err := d.checkLimits(c.Egress, c.Ingress); err != nil {
		return err
	}
	if d.settingUp == nil {
		d.settingUp = map[string]uint16{}
	}
	d.settingUp[c.ID] = c.Slot
	d.retired.touch()
	return nil
}

// unclaim ends a Setup in progress.
func (d *DataPlane) unclaim(id string) {
	d.mu.Lock()
	delete(d.settingUp, id)
	d.mu.Unlock()
}
