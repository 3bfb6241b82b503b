package tcfilter

// Exclusive port ranges: the nodes that route a range to its container.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/isolatord/isolatord/ephemeral"
)

// AddRanges routes the aligned ranges rs to target (the host-side veth of
// container slot). The ports must not be routed to another slot (ErrOverlap;
// the same slot may hold overlapping ranges for a moment, while an update
// adds the new ranges before removing the old ones). A range the slot has
// already is kept (and follows target if that changed), so re-adding is
// harmless. It is all or nothing: on error every node it added is removed
// again and every target it changed is put back.
func (x *HostDemux) AddRanges(slot uint16, target int, rs []ephemeral.Range) error {
	if err := checkSlot(slot); err != nil {
		return err
	}
	if target <= 0 {
		return fmt.Errorf("target ifindex %d: must be positive", target)
	}
	if err := checkRanges(rs); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return err
	}
	for _, r := range rs {
		if err := x.checkFree(slot, r); err != nil {
			return err
		}
	}
	// One batch: the H2 tables (and their links) the small ranges need,
	// the new nodes, and the replacements of nodes that follow a new
	// target. What each request did is then applied to the index; if one
	// failed, the others are undone.
	type planned struct {
		n     node
		r     ephemeral.Range
		prev  owned // replaced: the previous owner
		rep   bool
		h2    uint8 // link: the H2 table
		link  bool
		table bool // the link's table request (the link node follows it)
	}
	var (
		plan   []planned
		newH2  []uint8
		addErr error
	)
	b := batch{c: x.c}
	linking := map[uint8]bool{}
	for _, r := range rs {
		for _, n := range x.demuxNodes(slot, target, r) {
			if o, ok := x.nodes[n.handle]; ok && o.slot == slot && o.r == r {
				// the slot has this range already: keep it, follow a new target
				if o.target != target {
					b.replace(x.d, KindIP, n)
					plan = append(plan, planned{n: n, r: r, prev: o, rep: true})
				}
				continue
			}
			if h, small := h2Of(n.handle); small && !x.h2Linked[h] && !linking[h] {
				linking[h] = true
				newH2 = append(newH2, h)
				x.unstale(TableH2Base + uint32(h))
				b.addTable(x.d, KindIP, PrioIP, TableH2Base+uint32(h), 16)
				b.addKeep(x.d, KindIP, h2Link(h))
				plan = append(plan, planned{h2: h, link: true, table: true}, planned{h2: h, link: true})
			}
			b.add(x.d, KindIP, n)
			plan = append(plan, planned{n: n, r: r})
		}
	}
	res, _ := b.run()
	var (
		added    []uint32
		replaced []owned // previous owners of nodes whose target changed
		repH     []uint32
	)
	for i, p := range plan {
		err := res[i].err
		switch {
		case p.link && p.table:
			if err != nil {
				addErr = errors.Join(addErr, err)
			}
		case p.link:
			if err != nil {
				addErr = errors.Join(addErr, err)
			} else if res[i-1].err == nil {
				x.h2Linked[p.h2] = true
			}
		case err != nil:
			addErr = errors.Join(addErr, fmt.Errorf("range %s: %w", p.r, err))
		case p.rep:
			replaced, repH = append(replaced, p.prev), append(repH, p.n.handle)
			x.nodes[p.n.handle] = owned{slot: slot, target: target, r: p.r}
		default:
			added = append(added, p.n.handle)
			x.nodes[p.n.handle] = owned{slot: slot, target: target, r: p.r}
			if h, small := h2Of(p.n.handle); small {
				x.h2[h]++
			}
		}
	}
	if addErr != nil {
		var rb []func(error)
		for _, h := range added {
			b.del(x.d, KindIP, PrioIP, h, true)
			rb = append(rb, func(err error) {
				if err == nil {
					delete(x.nodes, h)
					if hb, small := h2Of(h); small {
						x.h2[hb]--
					}
				}
			})
		}
		for i, o := range replaced {
			for _, n := range x.demuxNodes(o.slot, o.target, o.r) {
				if n.handle == repH[i] {
					b.replace(x.d, KindIP, n)
					rb = append(rb, func(err error) {
						if err == nil {
							x.nodes[n.handle] = o
						}
					})
				}
			}
		}
		res, _ := b.run()
		for i, r := range res {
			if r.err != nil {
				addErr = errors.Join(addErr, fmt.Errorf("rollback: %w", r.err))
			}
			rb[i](r.err)
		}
		x.releaseH2(newH2)
		return addErr
	}
	for _, r := range rs {
		o := owned{slot: slot, target: target, r: r}
		first, last := chunks(r)
		for c := first; c <= last; c++ {
			x.owners[c] = slices.DeleteFunc(x.owners[c], func(p owned) bool { return p.slot == slot && p.r == r })
			x.owners[c] = append(x.owners[c], o)
		}
	}
	return nil
}

// checkFree fails if r meets ports routed to another slot or a shared port
// (unless slot alone holds that port: see SetSpread).
func (x *HostDemux) checkFree(slot uint16, r ephemeral.Range) error {
	first, last := chunks(r)
	for c := first; c <= last; c++ {
		for _, o := range x.owners[c] {
			if o.slot != slot && o.r.Overlaps(r) {
				return fmt.Errorf("range %s meets %s of slot %d: %w", r, o.r, o.slot, ErrOverlap)
			}
		}
	}
	return x.sharedConflict(slot, r)
}

// DelRanges removes the nodes of slot's ranges rs. It is tolerant: nodes
// already gone are counted in missing, not reported as errors. A range whose
// nodes belong to another slot is left alone and reported. H2 tables left
// empty are unlinked and deleted.
func (x *HostDemux) DelRanges(slot uint16, rs []ephemeral.Range) (missing int, err error) {
	o := x.Unroute([]Unroute{{Slot: slot, Ranges: rs}})[0]
	return o.MissingRanges, o.Err
}
