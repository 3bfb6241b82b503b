package rate

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
