package isolator

import (
	"context"
	"testing"
)

// TestIsolateIfLabeled: a container carrying the labels is isolated (was
// false, then true on the repeat); one lacking them is not and stays as it
// was; one replaced after its Prepare, before IsolateIfLabeled takes its
// lock (another caller's Cleanup and Prepare for another network), is
// found under the lock and left prepared.
func TestIsolateIfLabeled(t *testing.T) {
	ctx := context.Background()
	s := newTestIsolator(t, t.TempDir(), newFakeDP())
	mine, other := map[string]string{"net": "a"}, map[string]string{"net": "b"}
	if _, err := s.PrepareWith(ctx, "c1", PrepareOptions{Ports: ports("31001"), Labels: mine}); err != nil {
		t.Fatal(err)
	}
	r, differ, was, err := s.IsolateIfLabeled(ctx, "c1", other, self())
	if err != nil || !differ || was || r.State != StatePrepared {
		t.Fatalf("other labels: state %s differ=%v was=%v err=%v, want prepared, differ", r.State, differ, was, err)
	}
	r, differ, was, err = s.IsolateIfLabeled(ctx, "c1", mine, self())
	if err != nil || differ || was || r.State != StateIsolated {
		t.Fatalf("own labels: state %s differ=%v was=%v err=%v, want isolated", r.State, differ, was, err)
	}
	if _, differ, was, err = s.IsolateIfLabeled(ctx, "c1", mine, self()); err != nil || differ || !was {
		t.Fatalf("repeat: differ=%v was=%v err=%v, want was", differ, was, err)
	}

	if _, err := s.PrepareWith(ctx, "c2", PrepareOptions{Ports: ports("31002"), Labels: mine}); err != nil {
		t.Fatal(err)
	}
	replaced := false
	s.SetHook(func(p string) {
		if p != "isolate:lock" || replaced {
			return
		}
		replaced = true
		if err := s.Cleanup(ctx, "c2"); err != nil {
			t.Error(err)
		}
		if _, err := s.PrepareWith(ctx, "c2", PrepareOptions{Ports: ports("31003"), Labels: other}); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { s.SetHook(nil) })
	r, differ, _, err = s.IsolateIfLabeled(ctx, "c2", mine, IsolateTarget{Pid: 1})
	if !replaced || err != nil || !differ || r.State != StatePrepared || r.Labels["net"] != "b" {
		t.Fatalf("replaced before the lock: %+v differ=%v err=%v, want the replacement, prepared, differ", r, differ, err)
	}
	if g, err := s.Get(ctx, "c2"); err != nil || g.State != StatePrepared {
		t.Fatalf("the replacement: %+v, %v; want prepared", g, err)
	}
}
