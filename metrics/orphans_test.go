package metrics

import "testing"

// TestOrphansReclaimed: the counter exists at zero and counts each
// reclaimed orphan.
func TestOrphansReclaimed(t *testing.T) {
	m := New("test")
	if v := scrape(t, m.Handler()).value(t, "isolatord_orphans_reclaimed_total"); v != 0 {
		t.Fatalf("before any reclamation: %v", v)
	}
	m.OrphanReclaimed("c1")
	m.OrphanReclaimed("c2")
	if v := scrape(t, m.Handler()).value(t, "isolatord_orphans_reclaimed_total"); v != 2 {
		t.Errorf("after two: %v", v)
	}
}
