// Package ephemeral is isolatord's port bookkeeping: port ranges and sets, the
// ephemeral block allocator, the static/shared port ledger, start-up overlap
// checks, and the split of a port set into power-of-two aligned ranges that a
// single u32 value/mask key can match. It is pure Go and never touches the
// kernel.
//
// Design:
//
//   - Set is an immutable value holding sorted, merged ranges; every
//     operation is a linear merge and returns a new Set, so sets can be
//     shared between goroutines and stored in state without copying.
//     ParseSet/String use the operator's "31000-31999,32500" syntax.
//   - Allocator cuts the ephemeral pool into blocks of one power-of-two size,
//     each aligned to that size, so a container's ephemeral range is one u32
//     key and one ip_local_port_range. A bitmap over the blocks gives first
//     fit in a few word scans; Claim re-adopts blocks on recovery.
//   - Ledger records static ports per container, exclusive or shared, with
//     symmetric rules: a port is held by one exclusive holder or by sharers
//     only. Requests are checked completely before anything changes.
//   - Split turns any port set into the fewest aligned blocks (value/mask
//     keys) for the tc u32 filters.
//   - ValidatePools checks the configured pools against well-known ports,
//     each other and the host's ip_local_port_range at start-up.
//
// Allocator and Ledger are not safe for concurrent use; the caller locks.
package ephemeral

import "fmt"

// Range is an inclusive range of ports [Begin, End].
type Range struct {
	Begin uint16 `json:"begin"`
	End   uint16 `json:"end"`
}

// Size is the number of ports in r (0 for a reversed range).
func (r Range) Size() int {
	if r.End < r.Begin {
		return 0
	}
	return int(r.End) - int(r.Begin) + 1
}

// Contains reports whether port p lies in r.
func (r Range) Contains(p uint16) bool { return r.Begin <= p && p <= r.End }

// Overlaps reports whether r and o share at least one port.
func (r Range) Overlaps(o Range) bool { return r.Begin <= o.End && o.Begin <= r.End }

// IsAligned reports whether r has a power-of-two size and begins on a multiple
// of that size, so that one u32 key (port & Mask() == Begin) matches exactly r.
func (r Range) IsAligned() bool {
	n := r.Size()
	return n > 0 && n&(n-1) == 0 && int(r.Begin)%n == 0
}

// Mask is the u32 mask that matches an aligned range: ^(size-1) on 16 bits.
// It is only meaningful when IsAligned is true.
func (r Range) Mask() uint16 { return ^uint16(r.Size() - 1) }

// String prints "31000-31999", or "31000" for a single port.
func (r Range) String() string {
	if r.Begin == r.End {
		return fmt.Sprintf("%d", r.Begin)
	}
	return fmt.Sprintf("%d-%d", r.Begin, r.End)
}
