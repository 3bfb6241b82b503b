package spread

import (
	"math/rand"
	"net/netip"
	"slices"
	"testing"
)

func holders(slots ...uint16) []Holder {
	var out []Holder
	for _, s := range slots {
		out = append(out, Holder{Slot: s, Target: int(s) + 100})
	}
	return out
}

// flowsOf returns a FlowSource from a fixed map of slot -> source ports
// (slots missing from known are unreadable) and records who was asked.
func flowsOf(known map[uint16][]uint16, asked map[uint16]int) FlowSource {
	return func(slot uint16) ([]Flow, bool) {
		if asked != nil {
			asked[slot]++
		}
		ps, ok := known[slot]
		return fls(ps...), ok
	}
}

// client is the address of the tests' flows that give only a source port.
var client = netip.MustParseAddr("198.18.0.1")

// fl is the flow from client's source port p.
func fl(p uint16) Flow { return netip.AddrPortFrom(client, p) }

func fls(ps ...uint16) []Flow {
	var out []Flow
	for _, p := range ps {
		out = append(out, fl(p))
	}
	return out
}

func TestBucket(t *testing.T) {
	// bit 0 is ignored, bits 1..8 pick the bucket, higher bits do not matter
	for _, c := range []struct {
		port uint16
		want int
	}{{0, 0}, {1, 0}, {2, 1}, {3, 1}, {510, 255}, {511, 255}, {512, 0}, {40000, (40000 >> 1) & 255}, {65535, 255}} {
		if got := Bucket(c.port); got != c.want {
			t.Errorf("Bucket(%d) = %d, want %d", c.port, got, c.want)
		}
	}
}

