package isolator

import "sync"

// Prepared records whose commit is queued. A Prepare answers with its
// record in the journal only (store/intents.go); the journal's record of a
// container with none in the database is loaded at the next start when it
// is prepared or isolating, never when it is cleaning or updating (such an
// intent outlives its record: its removal committed, or a kill before it
// was removed). So a cleanup or a port update, whose intent must be found
// at the next start, writes it only once its container's prepared record
// has landed in the database (waitPrepared); an Isolate does not wait.

// preparedQueue maps a container to a channel closed once its queued
// prepared record's commit has ended.
type preparedQueue struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// queued records that id's prepared record's commit is queued; landed is
// called once it has ended (committed or failed).
func (q *preparedQueue) queued(id string) (landed func()) {
	ch := make(chan struct{})
	q.mu.Lock()
	if q.m == nil {
		q.m = map[string]chan struct{}{}
	}
	q.m[id] = ch
	q.mu.Unlock()
	return func() {
		q.mu.Lock()
		if q.m[id] == ch {
			delete(q.m, id)
		}
		q.mu.Unlock()
		close(ch)
	}
}

// pending returns the channel of id's queued prepared record, nil when
// none is queued.
func (q *preparedQueue) pending(id string) <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.m[id]
}

// waitPrepared waits until the prepared record of container id has landed
// in the database, if its commit is still queued.
func (s *Isolator) waitPrepared(id string) {
	if ch := s.prepared.pending(id); ch != nil {
		s.at("intent:wait")
		<-ch
	}
}
