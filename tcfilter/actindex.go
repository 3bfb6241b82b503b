package tcfilter

import (
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
//   - a drop node uses the host's action of its reason, index
//     dropIndexBase|reason (hostDropIndex), which EnsureDropSinks creates
//     on its own (not a filter's: it stays with no node bound to it) and
//     points at the reason's sink, so every veth shares the same twelve.
//
// Mirrors (the ARP fan-out) and the nodes of shared ports' spread tables
// (whose last use is evidence of a flow: SpreadUse) keep actions of their
// own. The index of an
// action says what it does, so a stale action cannot be bound by mistake:
// an ifindex is not handed out again while its device lives (and ifindexes
// are allocated cyclically); a drop action whose sink was re-created is
// pointed at the new one by EnsureDropSinks (a replace of the action
// itself, seen at once by every node bound to it). Ifindexes too large for
// the scheme get actions of their own (index 0: the kernel picks one).
const (
	redirectIndexBase = 0x40000000
	dropIndexBase     = 0x80000000
)

// redirectIndex is the index of the shared "redirect to ifindex" action of
// a namespace (0: none, the node gets an action of its own).
func redirectIndex(ifindex int) uint32 {
	if ifindex <= 0 || ifindex >= redirectIndexBase {
		return 0
	}
	return redirectIndexBase | uint32(ifindex)
}

// hostDropIndex is the index of the host's drop action of reason code r
// (the reason's index in DropReasons).
func hostDropIndex(r int) uint32 { return dropIndexBase | uint32(r) }

// mirredIndex is the index of f's first mirred action (0 if none).
func mirredIndex(f *netlink.U32) uint32 {
	for _, a := range f.Actions {
		if m, ok := a.(*netlink.MirredAction); ok {
			return uint32(m.Index)
		}
	}
	return 0
}

// actionIndex is the index of n's mirred action: a drop's (the host's
// action of its reason, set by the veth filters), the shared action of the target for any other redirect,
// none (0: the kernel picks one) for mirrors.
func (n node) actionIndex() uint32 {
	if n.index != 0 || n.reason != "" || n.act != actRedirect || n.own {
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
