package isolator

import (
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
)

// isolatedStored is called once the isolated record of container id, whose
// isolating intent is numbered intent, is committed. The caller was
// answered before, with the intent still in the journal: a daemon killed
// before the commit finds the intent at its next start and, the plumbing
// being complete, records the container as isolated (the answer it gave);
// a machine that loses power loses the intent and the kernel objects alike
// (see store/intents.go) and comes back with the prepared record, nothing in the
// kernel. The write was queued before the answer, so every later write of
// the container is committed with it or after it. The intent is removed
// under the container's lock unless a newer one replaced it; after a
// failed commit it stays, for the next start to resolve.
func (s *Isolator) isolatedStored(id string, intent uint64, err error) {
	s.stored(id, intent, "isolated", err)
}

// preparedStored is called once the prepared record of container id,
// whose prepared intent is numbered intent, is committed. The caller was
// answered before, with the record in the journal: a daemon killed before
// the commit finds it there at its next start (store/intents.go). The intent is
// removed under the container's lock unless a newer one (an Isolate's)
// replaced it; after a failed commit it stays, for the next start.
func (s *Isolator) preparedStored(id string, intent uint64, err error) {
	s.stored(id, intent, "prepared", err)
}

// stored removes container id's intent numbered intent once the record
// (a state) it stands for is committed (err nil); after a failed commit
// the intent stays, for the next start to resolve.
func (s *Isolator) stored(id string, intent uint64, state string, err error) {
	unlock := s.locks.lock(id)
	defer unlock()
	if err != nil {
		s.log.Error("persist "+state+" container: its intent stays in the journal for the next start to resolve", "container_id", id, "err", err)
		return
	}
	s.store.Settled(id, intent)
}

// commit persists r (a stable state, in the database; its intent, if any,
// is then removed) and publishes it in memory.
func (s *Isolator) commit(r *Record) error {
	if err := s.store.Put(r); err != nil {
		return wrapf(ErrInternal, err, "persist container %s", r.ID)
	}
	s.at("commit:stored")
	s.store.Settled(r.ID, 0)
	s.publish(r)
	return nil
}

// intend persists r, a transitional state written before the kernel is
// touched, in the intent journal (store/intents.go), and publishes it in memory.
func (s *Isolator) intend(r *Record) error {
	if r.State != StateIsolating {
		s.waitPrepared(r.ID) // (preparequeue.go)
	}
	if err := s.store.Intend(r); err != nil {
		return wrapf(ErrInternal, err, "persist container %s", r.ID)
	}
	s.publish(r)
	return nil
}

// publish replaces the in-memory record of r's container by r.
func (s *Isolator) publish(r *Record) {
	s.mu.Lock()
	if cur, ok := s.records[r.ID]; ok {
		*cur = *r
		s.view.show(cur)
	}
	s.mu.Unlock()
}

// container converts a record to the data plane's view. The namespace is
// reached through the pin once there is one; while isolating, the pin is
// only planned (Mount and PinOwned from PlanPin), so through the target.
func (s *Isolator) container(r *Record) plane.Container {
	ns := r.NetNSPath
	if r.Mount != "" && r.State != StateIsolating {
		ns = r.Mount
	}
	return plane.Container{ID: r.ID, Slot: r.Slot, NetNS: ns, Ephemeral: r.Ephemeral, Ports: r.Ports, Shared: r.Shared,
		Egress: r.Egress, Ingress: r.Ingress, Pin: r.Mount, PinOwned: r.PinOwned,
		Meta: plane.Meta{Created: unixOrZero(r.Created), Labels: r.Labels, PinOwned: r.PinOwned}}
}

func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

// Key, Sequence, SetSequence and LoadAlone make a *Record a store.Entry.

// Key is the record's key in the store: its container ID.
func (r *Record) Key() string { return r.ID }

// Sequence is the number of the record's last write (intents.go in
// package store).
func (r *Record) Sequence() uint64 { return r.Seq }

// SetSequence sets the number of the record's write.
func (r *Record) SetSequence(n uint64) { r.Seq = n }

// LoadAlone reports whether r, found in the intent journal with no record
// in the database, is its Prepare's record whose commit had not landed
// (prepared or isolating) rather than the leftover of a removed container.
func (r *Record) LoadAlone() bool { return r.State == StatePrepared || r.State == StateIsolating }
