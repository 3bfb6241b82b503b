package isolator

import (
	"sync"
	"testing"
)

// TestIntentBeforeThePrepareCommit: a container prepared and isolated
// while the database's writer is busy (both commits queued, its record in
// the journal only), then cleaned up or given other ports: a daemon killed
// during that step (its state as on disk when the step's intent is
// written, the kernel as the step found it) resolves the intent at its
// next start: after a cleanup nothing of the container is left in the
// kernel, unattributed or not; after an update the container is kept with
// its ports.
func TestIntentBeforeThePrepareCommit(t *testing.T) {
	for _, step := range []string{"cleanup", "update"} {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			dp := newFakeDP()
			s := newTestIsolator(t, dir, dp)
			hold := holdWriter(s)
			var once sync.Once
			release := func() { once.Do(hold) }
			defer release()
			if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
				t.Fatal(err)
			}
			killed := t.TempDir()
			dp2 := newFakeDP()
			s.SetHook(func(p string) {
				switch p {
				case "intent:wait": // the step waits for the commits: let them land
					release()
				case step + ":intent":
					copyDir(t, dir, killed)
					dp2.Plumbed["c1"] = dp.Plumbed["c1"]
					release() // an update commits its outcome before it answers
				}
			})
			var err error
			if step == "cleanup" {
				err = s.Cleanup(bg, "c1")
			} else {
				_, err = s.Update(bg, "c1", ports("31001"))
			}
			if err != nil {
				t.Fatal(err)
			}
			release()
			s.store.WaitQueued()
			s.Close()
			if _, ok := dp2.Plumbed["c1"]; !ok {
				t.Fatal("the step's intent was never written")
			}

			s2, err := New(testConfig(t, killed), dp2)
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			rep, err := s2.Start(bg)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Unattributed) > 0 || len(rep.Rebuilt) > 0 {
				t.Fatalf("c1 after a kill during its %s: unattributed %v, rebuilt from the kernel %v", step, rep.Unattributed, rep.Rebuilt)
			}
			r, err := s2.Get(bg, "c1")
			if step == "cleanup" && KindOf(err) != ErrNotFound {
				t.Fatalf("c1 after a kill during its cleanup: %+v %v", r, err)
			}
			if step == "update" && (err != nil || r.State != StateIsolated) {
				t.Fatalf("c1 after a kill during its update: %+v %v", r, err)
			}
			checkInvariants(t, s2, dp2)
		})
	}
}
