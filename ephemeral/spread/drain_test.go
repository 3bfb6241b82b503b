package spread

import (
	"net/netip"
	"testing"
)

// TestPlanDrain: a draining holder loses every bucket, keeps its live
// flows pinned (never a held bucket), and with no other holder every
// bucket goes to Refuse.
func TestPlanDrain(t *testing.T) {
	a, b := Holder{Slot: 1, Target: 11}, Holder{Slot: 2, Target: 12}
	cur, err := Plan(9000, []Holder{a}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 40 live flows of A, some crowding one bucket beyond the pin bound.
	var live []uint16
	for i := range 40 {
		live = append(live, uint16(20000+7*i))
	}
	for i := range MaxPinsPerBucket + 4 {
		live = append(live, uint16(30000+512*i)) // all in one bucket
	}
	flows := func(slot uint16) ([]Flow, bool) {
		if slot == a.Slot {
			return fls(live...), true
		}
		return nil, true
	}
	drain := map[uint16]bool{a.Slot: true}
	got, err := PlanFacts(9000, []Holder{a, b}, &cur, Facts{Flows: flows, Draining: drain})
	if err != nil {
		t.Fatal(err)
	}
	for bk, h := range got.Buckets {
		if h != b {
			t.Fatalf("bucket %d goes to %+v, want B", bk, h)
		}
	}
	if !got.Draining[a.Slot] || len(got.Draining) != 1 {
		t.Errorf("draining %v", got.Draining)
	}
	for _, p := range live[:40] {
		if got.Holder(fl(p)) != a {
			t.Errorf("live flow from %d goes to %+v, want A", p, got.Holder(fl(p)))
		}
	}
	if n := got.LivePins(a.Slot); n < 40 || n > 40+MaxPinsPerBucket {
		t.Errorf("%d pins of A, want 40 and at most %d of the crowded bucket", n, MaxPinsPerBucket)
	}
	alone, err := PlanFacts(9000, []Holder{a}, &cur, Facts{Flows: flows, Draining: drain})
	if err != nil {
		t.Fatal(err)
	}
	for bk, h := range alone.Buckets {
		if h != Refuse {
			t.Fatalf("A drains alone: bucket %d goes to %+v, want Refuse", bk, h)
		}
	}
	if alone.Holder(fl(live[0])) != a {
		t.Error("A drains alone: its live flow is not pinned")
	}
}

// TestDrainPinKeepsOnlyItsClient: a draining holder's pin keeps its
// client's flow and no other: another client from the same source port
// is a new flow and goes to the holder that does not drain.
func TestDrainPinKeepsOnlyItsClient(t *testing.T) {
	a, b := Holder{Slot: 1, Target: 101}, Holder{Slot: 2, Target: 102}
	cur, _ := Plan(9100, []Holder{a}, nil, nil)
	x := fl(40000)
	y := netip.AddrPortFrom(netip.MustParseAddr("198.18.1.77"), x.Port())
	x6 := netip.AddrPortFrom(netip.MustParseAddr("2001:db8::2"), x.Port())
	flows := func(slot uint16) ([]Flow, bool) {
		if slot == a.Slot {
			return []Flow{x, x6}, true
		}
		return nil, true
	}
	got, err := PlanFacts(9100, []Holder{a, b}, &cur, Facts{Flows: flows, Draining: map[uint16]bool{a.Slot: true}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Holder(x) != a || got.Holder(x6) != a || len(got.Pins) != 2 {
		t.Fatalf("live flows %s, %s not pinned to A: %v", x, x6, got.Pins)
	}
	if got.Holder(y) != b {
		t.Errorf("new flow %s from a pinned source port goes to %+v, want B", y, got.Holder(y))
	}
}
