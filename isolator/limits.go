package isolator

// Bandwidth limits. Every container has an egress limit (what it sends) and
// an ingress limit (what it receives), each a rate in bytes per second with
// an optional burst and ceil; zero means none. Prepare takes the daemon's
// defaults (Config.Egress, Config.Ingress) unless the request gives its own;
// the limits in force are persisted in the Record, so a restarted daemon
// keeps them (the data plane's Adopt leaves the kernel alone when it already
// enforces them) even if the defaults changed since. Update changes them on
// a running container in place (see the data plane's SetLimits). Limits are
// refused, naming the field, when negative, below rate.MinRate, above
// the host interface's link speed (when the driver reports one), with a
// ceil below the rate, a burst without a rate, or when the kernel has no
// HTB.

import (
	"fmt"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
)

// LimitSpec is a requested bandwidth limit as it arrives from the API:
// bytes per second (Rate, Ceil) and bytes (Burst), signed so that a
// negative value reaches validation and is refused by name. Rate 0 means no
// limit; Burst 0 the default; Ceil 0 no peak limit.
type LimitSpec struct {
	Rate, Burst, Ceil int64
}

// bytesPerSec prints a rate for messages: "2000000 bytes/s (2MB/s, 16Mbit/s)".
func bytesPerSec(v uint64) string {
	return fmt.Sprintf("%d bytes/s (%s, %s)", v, rate.Format(v), rate.FormatBits(v))
}

// LimitString prints a limit for people: "none", "2MB/s", "2MB/s burst
// 64KiB ceil 4MB/s".
func LimitString(l rate.Limit) string {
	if l.IsZero() {
		return "none"
	}
	s := rate.Format(l.Rate)
	if l.Burst != 0 {
		s += " burst " + rate.FormatSize(l.Burst)
	}
	if l.Ceil != 0 {
		s += " ceil " + rate.Format(l.Ceil)
	}
	return s
}

// checkLimit validates l for field (e.g. "egress_limit") against the host:
// its link speed (Mbit/s, 0 = unknown) and whether it has HTB.
func checkLimit(field string, l rate.Limit, host plane.HostInfo) error {
	if l.IsZero() {
		return nil
	}
	speed := host.LinkSpeedBytes()
	iface := host.Eth0
	if iface == "" {
		iface = "the host interface"
	}
	switch {
	case l.Rate == 0:
		return errorf(ErrInvalidArgument, "%s: burst and ceil need a rate (rate 0 means no limit)", field)
	case l.Rate < rate.MinRate:
		return errorf(ErrInvalidArgument, "%s.rate: %s is below the minimum of %s", field, bytesPerSec(l.Rate), bytesPerSec(rate.MinRate))
	case speed > 0 && l.Rate > speed:
		return errorf(ErrInvalidArgument, "%s.rate: %s is above %s's link speed of %d Mbit/s (%s)", field, bytesPerSec(l.Rate), iface, host.LinkSpeed, rate.Format(speed))
	case l.Ceil != 0 && l.Ceil < l.Rate:
		return errorf(ErrInvalidArgument, "%s.ceil: %s is below the rate, %s", field, bytesPerSec(l.Ceil), bytesPerSec(l.Rate))
	case speed > 0 && l.Ceil > speed:
		return errorf(ErrInvalidArgument, "%s.ceil: %s is above %s's link speed of %d Mbit/s (%s)", field, bytesPerSec(l.Ceil), iface, host.LinkSpeed, rate.Format(speed))
	case l.Burst != 0 && l.Burst < rate.MinBurst:
		return errorf(ErrInvalidArgument, "%s.burst: %d bytes is below the minimum of %d bytes", field, l.Burst, rate.MinBurst)
	}
	if err := l.Validate(); err != nil {
		return errorf(ErrInvalidArgument, "%s: %v", field, err)
	}
	if host.Features != nil && !host.Features[plane.FeatureHTB] {
		return errorf(ErrFailedPrecondition, "%s: %v", field, plane.ErrNoHTB)
	}
	return nil
}

// ParseLimit validates a requested limit for field (e.g. "egress_limit")
// against the host (link speed, HTB) and returns it.
func ParseLimit(field string, s LimitSpec, host plane.HostInfo) (rate.Limit, error) {
	for _, f := range []struct {
		name string
		v    int64
	}{{"rate", s.Rate}, {"burst", s.Burst}, {"ceil", s.Ceil}} {
		if f.v < 0 {
			return rate.Limit{}, errorf(ErrInvalidArgument, "%s.%s: %d is negative (0 means no limit)", field, f.name, f.v)
		}
	}
	l := rate.Limit{Rate: uint64(s.Rate), Burst: uint64(s.Burst), Ceil: uint64(s.Ceil)}
	if err := checkLimit(field, l, host); err != nil {
		return rate.Limit{}, err
	}
	return l, nil
}

// resolveLimit is the limit a request asks for: spec when given, else def.
func (s *Isolator) resolveLimit(field string, spec *LimitSpec, def rate.Limit) (rate.Limit, error) {
	if spec == nil {
		return def, nil
	}
	return ParseLimit(field, *spec, s.Host())
}

// checkDefaults refuses default limits the host cannot enforce (called by
// Start, once the host is known).
func (s *Isolator) checkDefaults() error {
	for _, d := range []struct {
		name string
		l    rate.Limit
	}{{"default egress limit", s.cfg.Egress}, {"default ingress limit", s.cfg.Ingress}} {
		if err := checkLimit(d.name, d.l, s.Host()); err != nil {
			return err
		}
	}
	return nil
}
