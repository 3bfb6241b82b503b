package tcfilter

// The ICMP fan-out: one mirror node per container for the ICMP no port
// attributes (only without the echo programs).

import (
	"fmt"

	"github.com/vishvananda/netlink/nl"
)

func fanNode(slot uint16, target int) node {
	return node{prio: PrioIP, handle: MakeU32Handle(TableICMPFn, 0, uint32(slot)), classid: ClassID(slot),
		sel: sel(nl.TC_U32_TERMINAL), act: actMirror, target: target}
}

// AddFanout makes the ICMP that cannot be attributed to one container (echo
// replies whose identifier is in no container's ports, errors about such
// echo requests, non-first ICMP fragments) also reach target: one mirror
// node per container in TableICMPFn (node id = slot), so adding a container
// is O(1). ARP is never copied (see neighsync), ICMP errors about TCP/UDP
// go to the one owner of the quoted source port. It is idempotent and
// replaces an older target.
func (x *HostDemux) AddFanout(slot uint16, target int) error {
	if x.dst == nil {
		return fmt.Errorf("%s: %w", x.d.label, ErrNoFanout)
	}
	if err := checkSlot(slot); err != nil {
		return err
	}
	if target <= 0 {
		return fmt.Errorf("target ifindex %d: must be positive", target)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return err
	}
	if err := x.d.replace(KindICMP, fanNode(slot, target)); err != nil {
		return err
	}
	x.fanout[slot] = target
	return nil
}

// DelFanout removes slot's ICMP mirror node; missing counts the nodes that
// were already gone (0 or 1).
func (x *HostDemux) DelFanout(slot uint16) (missing int, err error) {
	o := x.Unroute([]Unroute{{Slot: slot, Fanout: true}})[0]
	return o.MissingFanout, o.Err
}

// FanoutUsed reports whether anything leads to the ICMP fan-out table: only
// on eth0 and only without the echo programs (then unattributed echo
// replies and errors about echo requests are mirrored to every container).
// With the echo programs the table is unreachable, so a fan-out node would
// cost a node in one bucket shared by every container (each insertion and
// removal walks it) and a mirred action of its own (the kernel walks every
// mirred action of the machine each time a device is unregistered), and
// carry nothing. Meaningful after Init. The answer stays the same for the
// HostDemux's life: Init decides it, and runs again (ensureReady) only
// after it failed, which the data plane does not go on from (PrepareHost
// fails).
func (x *HostDemux) FanoutUsed() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.dst != nil && x.echo == nil
}

// FanoutTarget returns the target of slot's fan-out node (ok: it has one),
// as the in-memory index has it (what Init read plus every change made
// through this HostDemux).
func (x *HostDemux) FanoutTarget(slot uint16) (target int, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	target, ok = x.fanout[slot]
	return target, ok
}
