package tcfilter

// Bandwidth shaping: HTB on host-side devices. The design is in the
// package documentation ("Bandwidth limits").

import (
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Handles of the shaping qdiscs and class on a shaped device.
var (
	ShapeRoot  = netlink.MakeHandle(1, 0)    // HTB root qdisc 1:
	ShapeClass = netlink.MakeHandle(1, 1)    // the one class 1:1 (default class)
	ShapeLeaf  = netlink.MakeHandle(0x10, 0) // leaf qdisc 10: under 1:1
)

// Limits of a Limit.
const (
	MinRate      = 1000            // bytes/s (8 kbit/s); below, one packet takes > 1 s
	MinBurst     = 2048            // bytes: at least one full-size frame
	MaxBurstTime = 60              // seconds of traffic at the rate a burst may hold
	minQueue     = 128 << 10       // bytes: fifo leaf floor (two 64 KiB GSO packets)
	maxQueue     = 64 << 20        // bytes: fifo leaf ceiling
	htbQuantum   = 65536           // DRR quantum of the class (irrelevant with one class; set to avoid kernel warnings)
	maxRate      = math.MaxInt64   // bytes/s
	peakBurstMin = 16 << 10        // bytes: cburst floor when a ceil is set
	defBurstMin  = 64 << 10        // bytes: default burst floor
	queueTime    = 10              // queue = rate / queueTime (100 ms)
	defBurstTime = 100             // default burst = rate / defBurstTime (10 ms)
	drainRate    = uint64(1) << 40 // bytes/s a class is raised to while it drains before removal
	ticksMax     = math.MaxUint32  // HTB buffers are 32-bit psched ticks
)

// ErrBadLimit wraps every invalid Limit.
var ErrBadLimit = errors.New("invalid bandwidth limit")

// Limit is a bandwidth limit in one direction. The zero Limit means none.
type Limit struct {
	Rate  uint64 `json:"rate"`            // sustained bytes per second; 0 = no limit
	Burst uint64 `json:"burst,omitempty"` // bytes allowed above the rate after an idle time; 0 = DefaultBurst(Rate)
	Ceil  uint64 `json:"ceil,omitempty"`  // peak bytes per second while bursting; 0 = no peak limit (line speed)
}

// IsZero reports whether l is "no limit".
func (l Limit) IsZero() bool { return l == Limit{} }

// DefaultBurst is the burst of a limit that gives none: 10 ms at the rate,
// at least 64 KiB (or one second at rates below 64 KiB/s, at least
// MinBurst).
func DefaultBurst(rate uint64) uint64 {
	return max(rate/defBurstTime, min(defBurstMin, max(rate, MinBurst)))
}

// EffectiveBurst is the burst in force: l.Burst or DefaultBurst(l.Rate).
func (l Limit) EffectiveBurst() uint64 {
	if l.Burst != 0 {
		return l.Burst
	}
	return DefaultBurst(l.Rate)
}

// Validate checks l (the zero Limit is valid: no limit).
func (l Limit) Validate() error {
	switch {
	case l.IsZero():
		return nil
	case l.Rate == 0:
		return fmt.Errorf("%w: burst or ceil given without a rate", ErrBadLimit)
	case l.Rate < MinRate:
		return fmt.Errorf("%w: rate %d bytes/s is below the minimum of %d bytes/s", ErrBadLimit, l.Rate, MinRate)
	case l.Rate > maxRate || l.Ceil > maxRate || l.Burst > maxRate:
		return fmt.Errorf("%w: value too large", ErrBadLimit)
	case l.Ceil != 0 && l.Ceil < l.Rate:
		return fmt.Errorf("%w: ceil %d bytes/s is below the rate %d bytes/s", ErrBadLimit, l.Ceil, l.Rate)
	case l.Burst != 0 && l.Burst < MinBurst:
		return fmt.Errorf("%w: burst %d bytes is below the minimum of %d bytes", ErrBadLimit, l.Burst, MinBurst)
	case float64(l.EffectiveBurst())/float64(l.Rate) > MaxBurstTime:
		return fmt.Errorf("%w: burst %d bytes is more than %d s of traffic at %d bytes/s", ErrBadLimit, l.Burst, MaxBurstTime, l.Rate)
	}
	return nil
}

// QueueBytes is the byte limit of the fifo leaf for l: ~100 ms at the
// highest rate l allows, within [128 KiB, 64 MiB].
func (l Limit) QueueBytes() uint32 {
	r := max(l.Rate, l.Ceil) / queueTime
	return uint32(min(max(r, minQueue), maxQueue))
}

// ticks converts bytes at rate into HTB buffer time (psched ticks).
func ticks(rate, bytes uint64) uint32 {
	t := float64(bytes) / float64(rate) * 1e6 * netlink.TickInUsec()
	if t >= ticksMax {
		return ticksMax
	}
	return uint32(t)
}

// class is the HTB class 1:1 that enforces l on link.
func (l Limit) class(link int) *netlink.HtbClass {
	burst := l.EffectiveBurst()
	ceil, cburst := l.Rate, burst
	if l.Ceil != 0 {
		ceil, cburst = l.Ceil, max(l.Ceil/1000, peakBurstMin)
	}
	return &netlink.HtbClass{
		ClassAttrs: netlink.ClassAttrs{LinkIndex: link, Parent: ShapeRoot, Handle: ShapeClass},
		Rate:       rate32Safe(l.Rate),
		Ceil:       rate32Safe(ceil),
		Buffer:     ticks(l.Rate, burst),
		Cbuffer:    ticks(ceil, cburst),
		Quantum:    htbQuantum,
	}
}

// rate32Safe works around netlink v1.3.1 sending a 64-bit rate's low 32
// bits as the legacy rate (iproute2 sends ~0): the kernel refuses a class
// whose legacy rate is 0, so a rate that is a multiple of 2^32 bytes/s
// (~34 Gbit/s) is lowered by one byte/s.
func rate32Safe(r uint64) uint64 {
	if r >= 1<<32 && r&0xffffffff == 0 {
		return r - 1
	}
	return r
}

func sameClass(a, b *netlink.HtbClass) bool {
	return a.Rate == b.Rate && a.Ceil == b.Ceil && a.Buffer == b.Buffer && a.Cbuffer == b.Cbuffer
}

// Leaf is the queue under the HTB class.
type Leaf int

// Leaf kinds, best first.
const (
	LeafFIFO    Leaf = iota // bfifo sized by QueueBytes (always available)
	LeafFQCodel             // fq_codel with kernel defaults (flow fairness, low delay)
)

func (k Leaf) String() string {
	if k == LeafFQCodel {
		return "fq_codel"
	}
	return "bfifo"
}

// Shaper is the HTB shaping of one device's egress (its root qdisc).
type Shaper struct {
	H    *netlink.Handle // namespace of the device
	NS   int             // fd of H's namespace, for the fifo leaf's raw request; <= 0: the calling thread's
	Link int             // ifindex of the shaped device
	Leaf Leaf
}

// ShapeState is what the kernel holds on a shaped device.
type ShapeState struct {
	Root    bool              // our HTB root 1: with default class 1:1
	Present bool              // Root and class 1:1
	Class   *netlink.HtbClass // the class as the kernel reports it (rates in bytes/s)
	Leaf    string            // kind of the leaf qdisc under 1:1 ("" if none)

	// Counters of the root qdisc: what went through, packets dropped
	// because the queue was full, throttle events, and what is queued now.
	Bytes, Packets     uint64
	Drops, Overlimits  uint64
	Backlog, QueueLen  uint64
	DirectPackets      uint64 // packets HTB sent unclassified (should stay 0)
	ClassOverlimits    uint64 // times the class hit its limit
	ClassBytes         uint64
	ClassDrops         uint64
	ClassPackets       uint64
	RootKind           string // kind of the root qdisc found ("" if none), for diagnosis
	RootHandleMismatch bool   // a root qdisc (not noqueue) that is not our HTB 1:
}

// Limit returns the limit the kernel enforces, with the burst derived
// from HTB's buffer time (rounded), and Ceil 0 when ceil == rate.
func (st ShapeState) Limit() Limit {
	if st.Class == nil {
		return Limit{}
	}
	c := st.Class
	l := Limit{Rate: c.Rate}
	if c.Rate > 0 {
		l.Burst = uint64(float64(c.Buffer) / netlink.TickInUsec() / 1e6 * float64(c.Rate))
	}
	if c.Ceil != c.Rate {
		l.Ceil = c.Ceil
	}
	return l
}

// Read returns the shaping state of the device.
func (s Shaper) Read() (ShapeState, error) {
	var st ShapeState
	qs, err := s.H.QdiscList(linkRef(s.Link))
	if err != nil {
		return st, fmt.Errorf("list qdiscs of ifindex %d: %w", s.Link, err)
	}
	for _, q := range qs {
		a := q.Attrs()
		if a.LinkIndex != s.Link {
			continue
		}
		switch {
		case a.Parent == netlink.HANDLE_ROOT:
			st.RootKind = q.Type()
			h, ok := q.(*netlink.Htb)
			if !ok || a.Handle != ShapeRoot {
				st.RootHandleMismatch = q.Type() != "noqueue"
				continue
			}
			st.Root = h.Defcls == uint32(ShapeClass&0xffff)
			st.DirectPackets = uint64(h.DirectPkts)
			if a.Statistics != nil {
				st.Bytes = a.Statistics.Basic.Bytes
				st.Packets = uint64(a.Statistics.Basic.Packets)
				st.Drops = uint64(a.Statistics.Queue.Drops)
				st.Overlimits = uint64(a.Statistics.Queue.Overlimits)
				st.Backlog = uint64(a.Statistics.Queue.Backlog)
				st.QueueLen = uint64(a.Statistics.Queue.Qlen)
			}
		case a.Parent == ShapeClass:
			st.Leaf = q.Type()
		}
	}
	if !st.Root {
		return st, nil
	}
	cs, err := s.H.ClassList(linkRef(s.Link), ShapeRoot)
	if err != nil {
		return st, fmt.Errorf("list classes of ifindex %d: %w", s.Link, err)
	}
	for _, c := range cs {
		hc, ok := c.(*netlink.HtbClass)
		if !ok || hc.Handle != ShapeClass {
			continue
		}
		st.Class = hc
		if a := hc.Statistics; a != nil {
			st.ClassBytes = a.Basic.Bytes
			st.ClassPackets = uint64(a.Basic.Packets)
			st.ClassDrops = uint64(a.Queue.Drops)
			st.ClassOverlimits = uint64(a.Queue.Overlimits)
		}
	}
	st.Present = st.Class != nil
	return st, nil
}

// InSync reports whether the device enforces exactly l (the zero Limit:
// no HTB root of ours) with the leaf kind s.Leaf.
func (s Shaper) InSync(l Limit) (bool, error) {
	st, err := s.Read()
	if err != nil {
		return false, err
	}
	if l.IsZero() {
		return !st.Root, nil
	}
	return st.Present && sameClass(st.Class, l.class(s.Link)) && st.Leaf == s.Leaf.String(), nil
}

// Apply makes the device enforce l, creating the HTB root, class and leaf
// as needed. On a device that enforces a limit already it only changes the
// class (and resizes a fifo leaf) in place: no qdisc is recreated and no
// queued packet is dropped. The zero Limit removes the shaping (Remove).
func (s Shaper) Apply(l Limit) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if l.IsZero() {
		return s.Remove()
	}
	st, err := s.Read()
	if err != nil {
		return err
	}
	want := l.class(s.Link)
	if !st.Root {
		if st.RootKind == "htb" && !st.RootHandleMismatch {
			// HTB 1: with another default class: HTB cannot change it in place
			if err := s.Remove(); err != nil {
				return err
			}
		}
		q := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: ShapeRoot})
		q.Defcls = uint32(ShapeClass & 0xffff)
		if err := s.H.QdiscReplace(q); err != nil {
			return fmt.Errorf("add htb root qdisc on ifindex %d: %w", s.Link, err)
		}
		if err := s.H.ClassAdd(want); err != nil {
			return errors.Join(fmt.Errorf("add htb class 1:1 on ifindex %d: %w", s.Link, err), s.Remove())
		}
		if err := s.addLeaf(l); err != nil {
			return errors.Join(err, s.Remove())
		}
		return nil
	}
	if st.Class == nil {
		if err := s.H.ClassAdd(want); err != nil {
			return fmt.Errorf("add htb class 1:1 on ifindex %d: %w", s.Link, err)
		}
	} else if !sameClass(st.Class, want) {
		if err := s.H.ClassChange(want); err != nil {
			return fmt.Errorf("change htb class 1:1 on ifindex %d: %w", s.Link, err)
		}
	}
	switch {
	case st.Leaf != s.Leaf.String():
		return s.addLeaf(l)
	case s.Leaf == LeafFIFO:
		if err := bfifoRequest(s.NS, s.Link, ShapeClass, ShapeLeaf, l.QueueBytes(), false); err != nil {
			return fmt.Errorf("resize bfifo leaf on ifindex %d: %w", s.Link, err)
		}
	}
	return nil
}

