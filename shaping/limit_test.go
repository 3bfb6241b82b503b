package shaping

import (
	"errors"
	"testing"
)

func TestLimitValidate(t *testing.T) {
	for _, c := range []struct {
		l  Limit
		ok bool
	}{
		{Limit{}, true},
		{Limit{Rate: 2_000_000}, true},
		{Limit{Rate: 2_000_000, Ceil: 4_000_000, Burst: 100_000}, true},
		{Limit{Rate: 2_000_000, Ceil: 2_000_000}, true},
		{Limit{Rate: MinRate}, true},
		{Limit{Rate: MinRate - 1}, false},
		{Limit{Burst: 10000}, false},
		{Limit{Ceil: 10000}, false},
		{Limit{Rate: 2_000_000, Ceil: 1_000_000}, false},
		{Limit{Rate: 2_000_000, Burst: 100}, false},
		{Limit{Rate: 1000, Burst: 61_000}, false},
		{Limit{Rate: 1 << 32}, true},
		{Limit{Rate: 1 << 33, Ceil: 1 << 34}, true},
		{Limit{Rate: 1000, Burst: 60_000}, true},
		{Limit{Rate: 1 << 63}, false},
	} {
		err := c.l.Validate()
		if (err == nil) != c.ok {
			t.Errorf("%+v.Validate() = %v, want ok=%v", c.l, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrBadLimit) {
			t.Errorf("%+v: %v does not wrap ErrBadLimit", c.l, err)
		}
	}
}

func TestLimitBurstAndQueue(t *testing.T) {
	if got := (Limit{Rate: 2_000_000}).EffectiveBurst(); got != 64<<10 {
		t.Errorf("default burst at 2MB/s = %d, want 64KiB", got)
	}
	if got := (Limit{Rate: 100_000_000}).EffectiveBurst(); got != 1_000_000 {
		t.Errorf("default burst at 100MB/s = %d, want 10 ms = 1MB", got)
	}
	if got := (Limit{Rate: 2_000_000, Burst: 5000}).EffectiveBurst(); got != 5000 {
		t.Errorf("given burst = %d, want 5000", got)
	}
	if q := (Limit{Rate: 2_000_000}).QueueBytes(); q != 200_000 {
		t.Errorf("queue at 2MB/s = %d, want 100 ms = 200000", q)
	}
	if q := (Limit{Rate: 100_000}).QueueBytes(); q != minQueue {
		t.Errorf("queue at 100kB/s = %d, want the floor %d", q, minQueue)
	}
	if q := (Limit{Rate: 10_000_000_000}).QueueBytes(); q != maxQueue {
		t.Errorf("queue at 10GB/s = %d, want the ceiling %d", q, maxQueue)
	}
}
