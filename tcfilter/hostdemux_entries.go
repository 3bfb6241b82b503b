package tcfilter

// What is installed: Entries reads it back from the kernel (recovery,
// diagnosis), Known and SharedHolders answer from the in-memory index.

import (
	"sort"

	"github.com/isolatord/isolatord/ephemeral"
)

// Entry is one thing of ours found on the device. A range that takes
// several nodes (one per 256- or 16-port chunk) is one Entry whose Handle is
// its first node; a shared port is one Entry per holder that owns at least
// one spread bucket or pin (Handle: the first such node).
type Entry struct {
	Kind   string // range | shared | arp | icmp
	Slot   uint16
	Target int
	Range  ephemeral.Range // range and shared entries (a shared port is Begin == End)
	Handle uint32
}

// Entry kinds.
const (
	EntryRange  = "range"
	EntryShared = "shared"
	EntryICMP   = "icmp"
)

// Entries lists everything of ours on the device, read from the kernel
// (not from the in-memory index): ranges, shared-port holders and ICMP
// fan-out nodes, sorted by kind, slot and port.
func (x *HostDemux) Entries() ([]Entry, error) {
	fs, err := x.d.list()
	if err != nil {
		return nil, err
	}
	links := map[uint32]uint16{} // spread table -> port
	for _, f := range fs {
		if _, small := h2Of(f.Handle); small && f.Priority == PrioIP && f.Handle&0xf00 == nodeSharedBase && f.Link != 0 {
			if p, ok := sharedPortOf(f); ok {
				links[f.Link>>20] = p
			}
		}
	}
	var out []Entry
	seen := map[Entry]bool{}
	addOnce := func(e Entry) {
		k := e
		k.Handle = 0
		if !seen[k] {
			seen[k] = true
			out = append(out, e)
		}
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].Handle < fs[j].Handle })
	for _, f := range fs {
		htid, _, nid := SplitU32Handle(f.Handle)
		switch {
		case f.Priority != PrioIP:
		case htid == TableICMPFn:
			if s, ok := slotOf(f.ClassId); ok {
				addOnce(Entry{Kind: EntryICMP, Slot: s, Target: mirredTarget(f), Handle: f.Handle})
			}
		case htid >= TableSpreadFirst && htid <= TableSpreadLast:
			p, linked := links[htid]
			s, ok := slotOf(f.ClassId)
			if _, bkt, _ := SplitU32Handle(f.Handle); linked && ok && isSpreadNode(bkt, nid) {
				addOnce(Entry{Kind: EntryShared, Slot: s, Target: mirredTarget(f),
					Range: ephemeral.Range{Begin: p, End: p}, Handle: f.Handle})
			}
		default:
			if o, ok := decodeRange(f); ok {
				addOnce(Entry{Kind: EntryRange, Slot: o.slot, Target: o.target, Range: o.r, Handle: f.Handle})
			}
		}
	}
	sortEntries(out)
	return out, nil
}

// Known returns the entries of slot as this HostDemux's in-memory index has
// them: what Init read from the kernel plus every change made through it
// since. Unlike Entries it sends nothing to the kernel, so recovery can check
// a thousand containers against one dump (Init's) instead of one dump each.
// Fan-out appears as an icmp entry; a shared port as one entry
// per holder that owns a bucket or a pin.
func (x *HostDemux) Known(slot uint16) []Entry {
	return x.known(func(s uint16) bool { return s == slot })
}

// KnownAll is Known for every slot: the entries of the in-memory index,
// for a recovery that must not dump the filters again.
func (x *HostDemux) KnownAll() []Entry {
	return x.known(func(uint16) bool { return true })
}

func (x *HostDemux) known(want func(slot uint16) bool) []Entry {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []Entry
	seen := map[Entry]bool{}
	add := func(e Entry) {
		if !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	for _, o := range x.nodes {
		if want(o.slot) {
			add(Entry{Kind: EntryRange, Slot: o.slot, Target: o.target, Range: o.r})
		}
	}
	for slot, t := range x.fanout {
		if want(slot) {
			add(Entry{Kind: EntryICMP, Slot: slot, Target: t})
		}
	}
	for port, sp := range x.shared {
		r := ephemeral.Range{Begin: port, End: port}
		for b, h := range sp.buckets {
			if sp.present[b] && want(h.Slot) {
				add(Entry{Kind: EntryShared, Slot: h.Slot, Target: h.Target, Range: r})
			}
		}
		for _, h := range sp.pins {
			if want(h.Slot) {
				add(Entry{Kind: EntryShared, Slot: h.Slot, Target: h.Target, Range: r})
			}
		}
	}
	sortEntries(out)
	return out
}

// SharedHolders returns the slots that own at least one bucket or pin of a
// shared port, from the in-memory index.
func (x *HostDemux) SharedHolders(port uint16) map[uint16]bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[uint16]bool{}
	sp, ok := x.shared[port]
	if !ok {
		return out
	}
	for b, h := range sp.buckets {
		if sp.present[b] {
			out[h.Slot] = true
		}
	}
	for _, h := range sp.pins {
		out[h.Slot] = true
	}
	for s := range sp.drain {
		out[s] = true
	}
	delete(out, 0) // spread.Refuse: the host
	return out
}

// sortEntries orders entries by kind, slot and first port.
func sortEntries(es []Entry) {
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Slot != b.Slot {
			return a.Slot < b.Slot
		}
		return a.Range.Begin < b.Range.Begin
	})
}
