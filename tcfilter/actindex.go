package tcfilter

import (
	"slices"

	"github.com/vishvananda/netlink"
)

// Shared mirred actions.
//
// A tc action is a namespace-wide object with an index; a filter that names
// the index of an existing action of its kind binds to that action instead
// of creating one (the kernel then ignores the parameters it was given).
// Every mirred action joins one machine-wide list, which the kernel walks
// each time any device is unregistered (mirred_device_event): with one
// action per node, deleting a container's veth cost a walk over some fifty
// actions of every container on the machine (the host demuxes' redirects
// to its veth, its veth's drops and redirects, its own lo and eth0
// redirects). Nodes therefore share their actions by index:
//
//   - every redirect that is not a drop (to a container's veth from the
//     host demuxes, to host eth0, host lo or a shaper entry from a veth or a
//     shaper exit, inside a container to its eth0 or lo) uses the action of
//     its namespace for its target, index redirectIndexBase|ifindex (built
//     by dev.build: node.actionIndex);
//   - a drop node uses one action per (veth, reason), index
//     dropIndexBase|bank<<30|veth<<4|reason, shared by the veth's nodes of
//     that reason, so per-reason counts still come from one dump of the veth
//     (Drops counts each action once).
//
// Mirrors (the ARP fan-out) keep actions of their own. The index of an
// action says what it does, so a stale action cannot be bound by mistake:
// an ifindex is not handed out again while its device lives (and ifindexes
// are allocated cyclically). The one case where an action at an index can
// point elsewhere than its index says is a drop action whose sink was
// deleted and re-created; Install then moves the veth's drop nodes to the
// other bank (dropBank). Ifindexes too large for the scheme get actions of
// their own (index 0: the kernel picks one), as before. Nodes of older
// layouts keep their own actions until they are replaced.
const (
	redirectIndexBase = 0x40000000
	dropIndexBase     = 0x80000000
	dropBankBit       = 1 << 30
	maxDropVeth       = 1<<26 - 1
)

// redirectIndex is the index of the shared "redirect to ifindex" action of
// a namespace (0: none, the node gets an action of its own).
func redirectIndex(ifindex int) uint32 {
	if ifindex <= 0 || ifindex >= redirectIndexBase {
		return 0
	}
	return redirectIndexBase | uint32(ifindex)
}

// dropIndex is the index of the action that drops frames of veth for
// reason (0: none, the node gets an action of its own).
func dropIndex(bank uint32, veth int, reason string) uint32 {
	r := slices.Index(DropReasons, reason)
	if veth <= 0 || veth > maxDropVeth || r < 0 || bank > 1 {
		return 0
	}
	return dropIndexBase | bank<<30 | uint32(veth)<<4 | uint32(r)
}

// dropIndexOf reports whether idx is a drop index of veth, and its bank.
func dropIndexOf(idx uint32, veth int) (bank uint32, ok bool) {
	if idx&dropIndexBase == 0 || veth <= 0 || veth > maxDropVeth || int(idx>>4&maxDropVeth) != veth {
		return 0, false
	}
	return idx & dropBankBit >> 30, true
}

// mirredIndex is the index of f's first mirred action (0 if none).
func mirredIndex(f *netlink.U32) uint32 {
	for _, a := range f.Actions {
		if m, ok := a.(*netlink.MirredAction); ok {
			return uint32(m.Index)
		}
	}
	return 0
}

// dropBank chooses the bank of the veth's drop actions from a dump fs of
// its filters: the bank whose actions point at the sink, else the other
// bank than actions that point elsewhere (a sink that was re-created: the
// kernel would bind the new nodes to the old actions), else 0.
func (v VethFilters) dropBank(fs []*netlink.U32) uint32 {
	bank, stale := uint32(0), false
	for _, f := range fs {
		b, ok := dropIndexOf(mirredIndex(f), v.Veth)
		if !ok {
			continue
		}
		if mirredTarget(f) == v.Sink {
			return b
		}
		bank, stale = b, true
	}
	if stale {
		return 1 - bank
	}
	return 0
}

// actionIndex is the index of n's mirred action: a drop's own (set by the
// veth filters), the shared action of the target for any other redirect,
// none (0: the kernel picks one) for mirrors.
func (n node) actionIndex() uint32 {
	if n.index != 0 || n.reason != "" || n.act != actRedirect {
		return n.index
	}
	return redirectIndex(n.target)
}

// sameMatch is sameNode except for the actions: what the kernel holds
// matches the same packets as want (a replace then changes only what is
// done with them).
func sameMatch(want, got *netlink.U32) bool {
	w := *want
	w.Actions = got.Actions
	return sameNode(&w, got)
}
