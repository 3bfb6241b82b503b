package tcfilter

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/ifb"
	"github.com/isolatord/isolatord/tcfilter/bpfprog"
)

// Drop sinks and counts (see "Drops" in the package documentation).
//
// Every drop node of every veth redirects through the one mirred action of
// its reason, shared by the whole host (index dropIndexBase|reason), to the
// reason's sink: an ifb named DropSinkName(reason). Its egress runs a
// cls_bpf program that adds one to the entry {skb_iif, reason} of the
// count map and drops the packet. mirred sets skb_iif to the device it ran
// on, the container's veth, so the map holds per-container, per-reason
// counts that a map lookup reads: no netlink dump, no rtnl, and no
// mirred action of a container's own (the kernel walks every mirred action
// each time any device goes away).
//
// The programs (and through them the map) stay attached when the daemon
// exits; EnsureDropSinks adopts the map it finds there, so counts survive
// a restart. An ifindex is reused only after its device is gone: the
// entries of a veth are deleted when it is torn down (Release), when a new
// veth is set up (Reset) and at start-up for veths that are gone (Prune).

// DropSinkName is the name of the sink of reason (no "iso" prefix, the
// one of containers' veths).
func DropSinkName(reason string) string { return "drop." + reason }

// dropCountEntries bounds the count map: an entry per (veth, reason) that
// dropped something (slots x reasons, and room).
const dropCountEntries = 1 << 16

// Names of the count map, its programs and their filters.
const (
	dropMapName      = "iso_drops"
	dropProgName     = "iso_drop_count"
	dropFilterPrefix = "isolatord_count-"
)

// ErrNoDropCounts: the kernel cannot load the counting programs (no
// cls_bpf), so frames are dropped but not counted per container.
var ErrNoDropCounts = errors.New("per-container drop counts unavailable: the kernel does not load cls_bpf programs")

// DropSinks are the host's per-reason drop sinks, their shared mirred
// actions and the count map.
type DropSinks struct {
	index  []int     // sink ifindex by reason code (the index in DropReasons)
	counts *ebpf.Map // nil: not counted (no cls_bpf)
}

// BPF reports whether drops are counted per container.
func (s *DropSinks) BPF() bool { return s != nil && s.counts != nil }

// Index is the ifindex of the sink of reason (0: unknown reason).
func (s *DropSinks) Index(reason string) int {
	if r := slices.Index(DropReasons, reason); s != nil && r >= 0 {
		return s.index[r]
	}
	return 0
}

// isSink reports whether ifindex is one of the sinks.
func (s *DropSinks) isSink(ifindex int) bool {
	return s != nil && ifindex > 0 && slices.Contains(s.index, ifindex)
}

// Close releases the map's descriptor (the programs keep the map).
func (s *DropSinks) Close() {
	if s != nil && s.counts != nil {
		s.counts.Close()
		s.counts = nil
	}
}

// EnsureDropSinks makes sure the namespace of h has a sink per reason with
// its counting program, and the mirred action of each reason pointing at
// its sink. prepare runs on each sink while it is down (its sysctls: no
// IPv6, no forwarding); inNS runs a function inside the namespace of h
// (the action requests have no handle of their own). When the kernel
// cannot load the programs (bpfErr != nil) the sinks are kept down:
// mirred drops what is redirected to a down device, uncounted. It can be
// re-run; an existing device of another kind with a sink's name is an
// error.
func EnsureDropSinks(h *netlink.Handle, inNS func(func() error) error, prepare func(ifindex int, name string) error) (s *DropSinks, bpfErr, err error) {
	s = &DropSinks{index: make([]int, len(DropReasons))}
	links := make([]netlink.Link, len(DropReasons))
	for i, r := range DropReasons {
		l, err := ifb.Ensure(h, DropSinkName(r))
		if err != nil {
			return nil, nil, err
		}
		links[i], s.index[i] = l, l.Attrs().Index
		if l.Attrs().Flags&unix.IFF_UP == 0 {
			if err := prepare(s.index[i], DropSinkName(r)); err != nil {
				return nil, nil, fmt.Errorf("drop sink %s: %w", DropSinkName(r), err)
			}
		}
		if err := EnsureClsact(h, s.index[i]); err != nil {
			return nil, nil, err
		}
	}
	bpfErr = s.attachCounters(h)
	for i, l := range links {
		set, what := h.LinkSetUp, "up"
		if bpfErr != nil {
			set, what = h.LinkSetDown, "down"
		}
		if err := set(l); err != nil {
			s.Close()
			return nil, bpfErr, fmt.Errorf("drop sink %s: set %s: %w", DropSinkName(DropReasons[i]), what, err)
		}
	}
	if err := inNS(s.ensureActions); err != nil {
		s.Close()
		return nil, bpfErr, err
	}
	return s, bpfErr, nil
}

