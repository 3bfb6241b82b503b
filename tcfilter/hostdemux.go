package tcfilter

import (
	"net"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/ephemeral"
)

// HostDemux is the port demultiplexer on one host device's ingress hook
// (host eth0 with the host IP as destination, or host lo without one). It
// keeps an in-memory index of its own nodes (rebuilt from the kernel by
// Init) so that adds and deletes never dump the filter table; every method
// is safe for concurrent use. Its methods live in the hostdemux_*.go files,
// one per concern (see "Files" in the package documentation).
type HostDemux struct {
	d   dev
	c   *Conn  // batches (SetConn); nil: one request at a time
	dst net.IP // 4 bytes, nil on lo

	mu         sync.Mutex
	ready      bool
	initDump   []netlink.Filter       // the ingress hook's dump while Init runs (nil otherwise)
	nodes      map[uint32]owned       // range node handle -> owner
	owners     [256][]owned           // ranges meeting each 256-port chunk
	h2         [256]int               // nodes (ranges + shared ports) in H2_b
	h2Linked   [256]bool              // H2_b exists and H1[b] links to it
	shared     map[uint16]*sharedPort // shared port -> its spread table
	spreadUsed map[uint32]uint16      // spread table id -> shared port
	fanout     map[uint16]int         // slot -> mirror target (ARP and ICMP)
	stale      []tableRef             // unlinked tables the kernel still held busy
	staleTried time.Time              // the last attempt at them (retryStale)
	echo       *echoSteer             // echo programs and maps (eth0, echo.go); nil: fan-out
	echoErr    error                  // why echo is nil after Init
	ip6        *IPv6Demux             // the IPv6 classifier (hostdemux6.go); nil: none
	echo6      *echo6Steer            // ICMPv6 echo programs (eth0, echo6.go)
	echo6Err   error                  // why echo6 is nil with an IPv6 demux on eth0
	counts     *ebpf.Map              // the drop count map (SetDropSinks); nil: echo drops not counted
}

// SetConn makes the demux send its requests for a container's ranges in
// batches through c, a Conn of the demux's namespace (nil: one at a time).
func (x *HostDemux) SetConn(c *Conn) {
	x.mu.Lock()
	x.c = c
	x.mu.Unlock()
}

// owned is one exclusive range of the index and where it goes.
type owned struct {
	slot   uint16
	target int
	r      ephemeral.Range
}

// NewHostDemux describes the demux on device ifindex of the namespace h is
// opened in. device labels metrics ("eth0" or "lo"); dst is the host IPv4
// address matched on eth0 (nil on lo: every local TCP/UDP packet is
// demultiplexed, and there is no ARP/ICMP fan-out). Nothing touches the
// kernel before Init (or the first call that needs it).
func NewHostDemux(h *netlink.Handle, ifindex int, device string, dst net.IP, obs Observer) *HostDemux {
	var d4 net.IP
	if dst != nil {
		d4 = dst.To4()
	}
	return &HostDemux{d: dev{h: h, ifindex: ifindex, label: device, obs: obs}, dst: d4}
}
