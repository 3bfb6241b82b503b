package tcfilter

import (
	"sort"

	"github.com/isolatord/isolatord/ephemeral"
)

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
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Slot != b.Slot {
			return a.Slot < b.Slot
		}
		return a.Range.Begin < b.Range.Begin
	})
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
	return out
}
