package spread

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// Buckets is the number of virtual buckets a shared port's flows are
// hashed into (source-port bits 1..8; bit 0 is skipped because Linux
// connect() prefers even source ports). 256 is the largest u32 divisor; it
// keeps the holders' shares within a few percent of 1/n.
const Buckets = 256

// Holder is one container holding a shared port: its slot, and where its
// flows go (the ifindex of its host-side veth; spread only carries it).
type Holder struct {
	Slot   uint16
	Target int
}

// MaxHolders is the largest number of containers that can share a port:
// each holder gets at least one of the Buckets virtual buckets.
const MaxHolders = Buckets

// MaxPinsPerBucket bounds the pinned source ports in one bucket, and so
// the extra checks a packet of that bucket can meet before it reaches the
// bucket's holder.
const MaxPinsPerBucket = 16

// Bucket is the virtual bucket of a shared port that the flows from client
// source port srcPort fall into: source-port bits 1..8.
func Bucket(srcPort uint16) int { return int(srcPort>>1) & (Buckets - 1) }

// Flow is a client of a shared port: its address (IPv4 plain, never
// IPv4-mapped; no zone) and source port. Pins match both.
type Flow = netip.AddrPort

// cmpFlow orders flows by source port, then address.
func cmpFlow(a, b Flow) int {
	if a.Port() != b.Port() {
		return int(a.Port()) - int(b.Port())
	}
	return a.Addr().Compare(b.Addr())
}

// Spread is how a shared port's flows are steered. Each of the
// Buckets virtual buckets (Bucket of the client's source port)
// goes to one holder; a pinned flow (client address and source port) goes
// to its pin's holder whatever its bucket. Pins keep established flows on the holder that has
// their sockets while their bucket moves to another holder (see Plan).
type Spread struct {
	Buckets [Buckets]Holder
	Pins    map[Flow]Holder // client address and source port -> holder
	// Draining lists the holders (slots) that take no new flows: no
	// bucket goes to them, their live flows stay pinned (drain.go).
	Draining map[uint16]bool
}

// Holder returns where a packet of flow f goes.
func (s *Spread) Holder(f Flow) Holder {
	if h, ok := s.Pins[f]; ok {
		return h
	}
	return s.Buckets[Bucket(f.Port())]
}

// Equal reports whether s and o steer every source port the same way.
func (s *Spread) Equal(o *Spread) bool {
	return s.Buckets == o.Buckets && maps.Equal(s.Pins, o.Pins) && sameDraining(s.Draining, o.Draining)
}

// Clone returns a deep copy of s.
func (s *Spread) Clone() Spread {
	return Spread{Buckets: s.Buckets, Pins: maps.Clone(s.Pins), Draining: maps.Clone(s.Draining)}
}

// Settled reports whether s is the consistent assignment want with no pins.
func (s *Spread) Settled(want *[Buckets]Holder) bool {
	return len(s.Pins) == 0 && s.Buckets == *want
}

