package neighsync

import (
	"testing"
	"time"
)

// TestBudget: a container may spend its burst of reader time at once (each
// request costing minRequestCost at least), then what budgetRate refills.
func TestBudget(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newBudget(t0)
	served := 0
	for range 10_000 {
		if !b.ok(t0) {
			break
		}
		b.charge(time.Microsecond) // cheap: minRequestCost counts
		served++
	}
	if want := int(budgetBurst / minRequestCost); served != want {
		t.Errorf("%d cheap requests served at once, want %d", served, want)
	}
	if !b.ok(t0.Add(time.Second)) {
		t.Fatal("nothing refilled after a second")
	}
	b.charge(time.Second) // one slow request: in debt for 20 s (budgetRate 5%)
	if b.ok(t0.Add(10 * time.Second)) {
		t.Error("served 9 s after a request that cost the reader a second")
	}
	if !b.ok(t0.Add(25 * time.Second)) {
		t.Error("not served 24 s after it")
	}
	if b.ok(t0.Add(time.Hour)); b.left != budgetBurst {
		t.Errorf("after an hour %v saved up, want the burst %v", b.left, budgetBurst)
	}
}
