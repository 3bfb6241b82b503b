// Package plane is the data plane as the lifecycle (package isolator) sees
// it: the container it asks to plumb, what was built, the traffic counters,
// what host preparation found, what teardown and discovery report, and the
// errors the lifecycle tells apart. It is plain Go with no kernel code, so
// the lifecycle builds and is unit-tested on any GOOS; isolator.DataPlane is
// declared in these types, the kernel data plane (package dataplane)
// implements it in them and converts to and from the kernel's own types.
// Tested through its users (isolator's unit tests, dataplane's kernel tests).
package plane

import (
	"net"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane/rate"
)

// Container is everything the data plane needs to plumb one container.
type Container struct {
	ID        string          // validated container ID (see ValidateID)
	Slot      uint16          // 1..MaxSlot, unique among live containers; tags kernel objects
	NetNS     string          // path of the container's network namespace (e.g. /proc/PID/ns/net)
	Ephemeral ephemeral.Range // aligned block; becomes the container's ip_local_port_range
	Ports     ephemeral.Set   // exclusive static ports
	Shared    ephemeral.Set   // shared static ports (SO_REUSEPORT across containers)
	Egress    rate.Limit      // bandwidth limit on what the container sends; zero = none
	Ingress   rate.Limit      // bandwidth limit on what it receives; zero = none
	Meta      Meta            // kept with the container's kernel objects; ID is filled in
	// Pin and PinOwned are where the namespace is pinned and whether
	// isolatord made that pin, as Setup reported them (Plumbing). Teardown,
	// Check and Adopt use them when the data plane has no record of the
	// container (after a restart); Pin "" means <netns-dir>/<ID>.
	Pin      string
	PinOwned bool
}

// MaxSlot is the largest container slot: u32 node ids have 12 bits.
const MaxSlot = 4095

// Meta is the container metadata the data plane keeps in the kernel (in
// its host veth's alias: JSON, at most 255 bytes; labels that do not fit are
// left out and LabelsDropped says so), so that a daemon without its
// database still knows it.
type Meta struct {
	ID      string            `json:"id"`
	Created int64             `json:"created,omitempty"` // unix seconds
	Labels  map[string]string `json:"labels,omitempty"`
	// PinOwned: the namespace pin <netns-dir>/<id> was created by
	// isolatord (not there before), so its cleanup removes it.
	PinOwned      bool `json:"pin_owned,omitempty"`
	LabelsDropped bool `json:"labels_dropped,omitempty"`
	// Layout and Sink say which veth filters were installed: the layout
	// and the drop sink's ifindex their drop nodes point at. Adopt
	// re-installs the filters only when either differs.
	Layout int `json:"layout,omitempty"`
	Sink   int `json:"sink,omitempty"`
	// V6 tags the host IPv6 addresses the filters match (empty: none):
	// Adopt re-installs them when it differs too.
	V6 string `json:"v6,omitempty"`
	// Eph is the container's ephemeral block ("32768-33791"), kept on the
	// host side so a rebuild never has to believe the tenant's own
	// ip_local_port_range.
	Eph string `json:"eph,omitempty"`
	// V4 tags the host facts the veth's filters and the container's
	// inside copy (IPv4 address, gateway, MAC, MTU, eth0): Adopt brings
	// both in line when it differs.
	V4 string `json:"v4,omitempty"`
	// Loop tags the destination ports the veth lets a container reach on
	// the host's loopback: Adopt re-installs the filters when it differs.
	Loop string `json:"loop,omitempty"`
}

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
	// IPv6 are the host's global IPv6 addresses containers share, with
	// their prefixes; nil when containers have no IPv6.
	IPv6 []net.IPNet
	// Gateway6 is the gateway of the IPv6 default route containers get
	// (the host's), nil when they have no IPv6 or there is none.
	Gateway6 net.IP
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
	// (every reason the data plane counts present).
	Dropped map[string]uint64
}

// FollowStats count what the data plane's follower of the host did since
// start.
type FollowStats struct {
	Passes   uint64 // reads of the host after a burst (or to retry)
	Changes  uint64 // host changes applied (facts that differed after a burst)
	Synced   uint64 // containers brought in line
	Failures uint64 // attempts to bring a container in line that failed (each is retried)
	Pending  int    // containers not in line now
	Events   uint64 // netlink notifications about eth0 or lo
	Resyncs  uint64 // subscriptions made again after they ended
}

// ShapeCounters are one direction of a container's shaping as the kernel
// reports it.
type ShapeCounters struct {
	Limit    rate.Limit // the limit the data plane applied (zero: none)
	Enforced bool       // the kernel holds the HTB for it
	Queue    string     // leaf qdisc kind: bfifo or fq_codel
	// Root qdisc counters: sent, dropped (queue full), throttle events,
	// and what is queued now.
	Bytes, Packets, Drops, Overlimits, Backlog, QueueLen uint64
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

// Found is one container as the kernel shows it.
type Found struct {
	Container           // ID, slot, namespace (its pin), ports, ephemeral block, limits, meta
	Veth      string    // host veth name
	VethIndex int       // its ifindex
	Mount     string    // the namespace pin
	NetNSIno  uint64    // inode of its namespace
	Created   time.Time // from the kernel's metadata (zero: not recovered)
	// Lost names what could not be recovered (e.g. "labels", "creation
	// time"); the container is served all the same.
	Lost []string
	// TenantRange is the container's ip_local_port_range as its tenant had
	// left it, when it differed from the block the host side proves (Discover
	// wrote the block back); "" when it was the block.
	TenantRange string
}

// Held is what a kernel object of the host namespace still routes to a
// live veth that Discover could not attribute to a container: it stays
// reserved (never handed out again) until an operator removes it.
type Held struct {
	What  string        // the object, as reported
	Slots []uint16      // slots its filters carry
	Ports ephemeral.Set // ports the host demux routes to it
}

// Discovery is what the data plane's Discover found.
type Discovery struct {
	Held  []Held
	Found []Found
	// Unattributed are kernel objects of isolatord's shape that belong to
	// no container that could be rebuilt: left in place, reported.
	Unattributed []string
}

// SocketStats are statistics read inside a container's network namespace.
type SocketStats struct {
	// TCPConnections are the TCP connections in any state but LISTEN and
	// TIME_WAIT; TCPTimeWait those in TIME_WAIT.
	TCPConnections, TCPTimeWait uint64
	// RTT summarizes the smoothed RTT of established TCP sockets; nil when
	// none has a sample.
	RTT *RTTPercentiles
	// SNMP holds /proc/net/snmp: group ("Ip", "Icmp", "Tcp", "Udp", ...) ->
	// counter name as the kernel spells it -> value.
	SNMP map[string]map[string]uint64
}

// RTTPercentiles are nearest-rank percentiles of smoothed TCP round-trip
// times over Samples sockets.
type RTTPercentiles struct {
	P50, P90, P95, P99 time.Duration
	Samples            int
}

// DrainPort is one static port a container drains and how many of its
// flows still reach it (the host's pins of its live flows).
type DrainPort struct {
	Port      uint16
	LiveFlows int
}
