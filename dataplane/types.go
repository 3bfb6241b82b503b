// Package dataplane is isolatord's kernel data plane: it composes the namespace
// packages (nshandle, nspin, veth, sysctl, containerns, hostlink) and tcfilter/
// (tc qdiscs and u32 filters) into the operations the lifecycle drives: host preparation, container
// setup, port changes, statistics, teardown and a kernel snapshot for recovery.
package dataplane

import (
	"net"

	"github.com/isolatord/isolatord/ephemeral"
)

// Container is everything the data plane needs to plumb one container.
type Container struct {
	ID        string          // validated container ID (see ValidateID)
	Slot      uint16          // 1..MaxSlot, unique among live containers; tags kernel objects
	NetNS     string          // path of the container's network namespace (e.g. /proc/PID/ns/net)
	Ephemeral ephemeral.Range // aligned block; becomes the container's ip_local_port_range
	Ports     ephemeral.Set   // exclusive static ports
	Shared    ephemeral.Set   // shared static ports (SO_REUSEPORT across containers)
	Egress    Limit           // bandwidth limit on what the container sends; zero = none
	Ingress   Limit           // bandwidth limit on what it receives; zero = none
	Meta      Meta            // kept in the host veth's alias (rebuild.go); ID is filled in
	// Pin and PinOwned are where the namespace is pinned and whether
	// isolatord made that pin, as Setup reported them (Plumbing). Teardown,
	// Check and Adopt use them when the data plane has no record of the
	// container (after a restart); Pin "" means <netns-dir>/<ID>.
	Pin      string
	PinOwned bool
}

// MaxSlot is the largest container slot: u32 node ids have 12 bits.
const MaxSlot = 4095

// HostInfo is what host preparation found and changed.
type HostInfo struct {
	Eth0      string           // public interface name
	Lo        string           // loopback interface name
	IP        net.IPNet        // primary IPv4 address of eth0 with its prefix
	MAC       net.HardwareAddr // eth0 MAC (every container and host lo carry it)
	MTU       int
	Gateway   net.IP            // default gateway via eth0, nil if none
	Features  map[string]bool   // kernel features detected (clsact, htb, tbf, ifb, ...)
	Originals map[string]string // host settings changed by preparation: key -> original value
	NetNSIno  uint64            // inode of the host's network namespace (0 if unknown)
	// LinkSpeed is eth0's link speed in Mbit/s (ethtool), 0 when the driver
	// does not know it (virtio and most virtual NICs); veth says 10000.
	LinkSpeed uint64
	// ShapingQueue is the leaf qdisc under bandwidth limits: "fq_codel" when
	// the kernel has it, else "bfifo"; "" when there is no HTB (no limits).
	ShapingQueue string
}

// LinkSpeedBytes is eth0's link speed in bytes per second (0 = unknown).
func (h HostInfo) LinkSpeedBytes() uint64 { return h.LinkSpeed * 1_000_000 / 8 }

// LinkStats are a container's traffic counters from the container's point of view.
type LinkStats struct {
	RxBytes, RxPackets, RxErrors, RxDropped uint64
	TxBytes, TxPackets, TxErrors, TxDropped uint64
	// Bandwidth shaping of each direction (Limit zero: not limited).
	Egress, Ingress ShapeCounters
	// Frames the container sent that its host veth dropped, by reason
	// (DropReasons, every one present).
	Dropped map[string]uint64
}

// Plumbing describes the kernel objects built for one container.
type Plumbing struct {
	Veth      string // host-side veth name
	VethIndex int
	Mount     string // bind-mount path of the namespace handle
	NetNSIno  uint64 // inode of the container's network namespace
	// PinOwned: isolatord created the mount at Mount and removes it at
	// teardown. False when a runtime had already pinned the namespace
	// there (Nomad does, at <netns-dir>/<allocID>): that pin is used and
	// never unmounted.
	PinOwned bool
}

// TeardownReport says which objects were already gone when teardown ran.
type TeardownReport struct {
	Missing []string // human-readable names of objects that did not exist
}

// Snapshot is what exists in the kernel and the netns directory that carries
// isolatord's identity, so recovery can map objects back to containers and find strays.
type Snapshot struct {
	Veths  map[string]int      // host-side veth name -> ifindex (our naming prefix only)
	Mounts map[string]bool     // container IDs with a namespace bind mount in the netns dir
	Slots  map[uint16][]string // slot -> descriptions of host filters tagged with it
}
