package tcfilter

// Exclusive port ranges: the nodes that route a range to its container.

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

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
	var (
		added    []uint32
		replaced []owned // previous owners of nodes whose target changed
		repH     []uint32
		newH2    []uint8
		addErr   error
	)
add:
	for _, r := range rs {
		for _, n := range x.demuxNodes(slot, target, r) {
			if o, ok := x.nodes[n.handle]; ok && o.slot == slot && o.r == r {
				// the slot has this range already: keep it, follow a new target
				if o.target != target {
					if err := x.d.replace(KindIP, n); err != nil {
						addErr = fmt.Errorf("range %s: %w", r, err)
						break add
					}
					replaced, repH = append(replaced, o), append(repH, n.handle)
					x.nodes[n.handle] = owned{slot: slot, target: target, r: r}
				}
				continue
			}
			b, small := h2Of(n.handle)
			if small && !x.h2Linked[b] {
				if err := x.linkH2(b); err != nil {
					newH2 = append(newH2, b)
					addErr = err
					break add
				}
				newH2 = append(newH2, b)
			}
			if err := x.d.add(KindIP, n); err != nil {
				addErr = fmt.Errorf("range %s: %w", r, err)
				break add
			}
			added = append(added, n.handle)
			x.nodes[n.handle] = owned{slot: slot, target: target, r: r}
			if small {
				x.h2[b]++
			}
		}
	}
	if addErr != nil {
		for i := len(added) - 1; i >= 0; i-- {
			h := added[i]
			if err := x.d.del(KindIP, PrioIP, h); err != nil && !errors.Is(err, unix.ENOENT) {
				addErr = errors.Join(addErr, fmt.Errorf("rollback: %w", err))
				continue
			}
			delete(x.nodes, h)
			if b, small := h2Of(h); small {
				x.h2[b]--
			}
		}
		for i, o := range replaced {
			for _, n := range x.demuxNodes(o.slot, o.target, o.r) {
				if n.handle != repH[i] {
					continue
				}
				if err := x.d.replace(KindIP, n); err != nil {
					addErr = errors.Join(addErr, fmt.Errorf("rollback: %w", err))
				} else {
					x.nodes[n.handle] = o
				}
			}
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
	if err := checkSlot(slot); err != nil {
		return 0, err
	}
	for _, r := range rs {
		if !r.IsAligned() {
			return 0, fmt.Errorf("range %s: %w", r, ErrNotAligned)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return 0, err
	}
	var (
		errs    []error
		touched []uint8
	)
next:
	for _, r := range rs {
		ns := x.demuxNodes(slot, 0, r)
		for _, n := range ns {
			if o, ok := x.nodes[n.handle]; ok && o.slot != slot {
				errs = append(errs, fmt.Errorf("range %s is routed to slot %d, not %d", r, o.slot, slot))
				continue next
			}
		}
		for _, n := range ns {
			err := x.d.del(KindIP, PrioIP, n.handle)
			switch {
			case errors.Is(err, unix.ENOENT) && n.handle>>20 == TablePort:
				// counted by its dport node (TablePort nodes are a copy)
			case errors.Is(err, unix.ENOENT):
				missing++
			case err != nil:
				errs = append(errs, err)
				continue
			}
			if _, ok := x.nodes[n.handle]; ok {
				delete(x.nodes, n.handle)
				if b, small := h2Of(n.handle); small {
					x.h2[b]--
					touched = append(touched, b)
				}
			}
		}
		first, last := chunks(r)
		for c := first; c <= last; c++ {
			x.owners[c] = slices.DeleteFunc(x.owners[c], func(o owned) bool { return o.slot == slot && o.r == r })
		}
	}
	x.releaseH2(touched)
	return missing, errors.Join(errs...)
}
