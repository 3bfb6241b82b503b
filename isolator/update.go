package isolator

import (
	"context"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane/rate"
)

// Update changes the static ports of a container, all or nothing.
func (s *Isolator) Update(ctx context.Context, id string, ports []PortSpec) (_ Record, err error) {
	return s.UpdateWith(ctx, id, UpdateOptions{Ports: ports})
}

// UpdateOptions is what an Update changes.
type UpdateOptions struct {
	// Ports is the complete new list of static ports, unless KeepPorts:
	// then the ports stay as they are and Ports must be empty.
	Ports     []PortSpec
	KeepPorts bool
	// Egress and Ingress are new bandwidth limits; nil keeps the current
	// one, a zero Rate removes it.
	Egress, Ingress *LimitSpec
}

// UpdateWith changes the static ports and/or the bandwidth limits of a
// container, all or nothing: the limits first (in place, see
// DataPlane.SetLimits), then the ports; if the ports fail, the limits are
// put back.
func (s *Isolator) UpdateWith(ctx context.Context, id string, o UpdateOptions) (_ Record, err error) {
	defer s.observe("update", time.Now(), &err)
	if err := validateID(id); err != nil {
		return Record{}, err
	}
	if o.KeepPorts && len(o.Ports) > 0 {
		return Record{}, errorf(ErrInvalidArgument, "ports: must be empty when keep_ports is set")
	}
	excl, shared, err := ParsePorts("ports", o.Ports)
	if err != nil {
		return Record{}, err
	}
	var eg, in *rate.Limit
	for _, x := range []struct {
		field string
		spec  *LimitSpec
		out   **rate.Limit
	}{{"egress_limit", o.Egress, &eg}, {"ingress_limit", o.Ingress, &in}} {
		if x.spec != nil {
			l, err := ParseLimit(x.field, *x.spec, s.Host())
			if err != nil {
				return Record{}, err
			}
			*x.out = &l
		}
	}
	unlock := s.locks.lock(id)
	defer unlock()

	s.mu.Lock()
	r, ok := s.records[id]
	if !ok {
		s.mu.Unlock()
		return Record{}, errorf(ErrNotFound, "container_id: %s is not known", id)
	}
	cur := *r
	s.mu.Unlock()
	if o.KeepPorts {
		excl, shared = cur.Ports, cur.Shared
	}
	newEg, newIn := cur.Egress, cur.Ingress
	if eg != nil {
		newEg = *eg
	}
	if in != nil {
		newIn = *in
	}
	samePorts := cur.Ports.Equal(excl) && cur.Shared.Equal(shared)
	sameLimits := newEg == cur.Egress && newIn == cur.Ingress
	if samePorts && sameLimits {
		return cur, nil
	}
	if cur.State != StatePrepared && cur.State != StateIsolated {
		return Record{}, errorf(ErrFailedPrecondition, "container_id: %s is %s", id, cur.State)
	}
	if sameLimits {
		return s.updatePorts(ctx, cur, excl, shared)
	}
	next, err := s.updateLimits(ctx, cur, newEg, newIn)
	if err != nil || samePorts {
		return next, err
	}
	done, err := s.updatePorts(ctx, next, excl, shared)
	if err != nil {
		if _, rerr := s.updateLimits(ctx, next, cur.Egress, cur.Ingress); rerr != nil {
			s.log.Error("put the limits back after a failed port update", "container_id", id, "err", rerr)
		}
		return Record{}, err
	}
	return done, nil
}