// ensureActions creates the mirred action of every reason (or points an
// existing one at its sink: a re-created sink has another ifindex) in one
// request, from the namespace's own thread. The actions are not a
// filter's: they stay when the last node bound to them goes.
func (s *DropSinks) ensureActions() error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWACTION, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK)
	req.AddData(&nl.TcActionMsg{Family: nl.FAMILY_ALL})
	tab := nl.NewRtAttr(nl.TCA_ACT_TAB, nil)
	var acts []netlink.Action
	for r, idx := range s.index {
		a := redirect(idx)
		a[0].Attrs().Index = int(hostDropIndex(r))
		acts = append(acts, a...)
	}
	if err := netlink.EncodeActions(tab, acts); err != nil {
		return err
	}
	req.AddData(tab)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("drop actions: %w", err)
	}
	return nil
}

// countFilterName is the name of the sink filter of reason code r: a
// digest of its program's object and r, so that a name match means the
// same code.
func countFilterName(r int) string {
	return filterName(dropFilterPrefix+DropReasons[r]+"-", "count", []byte{byte(r), byte(r >> 8)})
}

// sinkFilter returns the counting filter on the egress of sink (nil:
// none).
func sinkFilter(h *netlink.Handle, sink int) (*netlink.BpfFilter, error) {
	fs, err := h.FilterList(linkRef(sink), netlink.HANDLE_MIN_EGRESS)
	if err != nil {
		return nil, fmt.Errorf("list filters of drop sink %d: %w", sink, err)
	}
	for _, f := range fs {
		if b, ok := f.(*netlink.BpfFilter); ok && b.Priority == PrioSinkShot && strings.HasPrefix(b.Name, dropFilterPrefix) {
			return b, nil
		}
	}
	return nil, nil
}

// countMapOf opens the count map a program uses (nil: none, or one the
// counting program could not use: another layout).
func countMapOf(progID int) *ebpf.Map {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(progID))
	if err != nil {
		return nil
	}
	defer p.Close()
	ms := takeMaps(progMaps(p), dropMapName)
	if ms == nil {
		return nil
	}
	if spec, err := countMapSpec(); err == nil && spec.Compatible(ms[0]) == nil {
		return ms[0]
	}
	ms[0].Close()
	return nil
}

// countMapSpec is the count map's spec (count.c's iso_drops).
var countMapSpec = sync.OnceValues(func() (*ebpf.MapSpec, error) {
	spec, err := bpfprog.LoadCount()
	if err != nil {
		return nil, err
	}
	return spec.Maps[bpfprog.CountMapIsoDrops], nil
})

// attachCounters adopts the count map of a sink's program (a restarted
// daemon) or creates one, and gives every sink the counting program of its
// reason on that map, leaving a filter that runs that very code on that
// very map in place.
func (s *DropSinks) attachCounters(h *netlink.Handle) error {
	have := make([]*netlink.BpfFilter, len(s.index))
	for i, idx := range s.index {
		f, err := sinkFilter(h, idx)
		if err != nil {
			return err
		}
		have[i] = f
		if f != nil && s.counts == nil {
			s.counts = countMapOf(f.Id)
		}
	}
	id := mapID(s.counts)
	for i, idx := range s.index {
		name := countFilterName(i)
		if f := have[i]; s.counts != nil && f != nil && f.Name == name {
			if m := countMapOf(f.Id); m != nil {
				same := mapID(m) == id
				m.Close()
				if same {
					continue
				}
			}
		}
		if err := s.attachCounter(h, idx, i, name); err != nil {
			s.Close()
			return err
		}
	}
	return nil
}