// score is the rendezvous weight of holder slot for bucket b of port.
func score(port uint16, b int, slot uint16) uint64 {
	z := uint64(port)<<32 | uint64(b)<<16 | uint64(slot)
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// checkHolders validates a holder list and returns it sorted by slot.
func checkHolders(port uint16, holders []Holder) ([]Holder, error) {
	if len(holders) == 0 {
		return nil, errors.New("no holders")
	}
	if len(holders) > MaxHolders {
		return nil, fmt.Errorf("%d holders for port %d: at most %d", len(holders), port, MaxHolders)
	}
	hs := slices.Clone(holders)
	slices.SortFunc(hs, func(a, b Holder) int { return int(a.Slot) - int(b.Slot) })
	for i := 1; i < len(hs); i++ {
		if hs[i].Slot == hs[i-1].Slot {
			return nil, fmt.Errorf("port %d: slot %d listed twice", port, hs[i].Slot)
		}
	}
	return hs, nil
}

// Assign maps each of the Buckets virtual buckets of port to a holder
// by rendezvous hashing on (port, bucket, slot): the result depends only on
// the set of slots, adding a holder moves about 1/(n+1) of the buckets (all
// to the new holder) and removing one moves only its own buckets. Holders
// that would get no bucket then take, one by one in slot order, the bucket
// they rank highest among those of holders with more than one bucket, so
// every holder receives traffic and shows up in what is installed.
func Assign(port uint16, holders []Holder) ([Buckets]Holder, error) {
	var out [Buckets]Holder
	hs, err := checkHolders(port, holders)
	if err != nil {
		return out, err
	}
	count := map[uint16]int{}
	for b := range out {
		best, bestScore := 0, uint64(0)
		for i, h := range hs {
			if s := score(port, b, h.Slot); i == 0 || s > bestScore {
				best, bestScore = i, s
			}
		}
		out[b] = hs[best]
		count[hs[best].Slot]++
	}
	for _, h := range hs {
		if count[h.Slot] > 0 {
			continue
		}
		best, bestScore := -1, uint64(0)
		for b := range out {
			if count[out[b].Slot] < 2 {
				continue
			}
			if s := score(port, b, h.Slot); best < 0 || s > bestScore {
				best, bestScore = b, s
			}
		}
		count[out[best].Slot]--
		out[best] = h
		count[h.Slot]++
	}
	return out, nil
}

// FlowSource reports the live flows of a shared port in one holder's
// namespace: the clients (remote address and port) of its connected
// sockets on the port. ok is false when they could not be read. The answer is the
// tenant's socket table: Facts.Seen is what the host itself saw.
type FlowSource func(slot uint16) (flows []Flow, ok bool)

// Facts are what Plan knows besides the holders and the spread in force.
type Facts struct {
	// Flows lists the holders' live flows (their namespaces' sockets).
	Flows FlowSource
	// Draining lists the holders that take no new flows (drain.go).
	Draining map[uint16]bool
	// Seen reports whether the host saw traffic lately on the node of the
	// spread in force that steers flow f (its pin, else its bucket): the
	// host's own evidence, which no tenant writes. A flow counts only when
	// it is seen and that node steers to the holder listing it. nil: every
	// listed flow counts.
	Seen func(f Flow) bool
	// MayHold reports whether bucket b may (still) be held back from its
	// assigned holder: false once a hold has lasted its time limit. nil:
	// any bucket may.
	MayHold func(b int) bool
}

// MaxHeld is the number of buckets one holder may keep back from their
// assigned holders when n holders share a port: an eighth of what a
// holder gives up on average when the n-th one joins (Buckets/(n(n-1))),
// so a joiner gets at least seven eighths of its buckets at once (with two
// holders each may keep back 16 buckets, with three 5, four 2, five or six
// 1, more none).
func MaxHeld(n int) int {
	if n < 2 {
		return 0
	}
	return Buckets / (8 * n * (n - 1))
}

// Plan is PlanFacts with only the holders' flows known: every flow they
// list counts and any bucket may be held.
func Plan(port uint16, holders []Holder, cur *Spread, flows FlowSource) (Spread, error) {
	return PlanFacts(port, holders, cur, Facts{Flows: flows})
}

// PlanFacts returns the spread for port with holders, moving from cur (nil
// when the port is not shared yet) towards Assign(port, holders) while
// keeping the live flows of holders that stay, as far as the bounds allow.
// A flow of a holder is live when its namespace lists it and (f.Seen) the
// host saw traffic for it lately, on a node that steers it to that holder.
//
//   - a bucket whose holder left goes to its assigned holder at once (the
//     leaver's flows break anyway), and pins of holders that left go;
//   - a bucket whose holder stays but is assigned to another holder moves,
//     its holder's live flows in it pinned to it, when they fit in the
//     bucket's room (MaxPinsPerBucket less the pins kept there). With more
//     (or when the holder's flows cannot be read) the bucket may be held
//     back: at most MaxHeld(len(holders)) buckets per holder (the most
//     crowded first; unreadable ones are not counted) and only while
//     f.MayHold allows; otherwise it moves with the lowest source ports
//     that fit pinned, and the other flows switch holder;
//   - a pin stays while its holder is still a holder, is not the holder of
//     its bucket, and has a live flow from that source port (when the
//     holder's flows cannot be read, while the host sees its traffic).
//
// f.Flows is asked only about holders that have a bucket to move or pins.
// The result depends only on holders, cur and the facts, so calling it
// again with the same inputs changes nothing.
func PlanFacts(port uint16, holders []Holder, cur *Spread, f Facts) (Spread, error) {
	want, err := AssignDraining(port, holders, f.Draining)
	if err != nil {
		return Spread{}, err
	}
	out := Spread{Buckets: want, Draining: drainingOf(holders, f.Draining)}
	if cur == nil {
		return out, nil
	}
	byslot := make(map[uint16]Holder, len(holders))
	for _, h := range holders {
		byslot[h.Slot] = h
	}
	seen := func(p Flow) bool { return f.Seen == nil || f.Seen(p) }
	type known struct {
		ports map[int][]Flow // bucket -> distinct live flows, ascending
		has   map[Flow]bool
		ok    bool
	}
	cache := map[uint16]*known{}
	live := func(slot uint16) *known {
		if k, ok := cache[slot]; ok {
			return k
		}
		k := &known{ports: map[int][]Flow{}, has: map[Flow]bool{}}
		if f.Flows != nil {
			var ps []Flow
			ps, k.ok = f.Flows(slot)
			for _, p := range ps {
				if !k.has[p] && cur.Holder(p).Slot == slot && seen(p) {
					k.has[p] = true
					b := Bucket(p.Port())
					k.ports[b] = append(k.ports[b], p)
				}
			}
			for _, ps := range k.ports {
				slices.SortFunc(ps, cmpFlow)
			}
		}
		cache[slot] = k
		return k
	}
	// Pins that may stay (if their bucket does not end at their holder).
	keep := map[Flow]Holder{}
	room := map[int]int{}
	for p, ph := range cur.Pins {
		h, stays := byslot[ph.Slot]
		if !stays {
			continue
		}
		if k := live(h.Slot); k.has[p] || !k.ok && seen(p) {
			keep[p] = h
			room[Bucket(p.Port())]--
		}
	}
	pins := map[Flow]Holder{}
	pinFirst := func(h Holder, ps []Flow, n int) {
		for _, p := range ps[:min(len(ps), max(n, 0))] {
			pins[p] = h
		}
	}
	type crowded struct {
		b, flows int
		h        Holder
		ok       bool
	}
	var crowd []crowded
	for b := range out.Buckets {
		old := cur.Buckets[b]
		h, stays := byslot[old.Slot]
		if !stays || old.Slot == want[b].Slot {
			continue
		}
		k := live(old.Slot)
		ps, fit := k.ports[b], MaxPinsPerBucket+room[b]
		if k.ok && len(ps) <= fit {
			pinFirst(h, ps, fit)
			continue
		}
		crowd = append(crowd, crowded{b: b, flows: len(ps), h: h, ok: k.ok})
	}
	slices.SortFunc(crowd, func(x, y crowded) int {
		if x.flows != y.flows {
			return y.flows - x.flows
		}
		return x.b - y.b
	})
	held, budget := map[uint16]int{}, MaxHeld(len(holders))
	for _, c := range crowd {
		// A draining holder never keeps a bucket back: new flows must
		// not reach it.
		if (f.MayHold == nil || f.MayHold(c.b)) && !f.Draining[c.h.Slot] {
			if !c.ok {
				out.Buckets[c.b] = c.h
				continue
			}
			if held[c.h.Slot] < budget {
				held[c.h.Slot]++
				out.Buckets[c.b] = c.h
				continue
			}
		}
		pinFirst(c.h, live(c.h.Slot).ports[c.b], MaxPinsPerBucket+room[c.b])
	}
	for p, h := range keep {
		pins[p] = h
	}
	for p, h := range pins {
		if out.Buckets[Bucket(p.Port())].Slot != h.Slot {
			if out.Pins == nil {
				out.Pins = map[Flow]Holder{}
			}
			out.Pins[p] = h
		}
	}
	return out, nil
}

// PinLate returns s with pins added for flows that began while s was being
// installed: for every bucket that s moved away from a holder that is still
// in holders (prev is what was there before), the holder's flows in that
// bucket (asked of flows now) that s does not pin yet and that planning s
// did not know of (before; nil: none), as long as the bucket stays within
// MaxPinsPerBucket. The flows Plan saw were read before the move; a
// connection whose first packet reached the old holder in between is
// caught here if its next packet has not arrived yet. changed reports
// whether any pin was added. Only holders that lost a bucket are asked.
func PinLate(prev, s *Spread, holders []Holder, flows FlowSource, before func(slot uint16, f Flow) bool) (next Spread, changed bool) {

	next = s.Clone()
	byslot := make(map[uint16]Holder, len(holders))
	for _, h := range holders {
		byslot[h.Slot] = h
	}
	perBucket := map[int]int{}
	for p := range next.Pins {
		perBucket[Bucket(p.Port())]++
	}
	lost := map[uint16][]int{} // slot -> buckets it lost
	for b := range s.Buckets {
		old := prev.Buckets[b]
		if _, stays := byslot[old.Slot]; stays && old.Slot != s.Buckets[b].Slot {
			lost[old.Slot] = append(lost[old.Slot], b)
		}
	}
	for _, slot := range slices.Sorted(maps.Keys(lost)) {
		ps, ok := flows(slot)
		if !ok {
			continue
		}
		moved := map[int]bool{}
		for _, b := range lost[slot] {
			moved[b] = true
		}
		for _, p := range ps {
			b := Bucket(p.Port())
			if _, pinned := next.Pins[p]; pinned || !moved[b] || perBucket[b] >= MaxPinsPerBucket || before != nil && before(slot, p) {
				continue
			}
			if next.Pins == nil {
				next.Pins = map[Flow]Holder{}
			}
			next.Pins[p] = byslot[slot]
			perBucket[b]++
			changed = true
		}
	}
	return next, changed
}
