package tcfilter

import (
	"errors"
	"maps"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
)

// Draining holders of a shared port, in the kernel.
//
// A holder that drains a port (spread.Spread.Draining) gets a marker node
// in the port's spread table: bucket slot&0xff, node id 0x900|slot>>8,
// classid 1:slot, terminal, no action, keyed on a destination port the
// table never sees (the port xor 1). It comes after the bucket's
// match-all node (0x800), so no packet ever reaches it: it costs nothing
// per packet. It only says, in a host-side object the tenant cannot
// write, that the slot drains this port: a daemon restarted mid-drain
// reads it back (Init's index, Spread) instead of trusting its database.
// The marker goes with the spread table when the port stops being shared.
//
// A bucket of a port whose holders all drain (spread.Refuse) is a
// terminal node without action, classid 1:0: the packet goes to the host's
// stack, where the port's reservation socket (never listening) makes the
// kernel answer a SYN with a reset, as for any closed port.

const nodeDrainBase = 0x900

func drainHandle(table uint32, slot uint16) uint32 {
	return MakeU32Handle(table, uint32(slot&0xff), nodeDrainBase|uint32(slot>>8))
}

func drainNode(table uint32, port, slot uint16) node {
	return node{
		prio: PrioIP, handle: drainHandle(table, slot), classid: ClassID(slot),
		sel: sel(nl.TC_U32_TERMINAL, dportKey(ephemeral.Range{Begin: port ^ 1, End: port ^ 1})),
	}
}

func refuseNode(table uint32, b int) node {
	return node{
		prio: PrioIP, handle: MakeU32Handle(table, uint32(b), nodeSpread), classid: ClassID(0),
		sel: sel(nl.TC_U32_TERMINAL),
	}
}

// indexDrain records f in sp if it is a marker or a refusing bucket node,
// and reports whether it was one.
func indexDrain(sp *sharedPort, f *netlink.U32, bkt, nid uint32) bool {
	switch {
	case nid&^0xf == nodeDrainBase:
		s, ok := slotOf(f.ClassId)
		if !ok || uint32(s&0xff) != bkt || uint32(s>>8) != nid&0xf {
			return true
		}
		if sp.drain == nil {
			sp.drain = map[uint16]bool{}
		}
		sp.drain[s] = true
		return true
	case nid == nodeSpread && f.ClassId == ClassID(0) && bkt < spread.Buckets:
		sp.buckets[bkt], sp.present[bkt] = spread.Refuse, true
		return true
	}
	return false
}

// setDrain makes the markers of sp's table those of want: new ones first,
// then stale ones go. Call with x.mu held.
func (x *HostDemux) setDrain(port uint16, sp *sharedPort, want map[uint16]bool) error {
	for _, s := range slices.Sorted(maps.Keys(want)) {
		if sp.drain[s] {
			continue
		}
		if err := x.d.replace(KindIP, drainNode(sp.table, port, s)); err != nil {
			return err
		}
		if sp.drain == nil {
			sp.drain = map[uint16]bool{}
		}
		sp.drain[s] = true
	}
	for _, s := range slices.Sorted(maps.Keys(sp.drain)) {
		if want[s] {
			continue
		}
		if err := x.d.del(KindIP, PrioIP, drainHandle(sp.table, s)); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		delete(sp.drain, s)
	}
	return nil
}

// Draining returns the slots that drain port (from the index, which Init
// rebuilds from the kernel's markers).
func (x *HostDemux) Draining(port uint16) map[uint16]bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if sp := x.shared[port]; sp != nil {
		return maps.Clone(sp.drain)
	}
	return nil
}
