package tcfilter

// The one drop sink of earlier layouts, which the IPv6 demux's counting
// mirrors still copy to (a program that only drops).

import (
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/netns/ifb"
)

// SinkName is the host device the IPv6 demux's counting mirrors copy to,
// and the one the drop nodes of veths of layouts before 5 redirect to (it
// does not start with "iso", the prefix of containers' veths); drop nodes
// now go to the sink of their reason (DropSinkName).
const SinkName = "drop.isolatord"

// Sink is the device SinkName (see "Drops" in docs/datapath.md).
type Sink struct {
	Index int  // ifindex
	BPF   bool // up with the dropping program on its egress; false: kept down (mirred drops)
}

// EnsureSink makes sure the host namespace of h has the drop sink: an ifb
// device named name whose egress has a direct-action cls_bpf program that
// drops everything, brought up only once that program is in place. When
// the kernel cannot load the program (bpfErr != nil) the device is kept
// down: mirred then drops what is redirected to it (and the kernel logs a
// rate-limited "device is down" notice). It can be re-run; an existing
// device of another kind with that name is an error.
func EnsureSink(h *netlink.Handle, name string) (s Sink, bpfErr error, err error) {
	l, err := ifb.Ensure(h, name)
	if err != nil {
		return s, nil, err
	}
	s.Index = l.Attrs().Index
	if err := EnsureClsact(h, s.Index); err != nil {
		return s, nil, err
	}
	if bpfErr = shotFilter.ensure(h, s.Index); bpfErr != nil {
		if err := h.LinkSetDown(l); err != nil {
			return s, bpfErr, fmt.Errorf("drop sink %s: set down: %w", name, err)
		}
		return s, bpfErr, nil
	}
	s.BPF = true
	if err := h.LinkSetUp(l); err != nil {
		return s, nil, fmt.Errorf("drop sink %s: set up: %w", name, err)
	}
	return s, nil, nil
}
