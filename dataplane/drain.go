package dataplane

// Draining a shared port: a holder that takes no new flows on the port
// while its live flows keep reaching it (spread/drain.go decides,
// tcfilter/hostdemux_drain.go marks it in the kernel). d.drain records
// who drains which port; the spread tables' markers are the truth a
// restarted daemon reads back (Adopt). The reconciler removes the
// draining holder's pins as its flows end, like any pin; DrainState counts
// what is left.
//
// An exclusive port is drained by first making it a shared port of its
// one holder (SetPorts; the lifecycle does that), so every drained port
// is a shared port here.

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/isolator/plane"
)

// Drain puts container c's holding of shared port port into draining
// (on) or back to taking new flows (!on), keeping every live flow where it
// is. Draining the port's last holder that does not drain refuses new
// flows (the host's stack answers them as a closed port). Idempotent; on
// failure nothing changes.
func (d *DataPlane) Drain(ctx context.Context, c plane.Container, port uint16, on bool) error {
	if err := d.begin(ctx, c.ID, keepCache); err != nil {
		return err
	}
	defer d.mu.Unlock()
	rec, ok := d.ctrs[c.ID]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknown, c.ID)
	}
	slot := rec.c.Slot
	hs := d.shared[port]
	if !rec.c.Shared.Contains(port) || !slices.ContainsFunc(hs, func(h spread.Holder) bool { return h.Slot == slot }) {
		return fmt.Errorf("container %s: port %d is not one of its shared ports", c.ID, port)
	}
	if d.drain[port][slot] == on {
		return nil
	}
	prev := maps.Clone(d.drain[port])
	next := maps.Clone(prev)
	if next == nil {
		next = map[uint16]bool{}
	}
	if on {
		next[slot] = true
	} else {
		delete(next, slot)
	}
	d.setDrainSet(port, next)
	// (an undone drain's cut goes with setShared's pruneDrain: on failure
	// it stays, with the drain set put back)
	if err := d.setShared(port, hs); err != nil {
		d.setDrainSet(port, prev)
		return fmt.Errorf("container %s: drain port %d: %w", c.ID, port, err)
	}
	d.recoveryKnown = nil
	return nil
}

// setDrainSet records the draining holders of port. Call with d.mu held.
func (d *DataPlane) setDrainSet(port uint16, set map[uint16]bool) {
	if len(set) == 0 {
		delete(d.drain, port)
		return
	}
	if d.drain == nil {
		d.drain = map[uint16]map[uint16]bool{}
	}
	d.drain[port] = set
}

// pruneDrain drops from d.drain the slots that no longer hold port (a
// slot handed out again must not inherit a drain). Call with d.mu held.
func (d *DataPlane) pruneDrain(port uint16, hs []spread.Holder) {
	set := d.drain[port]
	for s := range set {
		if !slices.ContainsFunc(hs, func(h spread.Holder) bool { return h.Slot == s }) {
			delete(set, s)
		}
	}
	if len(set) == 0 {
		delete(d.drain, port)
	}
	for s := range d.cut[port] {
		if !set[s] {
			delete(d.cut[port], s)
		}
	}
}

// adoptDrain reads from the kernel's markers (eth0's spread table) whether
// the adopted container in slot drains port. Call with d.mu held.
func (d *DataPlane) adoptDrain(port, slot uint16) {
	if d.eth0 == nil || !d.eth0.Draining(port)[slot] {
		return
	}
	set := maps.Clone(d.drain[port])
	if set == nil {
		set = map[uint16]bool{}
	}
	set[slot] = true
	d.setDrainSet(port, set)
}

// DrainState lists the ports container id drains, from the host demux's
// index (the kernel's markers and pins), in port order.
func (d *DataPlane) DrainState(id string) []plane.DrainPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	rec, ok := d.ctrs[id]
	if !ok || d.eth0 == nil {
		return nil
	}
	var out []plane.DrainPort
	for _, p := range rec.c.Shared.Ports() {
		if !d.drain[p][rec.c.Slot] {
			continue
		}
		st, _ := d.eth0.Spread(p)
		out = append(out, plane.DrainPort{Port: p, LiveFlows: st.LivePins(rec.c.Slot)})
	}
	return out
}

// DrainTotals counts the drained holdings (container and port) and the
// flows still pinned to them, from the host demux's index (for metrics).
//
// A scrape never waits for a setup or teardown holding d.mu: it then gets
// the figures of the last scrape that did not.
func (d *DataPlane) DrainTotals() (holdings, flows int) {
	if !d.mu.TryLock() {
		return int(d.drainHoldings.Load()), int(d.drainFlows.Load())
	}
	defer d.mu.Unlock()
	defer func() { d.drainHoldings.Store(int64(holdings)); d.drainFlows.Store(int64(flows)) }()
	if d.eth0 == nil {
		return 0, 0
	}
	for p, set := range d.drain {
		st, _ := d.eth0.Spread(p)
		for slot := range set {
			holdings++
			flows += st.LivePins(slot)
		}
	}
	return holdings, flows
}

// CutDrain ends the flows container c still has on port, which it drains
// (its deadline passed): its pins go, so their packets go where new flows
// go. The cut lasts while c drains the port (Drain undo clears it) and is
// kept by the reconciler; a restarted daemon forgets it (the lifecycle
// cuts again: its deadline is in the record).
func (d *DataPlane) CutDrain(ctx context.Context, c plane.Container, port uint16) error {
	if err := d.begin(ctx, c.ID, keepCache); err != nil {
		return err
	}
	defer d.mu.Unlock()
	rec, ok := d.ctrs[c.ID]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknown, c.ID)
	}
	slot := rec.c.Slot
	if !d.drain[port][slot] {
		return fmt.Errorf("container %s: does not drain port %d", c.ID, port)
	}
	if d.cut == nil {
		d.cut = map[uint16]map[uint16]bool{}
	}
	if d.cut[port] == nil {
		d.cut[port] = map[uint16]bool{}
	}
	d.cut[port][slot] = true
	if err := d.setShared(port, d.shared[port]); err != nil {
		delete(d.cut[port], slot)
		return fmt.Errorf("container %s: cut the flows on port %d: %w", c.ID, port, err)
	}
	d.recoveryKnown = nil
	return nil
}

// cutFlows hides from planning the flows of holders of port whose drain
// deadline passed (CutDrain). Call with d.mu held.
func (d *DataPlane) cutFlows(port uint16, flows spread.FlowSource) spread.FlowSource {
	cut := d.cut[port]
	if len(cut) == 0 || flows == nil {
		return flows
	}
	return func(slot uint16) ([]spread.Flow, bool) {
		if cut[slot] && d.drain[port][slot] {
			return nil, true
		}
		return flows(slot)
	}
}
