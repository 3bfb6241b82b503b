package spread

import "testing"

// hoard gives holder slot more than MaxPinsPerBucket listed flows in every
// bucket that cur gives it.
func hoard(cur *Spread, slot uint16) []uint16 {
	var ps []uint16
	for b := range Buckets {
		if cur.Buckets[b].Slot != slot {
			continue
		}
		for i := range MaxPinsPerBucket + 4 {
			ps = append(ps, uint16(b<<1|(i+1)<<9))
		}
	}
	return ps
}

func TestMaxHeld(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 0, 2: 16, 3: 5, 4: 2, 5: 1, 6: 1, 7: 0, 256: 0} {
		if got := MaxHeld(n); got != want {
			t.Errorf("MaxHeld(%d) = %d, want %d", n, got, want)
		}
	}
}

// TestPlanHoarderUnseen: a holder listing thousands of flows the host has
// seen no traffic for keeps neither a bucket nor a pin from a joiner.
func TestPlanHoarderUnseen(t *testing.T) {
	const port = 9300
	cur, _ := Plan(port, holders(1), nil, nil)
	flows := flowsOf(map[uint16][]uint16{1: hoard(&cur, 1)}, nil)
	next, err := PlanFacts(port, holders(1, 2), &cur, Facts{Flows: flows, Seen: func(Flow) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := Assign(port, holders(1, 2))
	if !next.Settled(&want) {
		t.Fatalf("unseen flows kept %d pins and some buckets back", len(next.Pins))
	}
	// Seen only in one bucket: that bucket's flows count, no other.
	b := -1
	for i := range Buckets {
		if want[i].Slot == 2 {
			b = i
			break
		}
	}
	few := []uint16{uint16(b<<1 | 1<<9), uint16(b<<1 | 2<<9)}
	flows = flowsOf(map[uint16][]uint16{1: append(hoard(&cur, 1)[:0:0], append(few, uint16((b+1)%Buckets<<1|3<<9))...)}, nil)
	next, _ = PlanFacts(port, holders(1, 2), &cur, Facts{Flows: flows, Seen: func(p Flow) bool { return Bucket(p.Port()) == b }})
	if len(next.Pins) != 2 || next.Pins[fl(few[0])].Slot != 1 || next.Pins[fl(few[1])].Slot != 1 || next.Buckets != want {
		t.Fatalf("pins %v, settled buckets %v: want the two seen flows pinned, every bucket assigned", next.Pins, next.Buckets == want)
	}
}

// TestPlanHoarderSeen: when the host sees traffic in every bucket, a
// holder listing more flows than fit in each keeps back at most MaxHeld
// buckets, the joiner gets the rest at once (each with at most
// MaxPinsPerBucket pins), and a hold that may not last moves too.
func TestPlanHoarderSeen(t *testing.T) {
	const port = 9300
	cur, _ := Plan(port, holders(1), nil, nil)
	flows := flowsOf(map[uint16][]uint16{1: hoard(&cur, 1)}, nil)
	want, _ := Assign(port, holders(1, 2))
	due := 0
	for _, h := range want {
		if h.Slot == 2 {
			due++
		}
	}
	next, err := PlanFacts(port, holders(1, 2), &cur, Facts{Flows: flows})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, h := range next.Buckets {
		if h.Slot == 2 {
			got++
		}
	}
	if got != due-MaxHeld(2) {
		t.Errorf("joiner got %d buckets of its %d, want all but %d", got, due, MaxHeld(2))
	}
	per := map[int]int{}
	for p, h := range next.Pins {
		if h.Slot != 1 || next.Buckets[Bucket(p.Port())].Slot != 2 {
			t.Fatalf("pin %v -> %d in a bucket of %d", p, h.Slot, next.Buckets[Bucket(p.Port())].Slot)
		}
		if per[Bucket(p.Port())]++; per[Bucket(p.Port())] > MaxPinsPerBucket {
			t.Fatalf("bucket %d over the pin bound", Bucket(p.Port()))
		}
	}
	// Holds may not last: every bucket moves, pins stay bounded.
	done, _ := PlanFacts(port, holders(1, 2), &next, Facts{Flows: flows, MayHold: func(int) bool { return false }})
	if done.Buckets != want {
		t.Error("buckets held past their limit")
	}
	if len(done.Pins) > due*MaxPinsPerBucket {
		t.Errorf("%d pins", len(done.Pins))
	}
	// Unseen pins go at the next plan even though the flows are listed.
	gone, _ := PlanFacts(port, holders(1, 2), &done, Facts{Flows: flows, Seen: func(Flow) bool { return false }, MayHold: func(int) bool { return false }})
	if !gone.Settled(&want) {
		t.Errorf("%d pins left whose traffic the host did not see", len(gone.Pins))
	}
}

// TestPinLateSkipsKnown: flows the plan already knew of are not pinned
// late (Plan decided about them), new ones are.
func TestPinLateSkipsKnown(t *testing.T) {
	const port = 9300
	prev, _ := Plan(port, holders(1), nil, nil)
	plan, _ := Plan(port, holders(1, 2), &prev, flowsOf(map[uint16][]uint16{1: nil}, nil))
	var old, fresh uint16
	for p := uint16(20000); fresh == 0; p += 2 {
		if plan.Buckets[Bucket(p)].Slot == 2 {
			if old == 0 {
				old = p
			} else {
				fresh = p
			}
		}
	}
	next, changed := PinLate(&prev, &plan, holders(1, 2), flowsOf(map[uint16][]uint16{1: {old, fresh}}, nil),
		func(slot uint16, p Flow) bool { return slot == 1 && p == fl(old) })
	if !changed || len(next.Pins) != 1 || next.Pins[fl(fresh)].Slot != 1 {
		t.Fatalf("pins %v: want only the late flow %d", next.Pins, fresh)
	}
}