func (s Shaper) addLeaf(l Limit) error {
	var err error
	if s.Leaf == LeafFQCodel {
		err = s.H.QdiscReplace(netlink.NewFqCodel(netlink.QdiscAttrs{LinkIndex: s.Link, Parent: ShapeClass, Handle: ShapeLeaf}))
	} else {
		err = bfifoRequest(s.NS, s.Link, ShapeClass, ShapeLeaf, l.QueueBytes(), true)
	}
	if err != nil {
		return fmt.Errorf("add %s leaf on ifindex %d: %w", s.Leaf, s.Link, err)
	}
	return nil
}

// Remove deletes the HTB root (and with it the class and the leaf); the
// device goes back to its default qdisc. Queued packets are dropped: use
// Drain first to avoid that. Nothing to remove is fine.
func (s Shaper) Remove() error {
	err := s.H.QdiscDel(&netlink.Htb{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: ShapeRoot}})
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete htb root qdisc on ifindex %d: %w", s.Link, err)
	}
	return nil
}

// Drain lifts the class's limit, so that what is queued leaves at once,
// and waits (at most timeout) until the queue is empty. It is the step
// before Remove that keeps a removal from dropping packets. No shaping is
// fine.
func (s Shaper) Drain(timeout time.Duration) error {
	st, err := s.Read()
	if err != nil || !st.Present {
		return err
	}
	if err := s.H.ClassChange(Limit{Rate: drainRate}.class(s.Link)); err != nil {
		return fmt.Errorf("lift htb class 1:1 on ifindex %d: %w", s.Link, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		st, err := s.Read()
		if err != nil {
			return err
		}
		if st.Backlog == 0 && st.QueueLen == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ifindex %d: %d packets still queued after %v", s.Link, st.QueueLen, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ShaperExit are the filters on the ingress of the exit end (B) of a
// container's egress shaper pair: they send what the shaper let through
// where the container's veth would have sent it. ICMP -> host eth0;
// destination host IP or 127.0.0.0/8 -> host lo; anything else -> host
// eth0 (ARP too: the veth sends a limited container's ARP through the
// shaper).
type ShaperExit struct {
	H      *netlink.Handle // host namespace
	Dev    int             // the shaper's exit end (B)
	Eth0   int             // host eth0
	Lo     int             // host lo
	HostIP net.IP
	Slot   uint16 // the container's slot (classid of the nodes)
	Obs    Observer
}

func (x ShaperExit) dev() dev { return dev{h: x.H, ifindex: x.Dev, label: "shaper", obs: x.Obs} }

func (x ShaperExit) nodes() []node {
	c := ClassID(x.Slot)
	return withKinds([]node{
		{prio: PrioARP, handle: nodeARPRoot, classid: c, sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: x.Eth0},
		{prio: PrioIP, handle: 1, classid: c, sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoICMP)), act: actRedirect, target: x.Eth0, kind: KindICMP},
		{prio: PrioIP, handle: 2, classid: c, sel: sel(nl.TC_U32_TERMINAL, dstKey(x.HostIP)), act: actRedirect, target: x.Lo},
		{prio: PrioIP, handle: 3, classid: c, sel: sel(nl.TC_U32_TERMINAL, dstLoopbackKey()), act: actRedirect, target: x.Lo},
		{prio: PrioIP, handle: 4, classid: c, sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: x.Eth0},
	})
}

// Install adds the clsact qdisc and the exit filters (it can be re-run).
func (x ShaperExit) Install() error {
	if err := checkSlot(x.Slot); err != nil {
		return err
	}
	if x.HostIP.To4() == nil {
		return fmt.Errorf("shaper exit: host IP %v is not IPv4", x.HostIP)
	}
	if x.Dev <= 0 || x.Eth0 <= 0 || x.Lo <= 0 {
		return fmt.Errorf("shaper exit: ifindexes dev=%d eth0=%d lo=%d must be positive", x.Dev, x.Eth0, x.Lo)
	}
	if err := EnsureClsact(x.H, x.Dev); err != nil {
		return err
	}
	d := x.dev()
	fs, err := d.list()
	if err != nil {
		return err
	}
	return syncFixed(d, x.nodes(), fs)
}
