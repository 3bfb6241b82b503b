package shaping

import (
	"testing"

	"github.com/isolatord/isolatord/isolator/plane/rate"
)

func TestLimitBurstAndQueue(t *testing.T) {
	if got := (rate.Limit{Rate: 2_000_000}).EffectiveBurst(); got != 64<<10 {
		t.Errorf("default burst at 2MB/s = %d, want 64KiB", got)
	}
	if got := (rate.Limit{Rate: 100_000_000}).EffectiveBurst(); got != 1_000_000 {
		t.Errorf("default burst at 100MB/s = %d, want 10 ms = 1MB", got)
	}
	if got := (rate.Limit{Rate: 2_000_000, Burst: 5000}).EffectiveBurst(); got != 5000 {
		t.Errorf("given burst = %d, want 5000", got)
	}
	if q := QueueBytes(rate.Limit{Rate: 2_000_000}); q != 200_000 {
		t.Errorf("queue at 2MB/s = %d, want 100 ms = 200000", q)
	}
	if q := QueueBytes(rate.Limit{Rate: 100_000}); q != minQueue {
		t.Errorf("queue at 100kB/s = %d, want the floor %d", q, minQueue)
	}
	if q := QueueBytes(rate.Limit{Rate: 10_000_000_000}); q != maxQueue {
		t.Errorf("queue at 10GB/s = %d, want the ceiling %d", q, maxQueue)
	}
}