func TestPlanJoinKeepsFlows(t *testing.T) {
	const port = 31000
	cur, err := Plan(port, holders(1, 2, 3), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want3, _ := Assign(port, holders(1, 2, 3))
	if !cur.Settled(&want3) {
		t.Fatal("a new shared port is not the consistent assignment")
	}
	want4, _ := Assign(port, holders(1, 2, 3, 4))
	// Each holder has one flow in every bucket it serves, plus a crowd of
	// more than MaxPinsPerBucket flows in one bucket that moves to 4.
	known := map[uint16][]uint16{}
	crowd := -1
	for b := range Buckets {
		h := cur.Buckets[b].Slot
		known[h] = append(known[h], uint16(b<<1|1024))
		if crowd < 0 && want4[b].Slot == 4 && h == 1 {
			crowd = b
			for i := range MaxPinsPerBucket + 1 {
				known[1] = append(known[1], uint16(b<<1|(i+10)<<9))
			}
		}
	}
	delete(known, 2) // slot 2's flows cannot be read
	asked := map[uint16]int{}
	next, err := Plan(port, holders(1, 2, 3, 4), &cur, flowsOf(known, asked))
	if err != nil {
		t.Fatal(err)
	}
	if asked[4] != 0 || asked[1] != 1 || asked[3] != 1 {
		t.Errorf("flows asked %v: want holders 1 and 3 once, never the newcomer", asked)
	}
	moved, stayed := 0, 0
	for b := range Buckets {
		old, now := cur.Buckets[b], next.Buckets[b]
		switch {
		case want4[b].Slot != 4:
			if now != old {
				t.Errorf("bucket %d not assigned to the newcomer moved from %d to %d", b, old.Slot, now.Slot)
			}
		case old.Slot == 2 || b == crowd:
			if now != old {
				t.Errorf("bucket %d (holder %d unreadable or crowded) moved to %d", b, old.Slot, now.Slot)
			}
			stayed++
		default:
			if now.Slot != 4 {
				t.Errorf("bucket %d assigned to the newcomer stayed with %d", b, old.Slot)
			}
			moved++
		}
	}
	if moved == 0 || stayed == 0 {
		t.Fatalf("moved %d buckets, kept %d: the scenario does not test both", moved, stayed)
	}
	// Every flow still reaches its holder; pins only where needed.
	for slot, ps := range known {
		for _, p := range ps {
			if got := next.Holder(fl(p)); got.Slot != slot {
				t.Errorf("flow from port %d of holder %d now goes to %d", p, slot, got.Slot)
			}
		}
	}
	for p, h := range next.Pins {
		if next.Buckets[Bucket(p.Port())].Slot == h.Slot {
			t.Errorf("useless pin %v -> %d", p, h.Slot)
		}
	}
	if len(next.Pins) != moved {
		t.Errorf("%d pins for %d moved buckets with one flow each", len(next.Pins), moved)
	}
	// Same inputs, same plan: nothing to do.
	again, _ := Plan(port, holders(1, 2, 3, 4), &next, flowsOf(known, nil))
	if !again.Equal(&next) {
		t.Error("planning twice with the same flows changed the spread")
	}
	// The flows end and slot 2 becomes readable: the reconciler's next plan
	// is the consistent assignment.
	done, _ := Plan(port, holders(1, 2, 3, 4), &next, flowsOf(map[uint16][]uint16{1: nil, 2: nil, 3: nil, 4: nil}, nil))
	if !done.Settled(&want4) {
		t.Errorf("with no flows left the spread is not settled: %d pins", len(done.Pins))
	}
}

func TestPlanLeave(t *testing.T) {
	const port = 8443
	want4, _ := Assign(port, holders(1, 2, 3, 4))
	cur := Spread{Buckets: want4, Pins: map[Flow]Holder{}}
	// pins of 2 and 3 from an earlier join, in buckets now held by others
	var pin2, pin3 uint16
	for p := uint16(1000); pin2 == 0 || pin3 == 0; p += 2 {
		switch h := want4[Bucket(p)].Slot; {
		case pin2 == 0 && h != 2:
			pin2 = p
			cur.Pins[fl(p)] = Holder{2, 102}
		case pin3 == 0 && h != 3 && h != 2 && p != pin2:
			pin3 = p
			cur.Pins[fl(p)] = Holder{3, 103}
		}
	}
	flows := map[uint16][]uint16{1: nil, 3: {pin3}, 4: nil}
	next, err := Plan(port, holders(1, 3, 4), &cur, flowsOf(flows, nil))
	if err != nil {
		t.Fatal(err)
	}
	want3, _ := Assign(port, holders(1, 3, 4))
	for b := range Buckets {
		if cur.Buckets[b].Slot != 2 && next.Buckets[b] != cur.Buckets[b] {
			t.Errorf("bucket %d of staying holder %d moved", b, cur.Buckets[b].Slot)
		}
		if cur.Buckets[b].Slot == 2 && next.Buckets[b] != want3[b] {
			t.Errorf("leaver's bucket %d went to %d, want %d", b, next.Buckets[b].Slot, want3[b].Slot)
		}
	}
	if _, ok := next.Pins[fl(pin2)]; ok {
		t.Error("the leaver's pin survived")
	}
	if h, ok := next.Pins[fl(pin3)]; !ok || h.Slot != 3 {
		t.Errorf("a staying holder's pin with a live flow went: %v", next.Pins)
	}
}

// TestPlanRandom checks the invariant on random histories: after any
// join or leave, every live flow of a holder that stays still reaches it,
// no bucket carries more than MaxPinsPerBucket pins, and once the flows end
// one more plan is the consistent assignment.
func TestPlanRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 300; round++ {
		port := uint16(rng.Intn(65535) + 1)
		members := []uint16{}
		for s := uint16(1); len(members) < 1+rng.Intn(6); s++ {
			if rng.Intn(2) == 0 {
				members = append(members, s)
			}
		}
		cur, _ := Plan(port, holders(members...), nil, nil)
		flows := map[uint16][]uint16{}
		for step := 0; step < 6; step++ {
			// new flows land where the spread sends them
			for i := 0; i < rng.Intn(400); i++ {
				p := uint16(rng.Intn(65536))
				h := cur.Holder(fl(p)).Slot
				flows[h] = append(flows[h], p)
			}
			// some flows end
			for s, ps := range flows {
				flows[s] = slices.DeleteFunc(ps, func(uint16) bool { return rng.Intn(3) == 0 })
			}
			next := slices.Clone(members)
			if len(next) > 1 && rng.Intn(2) == 0 {
				i := rng.Intn(len(next))
				delete(flows, next[i])
				next = slices.Delete(next, i, i+1)
			} else if s := 20 + uint16(rng.Intn(500)); len(next) < 12 && !slices.Contains(next, s) {
				next = append(next, s)
			}
			plan, err := Plan(port, holders(next...), &cur, flowsOf(flows, nil))
			if err != nil {
				t.Fatal(err)
			}
			for s, ps := range flows {
				for _, p := range ps {
					if got := plan.Holder(fl(p)).Slot; got != s {
						t.Fatalf("round %d step %d: flow %d of holder %d moved to %d", round, step, p, s, got)
					}
				}
			}
			per := map[int]int{}
			for p := range plan.Pins {
				if per[Bucket(p.Port())]++; per[Bucket(p.Port())] > MaxPinsPerBucket {
					t.Fatalf("bucket %d has more than %d pins", Bucket(p.Port()), MaxPinsPerBucket)
				}
			}
			cur, members = plan, next
		}
		none := map[uint16][]uint16{}
		for _, s := range members {
			none[s] = nil
		}
		final, _ := Plan(port, holders(members...), &cur, flowsOf(none, nil))
		want, _ := Assign(port, holders(members...))
		if !final.Settled(&want) {
			t.Fatalf("round %d: no flows left but the spread is not settled", round)
		}
	}
}

