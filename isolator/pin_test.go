package isolator

import (
	"testing"

	"github.com/isolatord/isolatord/isolator/store"
)

// TestStorePinOwned: pin ownership survives the store.
func TestStorePinOwned(t *testing.T) {
	s, err := store.Open[Record](t.TempDir(), quietLogger(), validateID)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, r := range []*Record{
		{ID: "theirs", State: StateIsolated, Mount: "/var/run/netns/theirs", PinOwned: false},
		{ID: "ours", State: StateIsolated, Mount: "/var/run/netns/ours@isolatord", PinOwned: true},
	} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"theirs": false, "ours": true}
	if len(rs) != len(want) {
		t.Fatalf("loaded %d records", len(rs))
	}
	for _, r := range rs {
		if r.PinOwned != want[r.ID] {
			t.Errorf("%s: PinOwned %v, want %v", r.ID, r.PinOwned, want[r.ID])
		}
	}
}

// TestCrashKeepsPinOwnership: the isolate intent records where the pin
// will be and whose it is, so a daemon killed before the outcome is
// written tears down (or keeps) the container knowing that a runtime's pin
// is not its own, and a later cleanup knows it too.
func TestCrashKeepsPinOwnership(t *testing.T) {
	for _, point := range []string{"isolate:intent", "isolate:plumbed"} {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			dp := newFakeDP()
			dp.ForeignPins = map[string]bool{"c1": true}
			s := newTestIsolator(t, dir, dp)
			if _, err := s.Prepare(bg, "c1", ports("31001")); err != nil {
				t.Fatal(err)
			}
			s.SetHook(func(p string) {
				if p == point {
					panic(crash{p})
				}
			})
			func() {
				defer func() { recover() }()
				_, _ = s.Isolate(bg, "c1", nsTarget(t, "c1"))
			}()
			s.Close()

			s2 := newTestIsolator(t, dir, dp)
			if r, err := s2.Get(bg, "c1"); err == nil && r.State == StateIsolated && (r.PinOwned || r.Mount != dp.MountPath("c1")) {
				t.Errorf("recovered record: mount %s owned %v, want the runtime's pin %s", r.Mount, r.PinOwned, dp.MountPath("c1"))
			}
			if err := s2.Cleanup(bg, "c1"); err != nil {
				t.Fatal(err)
			}
			if len(dp.TornDown) == 0 {
				t.Fatal("never torn down")
			}
			for _, c := range dp.TornDown {
				if c.PinOwned || c.Pin != dp.MountPath("c1") {
					t.Errorf("teardown given pin %q owned %v, want the runtime's %s, not owned", c.Pin, c.PinOwned, dp.MountPath("c1"))
				}
			}
		})
	}
}
