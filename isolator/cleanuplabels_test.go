package isolator

import (
	"context"
	"testing"
)

// TestCleanupIfLabeled: a container lacking a required label is kept and
// unchanged; one carrying them all is removed; an unknown one is no error.
func TestCleanupIfLabeled(t *testing.T) {
	ctx := context.Background()
	s := newTestIsolator(t, t.TempDir(), newFakeDP())
	if _, err := s.PrepareWith(ctx, "c1", PrepareOptions{Ports: ports("31001"), Labels: map[string]string{"net": "a", "if": "eth0"}}); err != nil {
		t.Fatal(err)
	}
	kept, err := s.CleanupIfLabeled(ctx, "c1", map[string]string{"net": "b"})
	if err != nil || !kept {
		t.Fatalf("other network's labels: kept=%v err=%v, want kept", kept, err)
	}
	if _, err := s.Get(ctx, "c1"); err != nil {
		t.Fatalf("kept container gone: %v", err)
	}
	kept, err = s.CleanupIfLabeled(ctx, "c1", map[string]string{"net": "a"})
	if err != nil || kept {
		t.Fatalf("own labels: kept=%v err=%v, want removed", kept, err)
	}
	if _, err := s.Get(ctx, "c1"); KindOf(err) != ErrNotFound {
		t.Fatalf("removed container: Get err=%v, want not found", err)
	}
	if kept, err := s.CleanupIfLabeled(ctx, "c1", map[string]string{"net": "a"}); err != nil || kept {
		t.Fatalf("unknown container: kept=%v err=%v", kept, err)
	}
	// The port is free again.
	if _, err := s.PrepareWith(ctx, "c2", PrepareOptions{Ports: ports("31001")}); err != nil {
		t.Fatalf("port not released: %v", err)
	}
}
