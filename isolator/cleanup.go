package isolator

import (
	"context"
	"strings"
	"time"
)

// Cleanup removes everything of a container, then releases its ports.
// Cleaning an unknown or never-isolated container succeeds.
func (s *Isolator) Cleanup(ctx context.Context, id string) (err error) {
	defer s.observe("cleanup", time.Now(), &err)
	if err := validateID(id); err != nil {
		return err
	}
	var done *Record
	defer func() { s.settleSuccessors(ctx, done) }() // after the unlock below
	unlock := s.locks.lock(id)
	defer unlock()
	r, ok := s.get(id)
	if !ok {
		return nil
	}
	if err := s.cleanup(ctx, &r); err != nil {
		return err
	}
	done = &r
	return nil
}

// CleanupIfLabeled is Cleanup of a container carrying each of want's labels
// with its value; one lacking any is kept (kept is true) and nothing
// changes. The labels are checked under the container's lock, so a
// container replaced meanwhile is never removed on another's behalf.
func (s *Isolator) CleanupIfLabeled(ctx context.Context, id string, want map[string]string) (kept bool, err error) {
	defer s.observe("cleanup", time.Now(), &err)
	if err := validateID(id); err != nil {
		return false, err
	}
	var done *Record
	defer func() { s.settleSuccessors(ctx, done) }() // after the unlock below
	unlock := s.locks.lock(id)
	defer unlock()
	r, ok := s.get(id)
	if !ok {
		return false, nil
	}
	if !r.HasLabels(want) {
		return true, nil
	}
	if err := s.cleanup(ctx, &r); err != nil {
		return false, err
	}
	done = &r
	return false, nil
}

// HasLabels reports whether r carries each of want's labels with its value.
func (r Record) HasLabels(want map[string]string) bool {
	for k, v := range want {
		if got, ok := r.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// cleanup tears a container down; the per-container lock is held.
func (s *Isolator) cleanup(ctx context.Context, r *Record) error {
	if r.State != StatePrepared {
		next := *r
		next.State = StateCleaning
		if err := s.intend(&next); err != nil {
			return err
		}
		s.at("cleanup:intent")
		rep, err := s.dp.Teardown(ctx, s.container(r))
		if err != nil {
			return wrapf(ErrInternal, err, "cleanup of %s", r.ID)
		}
		if len(rep.Missing) > 0 {
			s.log.Info("cleanup found objects already gone", "container_id", r.ID, "missing", strings.Join(rep.Missing, ", "))
		}
		s.at("cleanup:torndown")
		s.store.DelLater(r.ID, func(err error) { s.deleted(r.ID, next.Seq, err) })
		s.forget(r.ID)
		s.log.Info("cleaned up", "container_id", r.ID)
		return nil
	}
	// The prepared intent first: one left after the removal would bring
	// the container back at the next start (store/intents.go). When it cannot
	// be removed (a full disk: a removal is a line appended), the record
	// stays too.
	if err := s.store.Unintend(r.ID, 0); err != nil {
		return wrapf(ErrInternal, err, "persist cleanup of %s", r.ID)
	}
	if err := s.store.Del(r.ID); err != nil {
		return wrapf(ErrInternal, err, "persist cleanup of %s", r.ID)
	}
	s.at("cleanup:deleted")
	s.forget(r.ID)
	s.log.Info("cleaned up", "container_id", r.ID)
	return nil
}

// deleted is called once the removal of the record of a container torn
// down (its cleaning intent numbered seq) is committed. The caller was
// answered before: the container's kernel objects are gone and its intent
// is in the journal, so a daemon killed before the commit finishes the
// cleanup at its next start (the journal's intent), and a machine that
// loses power before it comes back with a record of an isolated container
// whose namespace is gone, which recovery cleans up too. The removal was
// queued before the call returned, so every later write (a container
// taking the same slot or ports) is committed with it or after it. The
// intent is removed under the container's lock unless a newer one of the
// same ID replaced it. A failed removal is tried once more, unless a
// container of the same ID was prepared since (its record replaced the
// old one).
func (s *Isolator) deleted(id string, seq uint64, err error) {
	unlock := s.locks.lock(id)
	defer unlock()
	if _, again := s.get(id); err != nil && !again {
		err = s.store.Del(id)
	} else {
		err = nil
	}
	if err != nil {
		s.log.Error("persist cleanup: the record stays in the state until the next start finishes the cleanup", "container_id", id, "err", err.Error())
		return
	}
	s.store.Settled(id, seq)
}
