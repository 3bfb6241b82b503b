package shaping

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane/rate"
)

// Handles of the shaping qdiscs and class on a shaped device.
var (
	rootHandle  = netlink.MakeHandle(1, 0)    // HTB root qdisc 1:
	classHandle = netlink.MakeHandle(1, 1)    // the one class 1:1 (default class)
	leafHandle  = netlink.MakeHandle(0x10, 0) // leaf qdisc 10: under 1:1
)

// Settings of the HTB class.
const (
	htbQuantum   = 65536           // DRR quantum of the class (irrelevant with one class; set to avoid kernel warnings)
	peakBurstMin = 16 << 10        // bytes: cburst floor when a ceil is set
	drainRate    = uint64(1) << 40 // bytes/s a class is raised to while it drains before removal
	ticksMax     = math.MaxUint32  // HTB buffers are 32-bit psched ticks
)

// ticks converts bytes at rate into HTB buffer time (psched ticks).
func ticks(rate, bytes uint64) uint32 {
	t := float64(bytes) / float64(rate) * 1e6 * netlink.TickInUsec()
	if t >= ticksMax {
		return ticksMax
	}
	return uint32(t)
}

// class is the HTB class 1:1 that enforces l on link.
func class(l rate.Limit, link int) *netlink.HtbClass {
	burst := l.EffectiveBurst()
	ceil, cburst := l.Rate, burst
	if l.Ceil != 0 {
		ceil, cburst = l.Ceil, max(l.Ceil/1000, peakBurstMin)
	}
	return &netlink.HtbClass{
		ClassAttrs: netlink.ClassAttrs{LinkIndex: link, Parent: rootHandle, Handle: classHandle},
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

// Shaper is the HTB shaping of one device's egress (its root qdisc).
type Shaper struct {
	H    *netlink.Handle // namespace of the device
	NS   int             // fd of H's namespace, for the fifo leaf's raw request; <= 0: the calling thread's
	Link int             // ifindex of the shaped device
	Leaf Leaf
}

// State is what the kernel holds on a shaped device.
type State struct {
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
func (st State) Limit() rate.Limit {
	if st.Class == nil {
		return rate.Limit{}
	}
	c := st.Class
	l := rate.Limit{Rate: c.Rate}
	if c.Rate > 0 {
		l.Burst = uint64(float64(c.Buffer) / netlink.TickInUsec() / 1e6 * float64(c.Rate))
	}
	if c.Ceil != c.Rate {
		l.Ceil = c.Ceil
	}
	return l
}

// Read returns the shaping state of the device.
func (s Shaper) Read() (State, error) {
	var st State
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
			if !ok || a.Handle != rootHandle {
				st.RootHandleMismatch = q.Type() != "noqueue"
				continue
			}
			st.Root = h.Defcls == uint32(classHandle&0xffff)
			st.DirectPackets = uint64(h.DirectPkts)
			if a.Statistics != nil {
				st.Bytes = a.Statistics.Basic.Bytes
				st.Packets = uint64(a.Statistics.Basic.Packets)
				st.Drops = uint64(a.Statistics.Queue.Drops)
				st.Overlimits = uint64(a.Statistics.Queue.Overlimits)
				st.Backlog = uint64(a.Statistics.Queue.Backlog)
				st.QueueLen = uint64(a.Statistics.Queue.Qlen)
			}
		case a.Parent == classHandle:
			st.Leaf = q.Type()
		}
	}
	if !st.Root {
		return st, nil
	}
	cs, err := s.H.ClassList(linkRef(s.Link), rootHandle)
	if err != nil {
		return st, fmt.Errorf("list classes of ifindex %d: %w", s.Link, err)
	}
	for _, c := range cs {
		hc, ok := c.(*netlink.HtbClass)
		if !ok || hc.Handle != classHandle {
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

// Apply makes the device enforce l, creating the HTB root, class and leaf
// as needed. On a device that enforces a limit already it only changes the
// class (and resizes a fifo leaf) in place: no qdisc is recreated and no
// queued packet is dropped. The zero Limit removes the shaping (Remove).
func (s Shaper) Apply(l rate.Limit) error {
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
	want := class(l, s.Link)
	if !st.Root {
		if st.RootKind == "htb" && !st.RootHandleMismatch {
			// HTB 1: with another default class: HTB cannot change it in place
			if err := s.Remove(); err != nil {
				return err
			}
		}
		q := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: rootHandle})
		q.Defcls = uint32(classHandle & 0xffff)
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
		if err := bfifoRequest(s.NS, s.Link, classHandle, leafHandle, QueueBytes(l), false); err != nil {
			return fmt.Errorf("resize bfifo leaf on ifindex %d: %w", s.Link, err)
		}
	}
	return nil
}

func (s Shaper) addLeaf(l rate.Limit) error {
	var err error
	if s.Leaf == LeafFQCodel {
		err = s.H.QdiscReplace(netlink.NewFqCodel(netlink.QdiscAttrs{LinkIndex: s.Link, Parent: classHandle, Handle: leafHandle}))
	} else {
		err = bfifoRequest(s.NS, s.Link, classHandle, leafHandle, QueueBytes(l), true)
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
	err := s.H.QdiscDel(&netlink.Htb{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: rootHandle}})
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
	if err := s.H.ClassChange(class(rate.Limit{Rate: drainRate}, s.Link)); err != nil {
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

// linkRef names a link by index for the netlink calls that take a Link.
func linkRef(ifindex int) netlink.Link {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
}
