// Package dataplane is isolatord's kernel data plane: it composes the namespace
// packages (nshandle, nspin, veth, sysctl, containerns, hostlink) and tcfilter/
// (tc qdiscs and u32 filters) into the operations the lifecycle drives: host preparation, container
// setup, port changes, statistics, teardown and a kernel snapshot for recovery.
package dataplane

import "github.com/isolatord/isolatord/isolator/plane"

// The lifecycle's vocabulary (package plane): DataPlane implements
// isolator.DataPlane in these types.
type (
	Container      = plane.Container
	HostInfo       = plane.HostInfo
	LinkStats      = plane.LinkStats
	ShapeCounters  = plane.ShapeCounters
	Plumbing       = plane.Plumbing
	TeardownReport = plane.TeardownReport
	Meta           = plane.Meta
	Found          = plane.Found
	Discovery      = plane.Discovery
	Held           = plane.Held
	DrainPort      = plane.DrainPort
)

// MaxSlot is the largest container slot: u32 node ids have 12 bits.
const MaxSlot = plane.MaxSlot

// Snapshot is what exists in the kernel and the netns directory that carries
// isolatord's identity, so recovery can map objects back to containers and find strays.
type Snapshot struct {
	Veths  map[string]int      // host-side veth name -> ifindex (our naming prefix only)
	Mounts map[string]bool     // container IDs with a namespace bind mount in the netns dir
	Slots  map[uint16][]string // slot -> descriptions of host filters tagged with it
}
