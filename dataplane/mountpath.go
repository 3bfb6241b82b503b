package dataplane

import (
	"fmt"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
)

// MountPath is where Setup bind-mounts a container's namespace handle
// (<netns-dir>/<container-id>); the lifecycle records it when recovery
// finds an interrupted isolate complete.
func (d *DataPlane) MountPath(id string) string { return d.mountPath(id) }

// PlanPin says where Setup would pin c's namespace and whether that pin
// would be isolatord's own (nspin.Plan), changing nothing.
func (d *DataPlane) PlanPin(c plane.Container) (path string, owned bool, err error) {
	if err := checkID(c.ID); err != nil {
		return "", false, err
	}
	ns, err := nshandle.Open(c.NetNS)
	if err != nil {
		return "", false, fmt.Errorf("container %s: %w", c.ID, err)
	}
	defer ns.Close()
	p := nspin.Plan(ns, d.cfg.NetNSDir, c.ID)
	return p.Path, p.Owned, nil
}
