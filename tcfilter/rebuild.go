package tcfilter

// Reading a container's record back from its veth's filters (ReadVeth),
// for the rebuild from the kernel (docs/recovery-trust.md).

import (
	"sort"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/ephemeral"
)

// VethState is what the filters on a container's host veth say about it,
// for rebuilding the container's record from the kernel.
type VethState struct {
	// Slot is the slot carried by the veth's own nodes (their classid); 0
	// when none of ours is there.
	Slot uint16
	// Ranges are the source-port ranges the container may send from
	// (exclusive and shared static ports and its ephemeral block).
	Ranges []ephemeral.Range
}

// ReadVeth reads VethState from the ingress filters of veth (in the
// namespace of h). Nodes it does not recognise (another feature's, a
// newer daemon's) are skipped, never removed.
func ReadVeth(h *netlink.Handle, veth int) (VethState, error) {
	var st VethState
	fs, err := dev{h: h, ifindex: veth, label: "veth"}.list()
	if err != nil {
		return st, err
	}
	seen := map[ephemeral.Range]bool{}
	slots := map[uint16]int{}
	for _, f := range fs {
		if s, ok := slotOf(f.ClassId); ok {
			slots[s]++
		}
		htid, _, nid := SplitU32Handle(f.Handle)
		if htid != vethOut.table || f.Sel == nil || len(f.Sel.Keys) != 1 || f.Link != 0 {
			continue
		}
		k := f.Sel.Keys[0]
		if k.Off != 0 || k.Mask&0xffff != 0 {
			continue
		}
		mask := uint16(k.Mask >> 16)
		r := ephemeral.Range{Begin: uint16(k.Val>>16) & mask, End: uint16(k.Val>>16)&mask | ^mask}
		if !r.IsAligned() || RangeNodeID(r) != nid || seen[r] {
			continue
		}
		seen[r] = true
		st.Ranges = append(st.Ranges, r)
	}
	// the slot most of the veth's nodes carry
	best := 0
	for s, n := range slots {
		if n > best || n == best && s < st.Slot {
			st.Slot, best = s, n
		}
	}
	sort.Slice(st.Ranges, func(i, j int) bool { return st.Ranges[i].Begin < st.Ranges[j].Begin })
	return st, nil
}
