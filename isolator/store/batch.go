package store

import (
	"fmt"
	"slices"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Every lifecycle step writes its outcome to the database
// (its intent goes to the journal, intents.go), and each bbolt transaction
// costs two fsyncs. Writes of concurrent calls (a burst of setups, a node
// drain) share one transaction: a write arriving when none is under way is
// committed at once (by a goroutine of its own); writes arriving meanwhile
// queue up and the next commit takes them all, in the order they came. A
// lone write is never held back for others, and a writer that waits
// (update) returns once its own batch is committed, never before its
// transaction is on disk; DelLater and PutLater do not wait.

// groupCommit batches the writes of one store.
type groupCommit struct {
	mu      sync.Mutex
	queue   []*write
	running bool
	// Removals queued by DelLater are numbered (issued); removed is the
	// highest number whose transaction has ended (writes end in the order
	// they were queued). removedCond is signalled when it grows.
	issued, removed uint64
	removedCond     *sync.Cond // on mu
}

// write is one queued change and where its outcome goes.
type write struct {
	fn      func(*bolt.Tx) error
	done    chan error
	removal uint64 // its number if it is a removal queued by DelLater, else 0
	del     bool   // it removes a record (commitBatch syncs the journal first)
}

// update runs fn in a write transaction shared with the writes queued at the
// same time, and returns once that transaction is committed.
func (s *Store[R, P]) update(fn func(*bolt.Tx) error) error {
	return <-s.enqueue(fn)
}

// enqueue queues fn and returns where its outcome goes. Writes are
// committed in the order they were queued: a write queued later is in the
// same transaction or a later one.
func (s *Store[R, P]) enqueue(fn func(*bolt.Tx) error) <-chan error {
	return s.enqueueWrite(&write{fn: fn})
}

// enqueueWrite queues w (enqueue); a removal is numbered here.
func (s *Store[R, P]) enqueueWrite(w *write) <-chan error {
	g := &s.group
	w.done = make(chan error, 1)
	g.mu.Lock()
	if w.removal != 0 {
		g.issued++
		w.removal = g.issued
	}
	g.queue = append(g.queue, w)
	if !g.running {
		g.running = true
		go s.commitQueue()
	}
	g.mu.Unlock()
	return w.done
}

// DelLater queues the removal of id's record and returns at once; done
// receives the outcome once committed. Close waits for it.
func (s *Store[R, P]) DelLater(id string, done func(error)) {
	s.whenCommitted(s.enqueueWrite(&write{fn: delRecord(id), removal: 1, del: true}), done)
}

// RemovalsEnded waits until every removal queued by DelLater before the
// call has ended (committed, or failed: its caller retries it). A write
// that must never reach the disk before such a removal (a record taking
// the slot, ports or block a removed container released) waits for it
// when it is not itself queued after the removal (Prepare's record goes
// to the journal first).
func (s *Store[R, P]) RemovalsEnded() {
	g := &s.group
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.removedCond == nil {
		g.removedCond = sync.NewCond(&g.mu)
	}
	for want := g.issued; g.removed < want; {
		g.removedCond.Wait()
	}
}

// PutLater queues the write of r (setting its sequence number) and returns
// at once; done receives the outcome once committed. Close waits for it.
func (s *Store[R, P]) PutLater(r P, done func(error)) error {
	w, err := s.putRecord(r)
	if err != nil {
		return err
	}
	s.whenCommitted(s.enqueue(w), done)
	return nil
}

// whenCommitted hands a queued write's outcome to done, on a goroutine of
// its own; Close waits for it.
func (s *Store[R, P]) whenCommitted(ch <-chan error, done func(error)) {
	s.later.Add(1)
	go func() {
		defer s.later.Done()
		done(<-ch)
	}()
}

// commitQueue commits the queued writes, batch after batch, until the queue
// is empty. It runs on a goroutine of its own so that every writer returns
// as soon as its own batch is committed.
func (s *Store[R, P]) commitQueue() {
	g := &s.group
	g.mu.Lock()
	for len(g.queue) > 0 {
		batch := g.queue
		g.queue = nil
		g.mu.Unlock()
		s.commitBatch(batch)
		g.mu.Lock()
		for _, w := range batch {
			g.removed = max(g.removed, w.removal)
		}
		if g.removedCond != nil {
			g.removedCond.Broadcast()
		}
	}
	g.running = false
	g.mu.Unlock()
}

// commitBatch commits the writes in one transaction; if one of them fails,
// the transaction is rolled back and each write is committed on its own, so
// that one bad write fails alone.
func (s *Store[R, P]) commitBatch(batch []*write) {
	// A record's removal reaches the disk only after the journal lines
	// written before it (intentLog.sync): a power loss must never keep the
	// removal and lose a tombstone, which would bring back an intent of the
	// removed container (a prepared one: a record the next start adds).
	if s.intents != nil && slices.ContainsFunc(batch, func(w *write) bool { return w.del }) {
		if err := s.intents.sync(); err != nil {
			err = fmt.Errorf("sync the intent journal before a removal: %w", err)
			for _, w := range batch {
				w.done <- err
			}
			return
		}
	}
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
