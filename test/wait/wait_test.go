package wait

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	var n atomic.Int32
	if !Until(5*time.Second, func() bool { return n.Add(1) == 3 }) {
		t.Fatal("a condition that holds on the third poll was not seen")
	}
	start := time.Now()
	if Until(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported held")
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 5*time.Second {
		t.Errorf("gave up after %v, want the 50 ms deadline", d)
	}
	calls := 0
	if !Until(0, func() bool { calls++; return calls == 2 }) {
		t.Error("the last look after the deadline was not taken")
	}
}