// updateLimits sets a container's limits; the per-container lock is held.
// The new limits are persisted before the kernel changes: a daemon killed
// in between finds them in the record, and recovery (Adopt) brings the
// kernel to them.
func (s *Isolator) updateLimits(ctx context.Context, cur Record, eg, in rate.Limit) (Record, error) {
	next := cur
	next.Egress, next.Ingress = eg, in
	if err := s.commit(&next); err != nil {
		return Record{}, err
	}
	if cur.State == StateIsolated {
		s.at("limits:intent")
		if err := s.dp.SetLimits(ctx, s.container(&next), eg, in); err != nil {
			back := cur
			if perr := s.commit(&back); perr != nil {
				s.log.Error("persist rollback", "container_id", cur.ID, "err", perr)
			}
			return Record{}, wrapf(ErrInternal, err, "update bandwidth limits of %s", cur.ID)
		}
	}
	s.log.Info("updated", "container_id", cur.ID, "egress_limit", LimitString(eg), "ingress_limit", LimitString(in))
	return next, nil
}

// updatePorts changes a container's static ports; the per-container lock is
// held.
func (s *Isolator) updatePorts(ctx context.Context, cur Record, excl, shared ephemeral.Set) (_ Record, err error) {
	id := cur.ID
	// Host reservations (hostports.go): on failure keep the old ports', on success the new ones'.
	defer func() {
		if err != nil {
			s.hostPorts.settle(id, cur.Ports.Union(cur.Shared))
		} else {
			s.hostPorts.settle(id, excl.Union(shared))
		}
	}()
	s.mu.Lock()
	// Hold old ∪ new while the kernel moves over, so no other container can
	// take a port whose filters still point here.
	hold := ephemeral.Request{Exclusive: cur.Ports.Union(excl), Shared: cur.Shared.Union(shared).Subtract(cur.Ports.Union(excl))}
	if err := s.ledger.Update(id, ephemeral.Request{Exclusive: excl, Shared: shared}); err != nil {
		s.mu.Unlock()
		return Record{}, ledgerError(id, err)
	}
	s.mu.Unlock()
	if err := s.hostReserve(id, excl.Union(shared)); err != nil {
		s.mu.Lock()
		_ = s.ledger.Update(id, ephemeral.Request{Exclusive: cur.Ports, Shared: cur.Shared})
		s.mu.Unlock()
		return Record{}, err
	}
	s.mu.Lock()
	if cur.State == StatePrepared {
		next := cur
		next.Ports, next.Shared = excl, shared
		s.mu.Unlock()
		if err := s.commit(&next); err != nil {
			s.mu.Lock()
			_ = s.ledger.Update(id, ephemeral.Request{Exclusive: cur.Ports, Shared: cur.Shared})
			s.mu.Unlock()
			return Record{}, err
		}
		s.log.Info("updated", "container_id", id, "ports", portsString(excl, shared))
		return next, nil
	}
	if err := s.ledger.Update(id, hold); err != nil {
		// The union can only fail if a port changed between exclusive and shared;
		// then holding the new set alone is what we can do.
		s.log.Debug("hold union", "container_id", id, "err", err)
	}
	s.mu.Unlock()

	next := cur
	next.State = StateUpdating
	next.NewPorts, next.NewShared = &excl, &shared
	restore := func() {
		s.mu.Lock()
		_ = s.ledger.Update(id, ephemeral.Request{Exclusive: cur.Ports, Shared: cur.Shared})
		s.mu.Unlock()
	}
	if err := s.intend(&next); err != nil {
		restore()
		return Record{}, err
	}
	s.at("update:intent")
	if err := s.dp.SetPorts(ctx, s.container(&cur), excl, shared); err != nil {
		restore()
		back := cur
		if perr := s.commit(&back); perr != nil {
			s.log.Error("persist rollback", "container_id", id, "err", perr)
		}
		return Record{}, wrapf(ErrInternal, err, "update ports of %s", id)
	}
	done := cur
	done.Ports, done.Shared = excl, shared
	if err := s.commit(&done); err != nil {
		return Record{}, err
	}
	s.mu.Lock()
	_ = s.ledger.Update(id, ephemeral.Request{Exclusive: excl, Shared: shared})
	s.mu.Unlock()
	s.log.Info("updated", "container_id", id, "ports", portsString(excl, shared))
	return done, nil
}
