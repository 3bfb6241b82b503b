package rate

import (
	"errors"
	"fmt"
	"math"
)

// Bounds of a Limit.
const (
	MinRate      = 1000 // bytes/s (8 kbit/s); below, one packet takes > 1 s
	MinBurst     = 2048 // bytes: at least one full-size frame
	MaxBurstTime = 60   // seconds of traffic at the rate a burst may hold
	maxRate      = math.MaxInt64
	defBurstMin  = 64 << 10 // bytes: default burst floor
	defBurstTime = 100      // default burst = rate / defBurstTime (10 ms)
)

// ErrBadLimit wraps every invalid Limit.
var ErrBadLimit = errors.New("invalid bandwidth limit")

// Limit is a bandwidth limit in one direction. The zero Limit means none.
type Limit struct {
	Rate  uint64 `json:"rate"`            // sustained bytes per second; 0 = no limit
	Burst uint64 `json:"burst,omitempty"` // bytes allowed above the rate after an idle time; 0 = DefaultBurst(Rate)
	Ceil  uint64 `json:"ceil,omitempty"`  // peak bytes per second while bursting; 0 = no peak limit (line speed)
}

// IsZero reports whether l is "no limit".
func (l Limit) IsZero() bool { return l == Limit{} }

// DefaultBurst is the burst of a limit that gives none: 10 ms at the rate,
// at least 64 KiB (or one second at rates below 64 KiB/s, at least
// MinBurst).
func DefaultBurst(rate uint64) uint64 {
	return max(rate/defBurstTime, min(defBurstMin, max(rate, MinBurst)))
}

// EffectiveBurst is the burst in force: l.Burst or DefaultBurst(l.Rate).
func (l Limit) EffectiveBurst() uint64 {
	if l.Burst != 0 {
		return l.Burst
	}
	return DefaultBurst(l.Rate)
}

// Validate checks l (the zero Limit is valid: no limit).
func (l Limit) Validate() error {
	switch {
	case l.IsZero():
		return nil
	case l.Rate == 0:
		return fmt.Errorf("%w: burst or ceil given without a rate", ErrBadLimit)
	case l.Rate < MinRate:
		return fmt.Errorf("%w: rate %d bytes/s is below the minimum of %d bytes/s", ErrBadLimit, l.Rate, MinRate)
	case l.Rate > maxRate || l.Ceil > maxRate || l.Burst > maxRate:
		return fmt.Errorf("%w: value too large", ErrBadLimit)
	case l.Ceil != 0 && l.Ceil < l.Rate:
		return fmt.Errorf("%w: ceil %d bytes/s is below the rate %d bytes/s", ErrBadLimit, l.Ceil, l.Rate)
	case l.Burst != 0 && l.Burst < MinBurst:
		return fmt.Errorf("%w: burst %d bytes is below the minimum of %d bytes", ErrBadLimit, l.Burst, MinBurst)
	case float64(l.EffectiveBurst())/float64(l.Rate) > MaxBurstTime:
		return fmt.Errorf("%w: burst %d bytes is more than %d s of traffic at %d bytes/s", ErrBadLimit, l.Burst, MaxBurstTime, l.Rate)
	}
	return nil
}