func TestPinLate(t *testing.T) {
	const port = 31000
	prev, _ := Plan(port, holders(1, 2), nil, nil)
	// 3 joins with no flows seen: its buckets move without pins.
	plan, _ := Plan(port, holders(1, 2, 3), &prev, flowsOf(map[uint16][]uint16{1: nil, 2: nil}, nil))
	var late, stay uint16 // a flow of 1 in a moved bucket, and one in a kept bucket
	for p := uint16(2000); late == 0 || stay == 0; p += 2 {
		switch {
		case late == 0 && prev.Buckets[Bucket(p)].Slot == 1 && plan.Buckets[Bucket(p)].Slot == 3:
			late = p
		case stay == 0 && plan.Buckets[Bucket(p)].Slot == 1:
			stay = p
		}
	}
	asked := map[uint16]int{}
	next, changed := PinLate(&prev, &plan, holders(1, 2, 3), flowsOf(map[uint16][]uint16{1: {late, stay}, 2: nil}, asked), nil)
	if !changed || next.Pins[fl(late)].Slot != 1 || len(next.Pins) != 1 {
		t.Fatalf("late flow %d not pinned alone: %v", late, next.Pins)
	}
	if asked[3] != 0 || asked[1] != 1 {
		t.Errorf("asked %v: only holders that lost buckets, once", asked)
	}
	if len(plan.Pins) != 0 {
		t.Error("PinLate changed its input")
	}
	if _, changed := PinLate(&prev, &next, holders(1, 2, 3), flowsOf(map[uint16][]uint16{1: {late, stay}, 2: nil}, nil), nil); changed {
		t.Error("a second PinLate with the same flows changed something")
	}
	// A holder that left is not asked; its buckets do not count as lost.
	gone, _ := Plan(port, holders(2, 3), &next, flowsOf(map[uint16][]uint16{2: nil, 3: nil}, nil))
	asked = map[uint16]int{}
	if _, changed := PinLate(&next, &gone, holders(2, 3), flowsOf(map[uint16][]uint16{2: nil, 3: nil}, asked), nil); changed || asked[1] != 0 {
		t.Errorf("leaver asked or pinned: %v", asked)
	}
	// The bound per bucket holds.
	b := Bucket(late)
	var many []uint16
	for i := 0; i < 2*MaxPinsPerBucket; i++ {
		many = append(many, uint16(b<<1|(i+1)<<9))
	}
	full, _ := PinLate(&prev, &plan, holders(1, 2, 3), flowsOf(map[uint16][]uint16{1: many, 2: nil}, nil), nil)
	if len(full.Pins) != MaxPinsPerBucket {
		t.Errorf("%d pins in one bucket, want the bound %d", len(full.Pins), MaxPinsPerBucket)
	}
}
