package isolator

import (
	"context"
	"time"
)

// IsolateIfLabeled is Isolate of a container carrying each of want's
// labels with its value (nil: any container); one lacking any is not
// isolated (differ is true, r is its record) and nothing changes. was
// tells that the container was isolated already (Isolate's idempotent
// repeat, or its error for another target). The labels are checked and the
// container isolated under one hold of its lock, so a container replaced
// after the caller prepared it (another caller's Cleanup and Prepare of
// the same id) is never isolated into this caller's namespace.
func (s *Isolator) IsolateIfLabeled(ctx context.Context, id string, want map[string]string, t IsolateTarget) (r Record, differ, was bool, err error) {
	defer s.observe("isolate", time.Now(), &err)
	if err := validateID(id); err != nil {
		return Record{}, false, false, err
	}
	s.at("isolate:lock")
	unlock := s.locks.lock(id)
	defer unlock()
	if cur, ok := s.get(id); ok {
		if !cur.HasLabels(want) {
			return cur, true, false, nil
		}
		was = cur.State == StateIsolated
	}
	r, err = s.isolateLocked(ctx, id, t)
	if err == nil && r.HandoffFrom != "" {
		// The successor is isolated: its predecessor drains now. A failure
		// leaves the handoff pending (both serve new flows) and is logged.
		if done, herr := s.finishHandoff(ctx, r); herr != nil {
			s.log.Error("handoff: the predecessor does not drain", "container_id", id, "from", r.HandoffFrom, "err", herr)
		} else {
			r = done
		}
	}
	return r, false, was, err
}
