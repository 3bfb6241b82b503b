package isolator

import (
	"context"
	"errors"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

// Prepare reserves the static ports and an ephemeral block for a container.
// Repeating it with the same ports returns the same container; different
// ports get ErrAlreadyExists.
func (s *Isolator) Prepare(ctx context.Context, id string, ports []PortSpec) (Record, error) {
	return s.PrepareWith(ctx, id, PrepareOptions{Ports: ports})
}

// PrepareOptions is what a Prepare asks for.
type PrepareOptions struct {
	Ports []PortSpec
	// Labels are stored alongside the container (for example the CNI
	// network it belongs to).
	Labels map[string]string
	// Egress and Ingress are the container's bandwidth limits; nil takes
	// the daemon's default (Config.Egress, Config.Ingress).
	Egress, Ingress *LimitSpec
	// HandoffFrom names a predecessor that hands HandoffPorts (among
	// Ports) over to this container once it is isolated (drain.go).
	HandoffFrom  string
	HandoffPorts []uint16
}

// PrepareWith is Prepare with labels and bandwidth limits. Repeating it
// returns the same container when the ports, and the limits it gives, are
// the same; labels are not compared.
func (s *Isolator) PrepareWith(ctx context.Context, id string, o PrepareOptions) (_ Record, err error) {
	defer s.observe("prepare", time.Now(), &err)
	if err := validateID(id); err != nil {
		return Record{}, err
	}
	labels := o.Labels
	if err := validateLabels(labels); err != nil {
		return Record{}, err
	}
	excl, shared, err := ParsePorts("ports", o.Ports)
	if err != nil {
		return Record{}, err
	}
	defEg, defIn := s.DefaultLimits()
	eg, err := s.resolveLimit("egress_limit", o.Egress, defEg)
	if err != nil {
		return Record{}, err
	}
	in, err := s.resolveLimit("ingress_limit", o.Ingress, defIn)
	if err != nil {
		return Record{}, err
	}
	askedExcl := excl
	var undoHandoff func()
	if excl, shared, undoHandoff, err = s.prepareHandoff(ctx, id, &o, excl, shared); err != nil {
		return Record{}, err
	}
	// A Prepare failing after the predecessor's ports became shared gives
	// them back (after id's lock, released below, as prepareHandoff took
	// the predecessor's without it).
	defer func() {
		if err != nil && undoHandoff != nil {
			undoHandoff()
		}
	}()
	unlock := s.locks.lock(id)
	defer unlock()

	s.mu.Lock()
	if r, ok := s.records[id]; ok {
		s.mu.Unlock()
		samePorts := r.Ports.Equal(excl) && r.Shared.Equal(shared)
		sameLimits := (o.Egress == nil || r.Egress == eg) && (o.Ingress == nil || r.Ingress == in)
		switch {
		case samePorts && sameLimits:
			return *r, nil
		case !samePorts:
			return Record{}, errorf(ErrAlreadyExists, "container_id: %s is already prepared with ports %s (asked for %s)", id, portsString(r.Ports, r.Shared), portsString(excl, shared))
		}
		return Record{}, errorf(ErrAlreadyExists, "container_id: %s is already prepared with egress limit %s and ingress limit %s (asked for %s and %s; Update changes limits)",
			id, LimitString(r.Egress), LimitString(r.Ingress), LimitString(eg), LimitString(in))
	}
	// The ports first: a conflict says more than an exhausted pool.
	if err := s.ledger.Reserve(id, ephemeral.Request{Exclusive: excl, Shared: shared}); err != nil {
		s.mu.Unlock()
		return Record{}, ledgerError(id, err)
	}
	slot, ok := s.slots.take()
	if !ok {
		s.ledger.Release(id)
		s.mu.Unlock()
		return Record{}, errorf(ErrResourceExhausted, "no container slot left (at most %d containers)", plane.MaxSlot)
	}
	block, err := s.alloc.Allocate()
	if err != nil {
		s.ledger.Release(id)
		s.slots.put(slot)
		s.mu.Unlock()
		if errors.Is(err, ephemeral.ErrExhausted) {
			return Record{}, errorf(ErrResourceExhausted, "no ephemeral port block left: all %d blocks of %d ports in %s are in use", s.alloc.Total(), s.alloc.BlockSize(), s.cfg.EphemeralPool)
		}
		return Record{}, wrapf(ErrInternal, err, "allocate ephemeral block")
	}
	s.mu.Unlock()
	// Host reservations (hostports.go): a host process holding a port refuses the Prepare.
	if err := s.hostReserve(id, excl.Union(shared)); err != nil {
		s.mu.Lock()
		s.ledger.Release(id)
		s.slots.put(slot)
		_ = s.alloc.Release(block)
		s.mu.Unlock()
		return Record{}, err
	}
	s.mu.Lock()
	r := &Record{ID: id, State: StatePrepared, Slot: slot, Ephemeral: block, Ports: excl, Shared: shared, Created: time.Now().UTC(), Labels: labels,
		Egress: eg, Ingress: in}
	if o.HandoffFrom != "" {
		r.HandoffFrom = o.HandoffFrom
		r.HandoffPorts = ephemeral.PortSet(o.HandoffPorts...)
		r.HandoffExclusive = r.HandoffPorts.Intersect(askedExcl)
	}
	s.records[id] = r
	s.view.show(r)
	rec := *r
	s.mu.Unlock()

	// The answer waits for the prepared record in the journal, not for
	// its commit (preparedStored). The journal is read at the next start
	// whatever the database holds then: a removal still queued of a
	// container cleaned up before (whose slot, ports or block this one
	// may have taken) must have ended first, as it would have if this
	// record had been queued after it.
	s.store.RemovalsEnded()
	if err := s.store.Intend(&rec); err != nil {
		s.forget(id)
		return Record{}, wrapf(ErrInternal, err, "persist container %s", id)
	}
	intent := rec.Seq
	stored := rec
	landed := s.prepared.queued(id)
	if err := s.store.PutLater(&stored, func(err error) { landed(); s.preparedStored(id, intent, err) }); err != nil {
		landed()
		s.store.Settled(id, intent)
		s.forget(id)
		return Record{}, wrapf(ErrInternal, err, "persist container %s", id)
	}
	s.log.Info("prepared", "container_id", id, "ephemeral_ports", block.String(), "ports", portsString(excl, shared), "slot", slot,
		"egress_limit", LimitString(eg), "ingress_limit", LimitString(in))
	return rec, nil
}

// forget drops a container's record from memory and releases everything
// it holds: the bookkeeping under s.mu, then its host reservations (closing
// sockets) after it. Its host ports stay counted as held until then, so no
// other container's reservation of one is lost in between.
func (s *Isolator) forget(id string) {
	s.mu.Lock()
	r, ok := s.records[id]
	if ok {
		delete(s.records, id)
		s.view.hide(id)
		if s.netnsOwner[r.NetNSIno] == id {
			delete(s.netnsOwner, r.NetNSIno)
		}
		s.ledger.Release(id)
		if err := s.alloc.Release(r.Ephemeral); err != nil {
			s.log.Warn("release ephemeral block", "container_id", id, "range", r.Ephemeral.String(), "err", err)
		}
		s.slots.put(r.Slot)
	}
	s.mu.Unlock()
	if ok {
		s.hostPorts.settle(id, ephemeral.Set{})
	}
}

// releaseNetNS drops id's claim on a namespace (after a failed isolate).
func (s *Isolator) releaseNetNS(ino uint64, id string) {
	s.mu.Lock()
	if s.netnsOwner[ino] == id {
		delete(s.netnsOwner, ino)
	}
	s.mu.Unlock()
}
