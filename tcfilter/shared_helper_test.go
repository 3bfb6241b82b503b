package tcfilter

import (
	"fmt"

	"github.com/isolatord/isolatord/ephemeral/spread"
)

// setShared makes port a shared port whose flows are spread over holders
// by the consistent assignment (Assign), without pins, or, with no holders,
// stops sharing it. It does not look at live flows: see spread.Plan and
// SetSpread for changes that keep them. It is idempotent.
func (x *HostDemux) setShared(port uint16, holders []spread.Holder) error {
	if len(holders) == 0 {
		return x.Unshare(port)
	}
	for _, h := range holders {
		if err := checkSlot(h.Slot); err != nil {
			return fmt.Errorf("shared port %d: %w", port, err)
		}
	}
	want, err := spread.Assign(port, holders)
	if err != nil {
		return err
	}
	return x.SetSpread(port, spread.Spread{Buckets: want})
}
