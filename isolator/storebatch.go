package isolator

import (
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Every lifecycle step writes its record before and after it
// touches the kernel, and each bbolt transaction costs two fsyncs. Writes of
// concurrent calls (a burst of setups, a node drain) share one transaction:
// the first writer commits at once; writers arriving meanwhile queue up and
// the next commit takes them all. A lone write is never delayed, and no
// write returns before its transaction is on disk.

// groupCommit batches the writes of one store.
type groupCommit struct {
	mu      sync.Mutex
	queue   []*write
	running bool
}

// write is one queued change and where its outcome goes.
type write struct {
	fn   func(*bolt.Tx) error
	done chan error
}

// update runs fn in a write transaction shared with the writes queued at the
// same time, and returns once that transaction is committed.
func (s *store) update(fn func(*bolt.Tx) error) error {
	g := &s.group
	w := &write{fn: fn, done: make(chan error, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, w)
	if g.running {
		g.mu.Unlock()
		return <-w.done
	}
	// This caller commits until the queue is empty.
	g.running = true
	for len(g.queue) > 0 {
		batch := g.queue
		g.queue = nil
		g.mu.Unlock()
		s.commitBatch(batch)
		g.mu.Lock()
	}
	g.running = false
	g.mu.Unlock()
	return <-w.done
}

// commitBatch commits the writes in one transaction; if one of them fails,
// the transaction is rolled back and each write is committed on its own, so
// that one bad write fails alone.
func (s *store) commitBatch(batch []*write) {
	var failed error
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, w := range batch {
			if err := w.fn(tx); err != nil {
				failed = err
				return err
			}
		}
		return nil
	})
	if err == nil || len(batch) == 1 {
		for _, w := range batch {
			w.done <- err
		}
		return
	}
	if failed == nil { // the commit itself failed: it fails for all
		for _, w := range batch {
			w.done <- err
		}
		return
	}
	for _, w := range batch {
		w.done <- s.db.Update(w.fn)
	}
}
