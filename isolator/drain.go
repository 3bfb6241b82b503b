package isolator

// Drain and handoff of static ports (docs/handoff.md).
//
// Drain: a holder of a port stops getting new flows on it while its live
// flows keep reaching it. An exclusive port is first made a shared port of
// its one holder (an ordinary port update: make-before-break in the
// kernel, the ledger and the host reservation unchanged in extent), then
// the data plane drains the holder (DataPlane.Drain). Record.Draining
// journals the drained ports; the kernel's drain markers are the truth a
// restarted data plane reads back.
//
// Handoff: Prepare with HandoffFrom names a predecessor and the ports it
// hands over. The predecessor's ports are made shared (if exclusive) and
// the successor reserves them as shared: the port is held throughout, no
// host process or third container can take it. Nothing moves in the
// kernel until the successor is isolated: its Setup joins the port's
// holders, then the predecessor drains. A successor that fails to isolate
// never joined: the predecessor keeps serving every flow. When the
// predecessor is cleaned up (or its flows end) the successor holds the port
// alone.

import (
	"context"
	"strings"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

// Drainer is the part of the data plane that drains ports; a data plane
// without it refuses drains (FailedPrecondition).
type Drainer interface {
	Drain(ctx context.Context, c plane.Container, port uint16, on bool) error
	DrainState(id string) []plane.DrainPort
	// CutDrain ends the flows c still has on a port it drains.
	CutDrain(ctx context.Context, c plane.Container, port uint16) error
}

// holderNames names the containers the ledger has holding port.
func (s *Isolator) holderNames(port uint16) string {
	s.mu.Lock()
	hs := s.ledger.Holders(port)
	s.mu.Unlock()
	if len(hs) == 0 {
		return "nobody"
	}
	var names []string
	for _, h := range hs {
		kind := "exclusively"
		if h.Shared {
			kind = "shared"
		}
		names = append(names, h.Container+" ("+kind+")")
	}
	return strings.Join(names, ", ")
}

// Drain puts container id into draining for ports (undo: takes it out).
// Every port must be one of its static ports and the container isolated;
// otherwise nothing changes.
func (s *Isolator) Drain(ctx context.Context, id string, ports []uint16, undo bool, deadline time.Duration) (_ Record, err error) {
	defer s.observe("drain", time.Now(), &err)
	if err := validateID(id); err != nil {
		return Record{}, err
	}
	if len(ports) == 0 {
		return Record{}, errorf(ErrInvalidArgument, "ports: give at least one port to drain")
	}
	if deadline < 0 || deadline > 0 && undo {
		return Record{}, errorf(ErrInvalidArgument, "deadline_seconds: only with a drain, not with undo")
	}
	unlock := s.locks.lock(id)
	defer unlock()
	r, err := s.drainLocked(ctx, id, ports, undo, deadline)
	if err != nil || deadline == 0 {
		return r, err
	}
	s.armDrainDeadline(id, r.DrainDeadline)
	return r, nil
}

// armDrainDeadline cuts container id's flows on the ports it drains at
// at, unless its drain deadline has changed (undone, or set again) by then.
func (s *Isolator) armDrainDeadline(id string, at time.Time) {
	time.AfterFunc(time.Until(at), func() {
		unlock := s.locks.lock(id)
		defer unlock()
		r, ok := s.get(id)
		dr, can := s.dp.(Drainer)
		if !ok || !can || !r.DrainDeadline.Equal(at) || r.State != StateIsolated {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, d := range dr.DrainState(id) {
			if err := dr.CutDrain(ctx, s.container(&r), d.Port); err != nil {
				s.log.Error("drain deadline: cut the flows left", "container_id", id, "port", d.Port, "err", err)
				continue
			}
			s.log.Info("drain deadline: flows left cut", "container_id", id, "port", d.Port, "flows", d.LiveFlows)
		}
	})
}

// armDrainDeadlines re-arms, after recovery, the drain deadlines of the
// records (a passed one fires at once: the restarted data plane does not
// remember a cut).
func (s *Isolator) armDrainDeadlines() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, r := range s.records {
		if !r.DrainDeadline.IsZero() && !r.Draining.Empty() {
			s.armDrainDeadline(id, r.DrainDeadline)
		}
	}
}

// drainLocked is Drain with id's lock held; a deadline (> 0, not with
// undo) is written in the same commit as the drain.
func (s *Isolator) drainLocked(ctx context.Context, id string, ports []uint16, undo bool, deadline time.Duration) (Record, error) {
	dr, ok := s.dp.(Drainer)
	if !ok {
		return Record{}, errorf(ErrFailedPrecondition, "ports: this data plane cannot drain ports")
	}
	cur, ok := s.get(id)
	if !ok {
		return Record{}, errorf(ErrNotFound, "container_id: %s is not known", id)
	}
	for _, p := range ports {
		if p == 0 || !cur.Ports.Union(cur.Shared).Contains(p) {
			return Record{}, errorf(ErrInvalidArgument, "ports: container %s does not hold port %d (held by %s)", id, p, s.holderNames(p))
		}
	}
	if cur.State != StateIsolated {
		return Record{}, errorf(ErrFailedPrecondition, "container_id: %s is %s; only an isolated container drains", id, cur.State)
	}
	set := ephemeral.PortSet(ports...)
	// Exclusive ports become shared ports of this one holder first (and
	// exclusive again if the drain fails).
	toShare := set.Intersect(cur.Ports)
	if !undo && !toShare.Empty() {
		next, err := s.updatePorts(ctx, cur, cur.Ports.Subtract(toShare), cur.Shared.Union(toShare))
		if err != nil {
			return Record{}, err
		}
		cur = next
	}
	var done []uint16
	for _, p := range set.Ports() {
		if err := dr.Drain(ctx, s.container(&cur), p, !undo); err != nil {
			for _, q := range done {
				if rerr := dr.Drain(ctx, s.container(&cur), q, undo); rerr != nil {
					s.log.Error("put a drain back after a failed drain", "container_id", id, "port", q, "err", rerr)
				}
			}
			if !undo && !toShare.Empty() {
				if _, _, uerr := s.exclusiveAgain(context.WithoutCancel(ctx), cur, toShare); uerr != nil {
					s.log.Error("make ports exclusive again after a failed drain", "container_id", id, "ports", toShare.String(), "err", uerr)
				}
			}
			return Record{}, wrapf(ErrInternal, err, "drain port %d of %s", p, id)
		}
		done = append(done, p)
	}
	next := cur
	if undo {
		next.Draining = cur.Draining.Subtract(set)
		if next.Draining.Empty() {
			next.DrainDeadline = time.Time{}
		}
	} else {
		next.Draining = cur.Draining.Union(set)
		if deadline > 0 {
			next.DrainDeadline = time.Now().Add(deadline).UTC()
		}
	}
	if err := s.commit(&next); err != nil {
		return Record{}, err
	}
	s.log.Info("drain", "container_id", id, "ports", set.String(), "undo", undo)
	return next, nil
}

// DrainState lists the ports container id drains and the flows that still
// reach it on each (the kernel's pins).
func (s *Isolator) DrainState(id string) []plane.DrainPort {
	if dr, ok := s.dp.(Drainer); ok {
		return dr.DrainState(id)
	}
	return nil
}

// prepareHandoff checks a Prepare's handoff (the predecessor exists and
// holds every handed-over port, each among the ports asked for) and makes
// the predecessor's handed-over exclusive ports shared. It returns the
// successor's request with the handed-over ports shared.
func (s *Isolator) prepareHandoff(ctx context.Context, id string, o *PrepareOptions, excl, shared ephemeral.Set) (_, _ ephemeral.Set, undo func(), _ error) {
	if o.HandoffFrom == "" {
		if len(o.HandoffPorts) > 0 {
			return excl, shared, nil, errorf(ErrInvalidArgument, "handoff_ports: given without handoff_from")
		}
		return excl, shared, nil, nil
	}
	if o.HandoffFrom == id {
		return excl, shared, nil, errorf(ErrInvalidArgument, "handoff_from: %s cannot succeed itself", id)
	}
	if len(o.HandoffPorts) == 0 {
		return excl, shared, nil, errorf(ErrInvalidArgument, "handoff_ports: name the ports %s hands over", o.HandoffFrom)
	}
	asked := excl.Union(shared)
	for _, p := range o.HandoffPorts {
		if p == 0 || !asked.Contains(p) {
			return excl, shared, nil, errorf(ErrInvalidArgument, "handoff_ports: port %d is not among the ports %s asks for (%s)", p, id, portsString(excl, shared))
		}
	}
	hand := ephemeral.PortSet(o.HandoffPorts...)
	if _, exists := s.get(id); exists {
		return excl.Subtract(hand), shared.Union(hand), nil, nil // a repeated Prepare: compared as such
	}
	unlock := s.locks.lock(o.HandoffFrom)
	defer unlock()
	pred, ok := s.get(o.HandoffFrom)
	if !ok {
		return excl, shared, nil, errorf(ErrInvalidArgument, "handoff_from: container %s is not known", o.HandoffFrom)
	}
	for _, p := range hand.Ports() {
		if !pred.Ports.Union(pred.Shared).Contains(p) {
			return excl, shared, nil, errorf(ErrFailedPrecondition, "handoff_ports: port %d is not held by %s (held by %s)", p, o.HandoffFrom, s.holderNames(p))
		}
	}
	if pred.State != StateIsolated && pred.State != StatePrepared {
		return excl, shared, nil, errorf(ErrFailedPrecondition, "handoff_from: %s is %s", o.HandoffFrom, pred.State)
	}
	if toShare := hand.Intersect(pred.Ports); !toShare.Empty() {
		if _, err := s.updatePorts(ctx, pred, pred.Ports.Subtract(toShare), pred.Shared.Union(toShare)); err != nil {
			return excl, shared, nil, err
		}
		undo = func() { s.unshareHandoff(context.WithoutCancel(ctx), o.HandoffFrom, id, toShare) }
	}
	return excl.Subtract(hand), shared.Union(hand), undo, nil
}

// unshareHandoff makes ports, which predecessor from held exclusively
// until successor id's Prepare made them shared, exclusive again after
// that Prepare failed: those it still holds as shared ports alone. A
// failure is logged (the ports stay shared ports of their one holder,
// which serve the same traffic).
func (s *Isolator) unshareHandoff(ctx context.Context, from, id string, ports ephemeral.Set) {
	unlock := s.locks.lock(from)
	defer unlock()
	pred, ok := s.get(from)
	if !ok {
		return
	}
	_, back, err := s.exclusiveAgain(ctx, pred, ports)
	switch {
	case err != nil:
		s.log.Warn("handoff: the successor's prepare failed, and the predecessor's ports stay shared ports of their one holder",
			"container_id", from, "successor", id, "ports", back.String(), "err", err)
	case !back.Empty():
		s.log.Info("handoff: the successor's prepare failed; the predecessor holds its ports exclusively again",
			"container_id", from, "successor", id, "ports", back.String())
	}
}

// exclusiveAgain makes those of ports that r holds as shared ports, alone
// and not draining, exclusive ports of r again (r's lock held). It returns
// the updated record and those ports (none: r as it was).
func (s *Isolator) exclusiveAgain(ctx context.Context, r Record, ports ephemeral.Set) (Record, ephemeral.Set, error) {
	var alone []uint16
	s.mu.Lock()
	for _, p := range ports.Intersect(r.Shared).Subtract(r.Draining).Ports() {
		if hs := s.ledger.Holders(p); len(hs) == 1 && hs[0].Container == r.ID {
			alone = append(alone, p)
		}
	}
	s.mu.Unlock()
	set := ephemeral.PortSet(alone...)
	if set.Empty() {
		return r, set, nil
	}
	next, err := s.updatePorts(ctx, r, r.Ports.Union(set), r.Shared.Subtract(set))
	return next, set, err
}

// finishHandoff drains the predecessor of isolated successor r on the
// handed-over ports and clears the pending handoff. id's lock is held; it
// takes the predecessor's.
func (s *Isolator) finishHandoff(ctx context.Context, r Record) (Record, error) {
	if r.HandoffFrom == "" || r.State != StateIsolated {
		return r, nil
	}
	unlock := s.locks.lock(r.HandoffFrom)
	pred, ok := s.get(r.HandoffFrom)
	var err error
	if ok && pred.State == StateIsolated {
		held := r.HandoffPorts.Intersect(pred.Ports.Union(pred.Shared))
		if !held.Empty() {
			_, err = s.drainLocked(ctx, r.HandoffFrom, held.Ports(), false, 0)
		}
	}
	unlock()
	if err != nil {
		return r, err
	}
	next := r
	next.HandoffFrom, next.HandoffPorts = "", ephemeral.Set{}
	if err := s.commit(&next); err != nil {
		return r, err
	}
	s.log.Info("handoff", "container_id", r.ID, "from", r.HandoffFrom, "ports", r.HandoffPorts.String())
	return next, nil
}

// finishHandoffs completes, after recovery, the handoffs of successors
// that were isolated before the daemon stopped but whose predecessor had
// not drained yet (a crash in between). Failures are logged.
func (s *Isolator) finishHandoffs(ctx context.Context) {
	s.mu.Lock()
	var pending []string
	for id, r := range s.records {
		if r.HandoffFrom != "" && r.State == StateIsolated {
			pending = append(pending, id)
		}
	}
	s.mu.Unlock()
	for _, id := range pending {
		unlock := s.locks.lock(id)
		if r, ok := s.get(id); ok {
			if _, err := s.finishHandoff(ctx, r); err != nil {
				s.log.Error("recover: handoff: the predecessor does not drain", "container_id", id, "from", r.HandoffFrom, "err", err)
			}
		}
		unlock()
	}
}

// settleSuccessors gives the successors of pred (cleaned up) back the
// handed-over ports they asked for exclusively, once each holds such a
// port alone: an ordinary port update (shared to exclusive, make-before-
// break). pred nil: nothing. Failures are logged; the port stays shared.
func (s *Isolator) settleSuccessors(ctx context.Context, pred *Record) {
	if pred == nil {
		return
	}
	held := pred.Ports.Union(pred.Shared)
	s.mu.Lock()
	var ids []string
	for id, r := range s.records {
		if !r.HandoffExclusive.Intersect(held).Empty() {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	for _, id := range ids {
		unlock := s.locks.lock(id)
		s.settleSuccessor(ctx, id, held)
		unlock()
	}
}

// settleSuccessor is settleSuccessors for one successor; its lock is held.
func (s *Isolator) settleSuccessor(ctx context.Context, id string, held ephemeral.Set) {
	r, ok := s.get(id)
	if !ok || r.State != StateIsolated && r.State != StatePrepared {
		return
	}
	next, alone, err := s.exclusiveAgain(ctx, r, r.HandoffExclusive.Intersect(held))
	if err != nil {
		s.log.Warn("handoff: the successor keeps its handed-over ports shared", "container_id", id, "ports", alone.String(), "err", err)
		return
	}
	if alone.Empty() {
		return
	}
	next.HandoffExclusive = next.HandoffExclusive.Subtract(alone)
	next.Draining = next.Draining.Subtract(alone)
	if err := s.commit(&next); err != nil {
		s.log.Warn("handoff: persist", "container_id", id, "err", err)
	}
}

// syncDrains brings the records' Draining in line with the kernel's drain
// markers after recovery (the data plane read them at Adopt): a record
// written before a crash may miss a drain the kernel holds, or list one it
// does not. Failures to persist are logged.
func (s *Isolator) syncDrains() {
	dr, ok := s.dp.(Drainer)
	if !ok {
		return
	}
	s.mu.Lock()
	var ids []string
	for id, r := range s.records {
		if r.State == StateIsolated && (!r.Shared.Empty() || !r.Draining.Empty()) {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	for _, id := range ids {
		unlock := s.locks.lock(id)
		if r, ok := s.get(id); ok {
			var ports []uint16
			for _, d := range dr.DrainState(id) {
				ports = append(ports, d.Port)
			}
			kernel := ephemeral.PortSet(ports...)
			if !kernel.Equal(r.Draining) {
				next := r
				next.Draining = kernel
				if err := s.commit(&next); err != nil {
					s.log.Warn("recover: record the drains the kernel holds", "container_id", id, "err", err)
				} else {
					s.log.Info("recover: drains from the kernel", "container_id", id, "draining", kernel.String(), "recorded", r.Draining.String())
				}
			}
		}
		unlock()
	}
}
