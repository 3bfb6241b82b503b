package tcfilter

// Removing the paths to several containers at once (a burst of teardowns):
// the nodes of every slot's ranges and fan-out under one hold of the
// demux's lock, the H2 tables left empty released once.

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
)

// Unroute is what Unroute removes for one container slot: the nodes of its
// exclusive ranges and, with Fanout (eth0 only), its ICMP fan-out node.
type Unroute struct {
	Slot   uint16
	Ranges []ephemeral.Range
	Fanout bool
}

// Unrouted is the outcome of one Unroute: the range nodes and the fan-out
// nodes that were already gone, and what failed.
type Unrouted struct {
	MissingRanges, MissingFanout int
	Err                          error
}

// Unroute removes the nodes of every entry of us, under one hold of the
// demux's lock, and releases the H2 tables left empty once at the end. Each
// entry is done as DelRanges and DelFanout would do it alone, and gets its
// own outcome: an invalid entry, or one whose ranges belong to another
// slot, does not stop the others.
func (x *HostDemux) Unroute(us []Unroute) []Unrouted {
	out := make([]Unrouted, len(us))
	valid := make([]bool, len(us))
	for i, u := range us {
		out[i].Err = x.checkUnroute(u)
		valid[i] = out[i].Err == nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		for i := range out {
			if valid[i] {
				out[i].Err = err
			}
		}
		return out
	}
	// Plan every entry's deletions, send them together, then account
	// for each answer in its entry.
	var dels []unrouteDel
	for i, u := range us {
		if valid[i] {
			dels = x.planUnroute(dels, i, u, &out[i])
		}
	}
	errs := x.delAll(dels)
	var touched []uint8
	for k, del := range dels {
		o := &out[del.entry]
		err := errs[k]
		switch {
		case errors.Is(err, unix.ENOENT) && del.kind == KindICMP:
			o.MissingFanout++
		case errors.Is(err, unix.ENOENT) && del.handle>>20 == TablePort:
			// counted by its dport node (TablePort nodes are a copy)
		case errors.Is(err, unix.ENOENT):
			o.MissingRanges++
		case err != nil:
			o.Err = errors.Join(o.Err, err)
			continue
		}
		if del.kind == KindICMP {
			delete(x.fanout, us[del.entry].Slot)
			continue
		}
		if _, ok := x.nodes[del.handle]; ok {
			delete(x.nodes, del.handle)
			if b, small := h2Of(del.handle); small {
				x.h2[b]--
				touched = append(touched, b)
			}
		}
	}
	x.releaseH2(touched)
	return out
}

// unrouteDel is one node deletion of an Unroute: the entry it is for, the
// node's handle and its metrics kind.
type unrouteDel struct {
	entry  int
	handle uint32
	kind   string
}

// planUnroute appends entry i's node deletions (u) to dels and takes its
// ranges out of the index of owners (x.mu held). A range whose nodes
// belong to another slot is left alone and reported in o.
func (x *HostDemux) planUnroute(dels []unrouteDel, i int, u Unroute, o *Unrouted) []unrouteDel {
next:
	for _, r := range u.Ranges {
		ns := x.demuxNodes(u.Slot, 0, r)
		for _, n := range ns {
			if own, ok := x.nodes[n.handle]; ok && own.slot != u.Slot {
				o.Err = errors.Join(o.Err, fmt.Errorf("range %s is routed to slot %d, not %d", r, own.slot, u.Slot))
				continue next
			}
		}
		for _, n := range ns {
			dels = append(dels, unrouteDel{entry: i, handle: n.handle, kind: KindIP})
		}
		first, last := chunks(r)
		for c := first; c <= last; c++ {
			x.owners[c] = slices.DeleteFunc(x.owners[c], func(own owned) bool { return own.slot == u.Slot && own.r == r })
		}
	}
	if u.Fanout {
		dels = append(dels, unrouteDel{entry: i, handle: fanNode(u.Slot, 0).handle, kind: KindICMP})
	}
	return dels
}

// delAll deletes the nodes of dels (all of prio PrioIP) in one batch
// through the demux's Conn (one request at a time without one) and returns
// each one's answer (as dev.del).
func (x *HostDemux) delAll(dels []unrouteDel) []error {
	b := batch{c: x.c}
	for _, del := range dels {
		b.del(x.d, del.kind, PrioIP, del.handle, false)
	}
	res, _ := b.run()
	errs := make([]error, len(dels))
	for i, r := range res {
		errs[i] = r.err
	}
	return errs
}

// checkUnroute validates one entry of Unroute.
func (x *HostDemux) checkUnroute(u Unroute) error {
	if u.Fanout && x.dst == nil {
		return fmt.Errorf("%s: %w", x.d.label, ErrNoFanout)
	}
	if err := checkSlot(u.Slot); err != nil {
		return err
	}
	for _, r := range u.Ranges {
		if !r.IsAligned() {
			return fmt.Errorf("range %s: %w", r, ErrNotAligned)
		}
	}
	return nil
}
