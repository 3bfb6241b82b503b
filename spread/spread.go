package spread

import (
	"errors"
	"fmt"
	"maps"
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

// Spread is how a shared port's flows are steered. Each of the
// Buckets virtual buckets (Bucket of the client's source port)
// goes to one holder; a pinned source port goes to its pin's holder
// whatever its bucket. Pins keep established flows on the holder that has
// their sockets while their bucket moves to another holder (see Plan).
type Spread struct {
	Buckets [Buckets]Holder
	Pins    map[uint16]Holder // client source port -> holder
}

// Holder returns where a packet from client source port srcPort goes.
func (s *Spread) Holder(srcPort uint16) Holder {
	if h, ok := s.Pins[srcPort]; ok {
		return h
	}
	return s.Buckets[Bucket(srcPort)]
}

// Equal reports whether s and o steer every source port the same way.
func (s *Spread) Equal(o *Spread) bool {
	return s.Buckets == o.Buckets && maps.Equal(s.Pins, o.Pins)
}

// Clone returns a deep copy of s.
func (s *Spread) Clone() Spread {
	return Spread{Buckets: s.Buckets, Pins: maps.Clone(s.Pins)}
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
// namespace: the client (remote) source ports of its connected sockets on
// the port. ok is false when they could not be read.
type FlowSource func(slot uint16) (srcPorts []uint16, ok bool)

// Plan returns the spread for port with holders, moving from cur (nil
// when the port is not shared yet) towards Assign(port, holders) without
// breaking a live flow of a holder that stays:
//
//   - a bucket whose holder left goes to its assigned holder at once (the
//     leaver's flows break anyway), and pins of holders that left go;
//   - a bucket whose holder stays but is assigned to another holder moves
//     if its holder has no live flow in it; if it has at most
//     MaxPinsPerBucket distinct source ports there, the bucket moves and
//     those ports are pinned to its holder; with more, the bucket stays
//     (a later call moves it as its flows end);
//   - a pin stays while its holder is still a holder, is not the holder of
//     its bucket, and has a live flow from that source port.
//
// flows is asked only about holders that have a bucket to move or pins;
// when it cannot tell (ok false), that holder keeps its buckets and pins.
// The result depends only on holders, cur and the flows, so calling it
// again with the same inputs changes nothing.
func Plan(port uint16, holders []Holder, cur *Spread, flows FlowSource) (Spread, error) {
	want, err := Assign(port, holders)
	if err != nil {
		return Spread{}, err
	}
	out := Spread{Buckets: want}
	if cur == nil {
		return out, nil
	}
	byslot := make(map[uint16]Holder, len(holders))
	for _, h := range holders {
		byslot[h.Slot] = h
	}
	type known struct {
		ports map[int][]uint16 // bucket -> distinct source ports
		has   map[uint16]bool
		ok    bool
	}
	cache := map[uint16]*known{}
	live := func(slot uint16) *known {
		if k, ok := cache[slot]; ok {
			return k
		}
		k := &known{ports: map[int][]uint16{}, has: map[uint16]bool{}}
		if flows != nil {
			var ps []uint16
			ps, k.ok = flows(slot)
			for _, p := range ps {
				if !k.has[p] {
					k.has[p] = true
					b := Bucket(p)
					k.ports[b] = append(k.ports[b], p)
				}
			}
		}
		cache[slot] = k
		return k
	}
	pins := map[uint16]Holder{}
	for b := range out.Buckets {
		old := cur.Buckets[b]
		h, stays := byslot[old.Slot]
		if !stays || old.Slot == want[b].Slot {
			continue
		}
		k := live(old.Slot)
		switch ps := k.ports[b]; {
		case !k.ok || len(ps) > MaxPinsPerBucket:
			out.Buckets[b] = h
		default:
			for _, p := range ps {
				pins[p] = h
			}
		}
	}
	for p, ph := range cur.Pins {
		h, stays := byslot[ph.Slot]
		if !stays || out.Buckets[Bucket(p)].Slot == h.Slot {
			continue
		}
		if k := live(h.Slot); !k.ok || k.has[p] {
			pins[p] = h
		}
	}
	// A bucket never carries more than MaxPinsPerBucket pins: if the pins
	// kept from before and those of a bucket moving now exceed it, the
	// bucket stays with its holder this time (whose new pins then go; the
	// kept ones were within the bound already).
	perBucket := map[int]int{}
	for p, h := range pins {
		if b := Bucket(p); out.Buckets[b].Slot != h.Slot {
			perBucket[b]++
		}
	}
	for b, n := range perBucket {
		if old := cur.Buckets[b]; n > MaxPinsPerBucket {
			if h, stays := byslot[old.Slot]; stays {
				out.Buckets[b] = h
			}
		}
	}
	for p, h := range pins {
		if out.Buckets[Bucket(p)].Slot != h.Slot {
			if out.Pins == nil {
				out.Pins = map[uint16]Holder{}
			}
			out.Pins[p] = h
		}
	}
	return out, nil
}

// PinLate returns s with pins added for flows that began while s was being
// installed: for every bucket that s moved away from a holder that is still
// in holders (prev is what was there before), the holder's flows in that
// bucket (asked of flows now) that s does not pin yet, as long as the
// bucket stays within MaxPinsPerBucket. The flows Plan saw were read
// before the move; a connection whose first packet reached the old holder
// in between is caught here if its next packet has not arrived yet. changed
// reports whether any pin was added. Only holders that lost a bucket are
// asked.
func PinLate(prev, s *Spread, holders []Holder, flows FlowSource) (next Spread, changed bool) {
	next = s.Clone()
	byslot := make(map[uint16]Holder, len(holders))
	for _, h := range holders {
		byslot[h.Slot] = h
	}
	perBucket := map[int]int{}
	for p := range next.Pins {
		perBucket[Bucket(p)]++
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
			b := Bucket(p)
			if _, pinned := next.Pins[p]; pinned || !moved[b] || perBucket[b] >= MaxPinsPerBucket {
				continue
			}
			if next.Pins == nil {
				next.Pins = map[uint16]Holder{}
			}
			next.Pins[p] = byslot[slot]
			perBucket[b]++
			changed = true
		}
	}
	return next, changed
}
