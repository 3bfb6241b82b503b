package ephemeral

import (
	"errors"
	"fmt"
)

// ErrOverlap is wrapped by every error of the start-up overlap checks.
var ErrOverlap = errors.New("port ranges overlap")

// WellKnownPorts is the set of well-known ports, 0-1023, that the ephemeral
// pool must never include.
func WellKnownPorts() Set { return NewSet(Range{Begin: 0, End: 1023}) }

// OverlapError reports that two named port sets share ports. A and B are the
// ranges of each side that take part in the overlap; Common is the shared
// ports. Its message names both sides, e.g.
//
//	ephemeral ports 1000-2047 overlap well-known ports 0-1023 (shared: 1000-1023)
type OverlapError struct {
	NameA, NameB string
	A, B, Common Set
}

func (e *OverlapError) Error() string {
	return fmt.Sprintf("%s %s overlap %s %s (shared: %s)", e.NameA, e.A, e.NameB, e.B, e.Common)
}

// Unwrap returns ErrOverlap.
func (e *OverlapError) Unwrap() error { return ErrOverlap }

// CheckOverlap returns nil when a and b share no port, and otherwise an
// *OverlapError naming both sides: nameA and nameB are used verbatim
// ("ephemeral ports", "static ports", ...), each followed by those of its
// ranges that overlap the other side.
func CheckOverlap(nameA string, a Set, nameB string, b Set) error {
	common := a.Intersect(b)
	if common.Empty() {
		return nil
	}
	return &OverlapError{
		NameA: nameA, A: touching(a, common),
		NameB: nameB, B: touching(b, common),
		Common: common,
	}
}

// touching keeps the ranges of s that share a port with c.
func touching(s, c Set) Set {
	var out []Range
	for _, r := range s.rs {
		if c.Overlaps(Set{rs: []Range{r}}) {
			out = append(out, r)
		}
	}
	return Set{rs: out}
}

// CheckWellKnown fails when the set called name includes a well-known port.
func CheckWellKnown(name string, s Set) error {
	return CheckOverlap(name, s, "well-known ports", WellKnownPorts())
}

// ValidatePools runs the start-up checks on the configured port pools: the
// ephemeral pool must not include well-known ports (0-1023), static ports, or
// the host's own ephemeral range hostLocal (its net.ipv4.ip_local_port_range,
// from which host processes pick their source ports). It returns nil or the
// errors of every failed check joined (errors.Join), each an *OverlapError
// naming both ranges. A reversed hostLocal is treated as empty (unknown).
func ValidatePools(ephemeral, static Set, hostLocal Range) error {
	return errors.Join(
		CheckWellKnown("ephemeral ports", ephemeral),
		CheckOverlap("ephemeral ports", ephemeral, "static ports", static),
		CheckOverlap("ephemeral ports", ephemeral, "host ip_local_port_range", NewSet(hostLocal)),
	)
}
