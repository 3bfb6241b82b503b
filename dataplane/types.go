// Package dataplane is isolatord's kernel data plane: it composes the namespace
// packages (nshandle, nspin, veth, sysctl, containerns, hostlink) and tcfilter/
// (tc qdiscs and u32 filters) into the operations the lifecycle drives: host preparation, container
// setup, port changes, statistics, teardown and a kernel snapshot for recovery.
package dataplane

// DataPlane implements isolator.DataPlane in the lifecycle's types
// (package isolator/plane).

// Snapshot is what exists in the kernel and the netns directory that carries
// isolatord's identity, so recovery can map objects back to containers and find strays.
type Snapshot struct {
	Veths  map[string]int      // host-side veth name -> ifindex (our naming prefix only)
	Mounts map[string]bool     // container IDs with a namespace bind mount in the netns dir
	Slots  map[uint16][]string // slot -> descriptions of host filters tagged with it
}