// attachCounter loads the program of reason code r on the count map (the
// first load creates it) and puts it on the egress of sink (replacing what
// is there).
func (s *DropSinks) attachCounter(h *netlink.Handle, sink, r int, name string) error {
	var o bpfprog.CountObjects
	var replace map[string]*ebpf.Map
	if s.counts != nil {
		replace = map[string]*ebpf.Map{bpfprog.CountMapIsoDrops: s.counts}
	}
	if err := loadObjects(bpfprog.LoadCount, &o, map[string]any{bpfprog.CountVarDropReason: uint32(r)}, replace); err != nil {
		return err
	}
	defer o.IsoDropCount.Close()
	if s.counts == nil {
		s.counts = o.IsoDrops
	} else {
		o.IsoDrops.Close()
	}
	err := h.FilterReplace(&netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: sink, Parent: netlink.HANDLE_MIN_EGRESS, Priority: PrioSinkShot,
			Protocol: unix.ETH_P_ALL, Handle: 1},
		Fd: o.IsoDropCount.FD(), Name: name, DirectAction: true,
	})
	if err != nil {
		return fmt.Errorf("attach bpf %s to drop sink %d: %w", name, sink, err)
	}
	return nil
}

// ---- counts ----

func countKey(veth, r int) bpfprog.CountDropKey {
	return bpfprog.CountDropKey{Veth: uint32(veth), Reason: uint32(r)}
}

func zeroCounts() map[string]uint64 {
	out := make(map[string]uint64, len(DropReasons))
	for _, r := range DropReasons {
		out[r] = 0
	}
	return out
}

// Counts reads how many frames veth dropped, by reason (every reason
// present), from the count map: a lookup per reason, no netlink.
func (s *DropSinks) Counts(veth int) (map[string]uint64, error) {
	out := zeroCounts()
	if !s.BPF() {
		return out, ErrNoDropCounts
	}
	for r, name := range DropReasons {
		var n uint64
		err := s.counts.Lookup(countKey(veth, r), &n)
		switch {
		case err == nil:
			out[name] = n
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			return out, fmt.Errorf("drop counts of veth %d: %w", veth, err)
		}
	}
	return out, nil
}

// Release reads the counts of veth (which is going away) and deletes its
// entries.
func (s *DropSinks) Release(veth int) (map[string]uint64, error) {
	out, err := s.Counts(veth)
	if err != nil {
		return out, err
	}
	return out, s.Reset(veth)
}

// Reset deletes the entries of veth (missing ones are fine): a veth just
// created starts from zero whatever an earlier device of its ifindex
// counted.
func (s *DropSinks) Reset(veth int) error {
	if !s.BPF() {
		return nil
	}
	var errs []error
	for r := range DropReasons {
		if err := s.counts.Delete(countKey(veth, r)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("drop counts of veth %d: %w", veth, err)
	}
	return nil
}

// All reads every entry of the map: counts by veth and reason (veths that
// dropped nothing are absent).
func (s *DropSinks) All() (map[int]map[string]uint64, error) {
	out := map[int]map[string]uint64{}
	if !s.BPF() {
		return out, ErrNoDropCounts
	}
	var k bpfprog.CountDropKey
	var n uint64
	it := s.counts.Iterate()
	for it.Next(&k, &n) {
		if int(k.Reason) >= len(DropReasons) {
			continue // a newer daemon's reason
		}
		veth := int(k.Veth)
		if out[veth] == nil {
			out[veth] = zeroCounts()
		}
		out[veth][DropReasons[k.Reason]] += n
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("drop counts: %w", err)
	}
	return out, nil
}

// Prune deletes the entries of every veth for which keep is false (gone
// devices, at start-up); it returns how many veths it forgot.
func (s *DropSinks) Prune(keep func(veth int) bool) (int, error) {
	if !s.BPF() {
		return 0, nil
	}
	// the keys first: deleting while iterating would start the walk over
	var keys []bpfprog.CountDropKey
	var k bpfprog.CountDropKey
	var n uint64
	it := s.counts.Iterate()
	for len(keys) < dropCountEntries && it.Next(&k, &n) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("drop counts: %w", err)
	}
	gone := map[int]bool{}
	var errs []error
	for _, k := range keys {
		veth := int(k.Veth)
		if keep(veth) {
			continue
		}
		gone[veth] = true
		if err := s.counts.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return len(gone), errors.Join(errs...)
}
