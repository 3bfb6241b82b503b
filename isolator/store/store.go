// Package store is isolatord's persistence: an embedded bbolt database in
// the state directory holding one JSON record per container, and beside it
// the intent journal (intents.go, journal.go). Every lifecycle step that
// touches the kernel writes the record before (the intent: a transitional
// state, in the journal) and after (the outcome, in the database), so a
// daemon killed at any point finds, for each container, either a stable
// state or an intent that recovery completes or rolls back. Writes of
// concurrent calls share transactions (batch.go).
//
// The store knows its records only as Entry values: a key, a sequence
// number and whether a journal entry alone stands for a record.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var (
	bucketContainers = []byte("containers")
	bucketMeta       = []byte("meta")
)

// schemaVersion is the layout of the database, written in its meta bucket.
const schemaVersion = "1"

// Entry is what a Store keeps: a pointer to a record type that encodes as
// JSON, with a key (the container ID) and a sequence number that the store
// sets at every write (intents.go).
type Entry[R any] interface {
	*R
	Key() string
	Sequence() uint64
	SetSequence(uint64)
	// LoadAlone reports whether this record, found in the journal with
	// no record of its key in the database, is a record whose first
	// commit had not landed (loaded) rather than the leftover of a
	// removed one (ignored).
	LoadAlone() bool
}

// Store is the database and the intent journal of one state directory.
type Store[R any, P Entry[R]] struct {
	db   *bolt.DB
	path string
	log  *slog.Logger
	// loaded holds the records read (and so checked) at open, for the
	// first load.
	loaded []P
	// movedAside is where a corrupt state file was moved at open ("" if
	// none); fault is what was wrong with it.
	movedAside, fault string
	group             groupCommit // batch.go
	// intents is the intent journal; pending are the intents read at
	// open, for the first load.
	intents *intentLog[R, P]
	pending []P
	// journalOnly are the keys load found in the journal alone (their
	// first commit had not landed): recovery commits them.
	journalOnly map[string]bool
	// seq numbers the writes of records (intents.go).
	seq atomic.Uint64
	// later counts the writes queued by DelLater and PutLater not yet
	// committed.
	later sync.WaitGroup
}

// nextSeq is the sequence number of a record's next write.
func (s *Store[R, P]) nextSeq() uint64 { return s.seq.Add(1) }

// Open opens the database (openDB) and the intent journal beside it in
// dir (created if missing). validKey checks the key of a journal entry: an
// entry whose key it refuses is damaged.
func Open[R any, P Entry[R]](dir string, log *slog.Logger, validKey func(string) error) (*Store[R, P], error) {
	st, err := openDB[R, P](dir, log)
	if err != nil {
		return nil, err
	}
	l, intents, bad, err := openIntents[R, P](dir, validKey)
	if err != nil {
		st.Close()
		return nil, err
	}
	for _, name := range bad {
		log.Warn("intent journal: an entry that is not a complete intent is ignored (its step never began, or a power loss or a full disk cut it short)", "entry", name)
	}
	st.intents, st.pending = l, intents
	var top uint64
	for _, r := range append(st.loaded, intents...) {
		top = max(top, r.Sequence())
	}
	st.seq.Store(top)
	return st, nil
}

// openDB opens the database in dir and reads every record. A file that
// cannot be read as a database (bbolt refusing it, a panic or memory fault
// while reading its pages, a record that does not decode) is corrupt: it
// is moved aside to isolatord.db.corrupt-<time> and an empty state is
// created, which recovery then rebuilds from the kernel. Errors of the file
// system (permissions, read-only, no space) and bbolt's lock held by
// another process are returned as they are: nothing is moved.
func openDB[R any, P Entry[R]](dir string, log *slog.Logger) (*Store[R, P], error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, "isolatord.db")
	st, err := openChecked[R, P](path)
	if err == nil || !isCorrupt(err) {
		if st != nil {
			st.log = log
		}
		return st, err
	}
	aside := fmt.Sprintf("%s.corrupt-%s", path, time.Now().UTC().Format("20060102T150405.000Z"))
	if rerr := os.Rename(path, aside); rerr != nil {
		return nil, fmt.Errorf("state %s is corrupt (%v) and could not be moved aside: %w", path, err, rerr)
	}
	log.Error("state file corrupt: moved aside; rebuilding the state from the kernel", "file", path, "fault", err.Error(), "moved_to", aside)
	st, err2 := openChecked[R, P](path)
	if err2 != nil {
		return nil, fmt.Errorf("new state %s after moving the corrupt one aside: %w", path, err2)
	}
	st.movedAside, st.fault, st.log = aside, err.Error(), log
	return st, nil
}

// corruptError marks a fault of the file's content.
type corruptError struct{ err error }

func (e corruptError) Error() string { return e.err.Error() }
func (e corruptError) Unwrap() error { return e.err }

func isCorrupt(err error) bool {
	var c corruptError
	return errors.As(err, &c)
}

// openChecked opens path and reads all of it, with bbolt's panics and
// memory faults (a truncated or damaged mapping) turned into errors.
func openChecked[R any, P Entry[R]](path string) (st *Store[R, P], err error) {
	var db *bolt.DB
	defer func() {
		if err != nil && db != nil {
			db.Close()
		}
	}()
	if err := walkFile(path); err != nil {
		return nil, err
	}
	err = guard(func() error {
		var oerr error
		db, oerr = bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true})
		if oerr != nil {
			db = nil
			return classifyOpen(path, oerr)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = guard(func() error {
		// A file already initialised for this schema is not written (a
		// write transaction is an fsync at every start).
		ready := false
		if err := db.View(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			ready = tx.Bucket(bucketContainers) != nil && meta != nil && string(meta.Get([]byte("schema"))) == schemaVersion
			return nil
		}); err != nil || ready {
			return err
		}
		return db.Update(func(tx *bolt.Tx) error {
			if _, err := tx.CreateBucketIfNotExists(bucketContainers); err != nil {
				return corruptError{err}
			}
			meta, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return corruptError{err}
			}
			if v := meta.Get([]byte("schema")); v != nil && string(v) != schemaVersion {
				return fmt.Errorf("state schema %q, this isolatord understands %q", v, schemaVersion)
			}
			return meta.Put([]byte("schema"), []byte(schemaVersion))
		})
	})
	if err != nil {
		return nil, fmt.Errorf("init state %s: %w", path, err)
	}
	st = &Store[R, P]{db: db, path: path}
	err = guard(func() error {
		recs, err := st.Read()
		if err != nil {
			return corruptError{err}
		}
		st.loaded = recs
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read state %s: %w", path, err)
	}
	return st, nil
}

// walkFile reads every page of an existing state file, read-only, in this
// goroutine, before the file is opened for writing: bbolt rebuilds its free
// list at a writable open in a goroutine of its own, where a damaged page
// would panic out of reach of guard.
func walkFile(path string) error {
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		return nil // missing or empty: bbolt creates a fresh database
	}
	return guard(func() error {
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
		if err != nil {
			return classifyOpen(path, err)
		}
		defer db.Close()
		var walk func(b *bolt.Bucket) error
		walk = func(b *bolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error {
				if v == nil {
					if nb := b.Bucket(k); nb != nil {
						return walk(nb)
					}
				}
				return nil
			})
		}
		err = db.View(func(tx *bolt.Tx) error {
			return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walk(b) })
		})
		if err != nil {
			return corruptError{fmt.Errorf("read state %s: %w", path, err)}
		}
		return nil
	})
}

// classifyOpen names the cause of a failed bolt.Open.
func classifyOpen(path string, err error) error {
	var errno syscall.Errno
	var pe *fs.PathError
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("state %s is locked by another process (an isolatord of another host network namespace with the same --state-dir?): %w", path, err)
	case errors.As(err, &pe), errors.As(err, &errno):
		return fmt.Errorf("open state %s: %w", path, err)
	}
	return corruptError{fmt.Errorf("open state %s: %w", path, err)}
}

// guard runs fn, turning a panic or a memory fault in it into a corrupt
// state error.
func guard(fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			err = corruptError{fmt.Errorf("bbolt: %v", r)}
		}
	}()
	return fn()
}

// Close waits for the writes queued by DelLater and PutLater, then closes
// the database and the journal.
func (s *Store[R, P]) Close() error {
	s.later.Wait()
	err := s.db.Close()
	if s.intents != nil {
		err = errors.Join(err, s.intents.close())
	}
	return err
}

// MovedAside is where a corrupt state file was moved at open ("" if
// none; the log says what was wrong with it).
func (s *Store[R, P]) MovedAside() string { return s.movedAside }

// DB is the database, for tests that hold its writer or count its
// transactions.
func (s *Store[R, P]) DB() *bolt.DB { return s.db }

// WaitQueued waits until the writes queued by DelLater and PutLater so
// far have ended.
func (s *Store[R, P]) WaitQueued() { s.later.Wait() }

// Put writes one record (setting its sequence number).
func (s *Store[R, P]) Put(r P) error {
	w, err := s.putRecord(r)
	if err != nil {
		return err
	}
	return s.update(w)
}

// putRecord numbers r and returns the write that stores it as it is now.
func (s *Store[R, P]) putRecord(r P) (func(*bolt.Tx) error, error) {
	r.SetSequence(s.nextSeq())
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	id := []byte(r.Key())
	return func(tx *bolt.Tx) error { return tx.Bucket(bucketContainers).Put(id, b) }, nil
}

// PutAll writes records in one transaction.
func (s *Store[R, P]) PutAll(rs []P) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketContainers)
		for _, r := range rs {
			r.SetSequence(s.nextSeq())
			v, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(r.Key()), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// Del removes one record; removing a missing record is not an error.
func (s *Store[R, P]) Del(id string) error {
	return <-s.enqueueWrite(&write{fn: delRecord(id), del: true})
}

// delRecord is the write that removes id's record.
func delRecord(id string) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		return tx.Bucket(bucketContainers).Delete([]byte(id))
	}
}

// Load returns every record (the first time: those read at open, with
// the newer intents of the journal in place of their records).
func (s *Store[R, P]) Load() ([]P, error) {
	if s.loaded != nil || s.pending != nil {
		out, added := overlay[R, P](s.loaded, s.pending)
		s.journalOnly = make(map[string]bool, len(added))
		for _, id := range added {
			s.journalOnly[id] = true
		}
		s.loaded, s.pending = nil, nil
		return out, nil
	}
	return s.Read()
}

// JournalOnly reports whether the first Load found id's record in the
// journal alone (its first commit had not landed).
func (s *Store[R, P]) JournalOnly(id string) bool { return s.journalOnly[id] }

// Intend writes r as its key's intent (setting its sequence number).
func (s *Store[R, P]) Intend(r P) error {
	r.SetSequence(s.nextSeq())
	return s.intents.write(r)
}

// Settled removes id's intent once its outcome is in the database (only
// the intent numbered seq; 0: whichever it has). A failure leaves a stale
// intent, which the next load ignores (its sequence number is below the
// outcome's): it is logged.
func (s *Store[R, P]) Settled(id string, seq uint64) {
	if err := s.Unintend(id, seq); err != nil {
		s.log.Warn("intent journal: a stale intent is left (ignored at the next start)", "container_id", id, "err", err.Error())
	}
}

// Unintend removes id's intent (only the one numbered seq; 0: whichever
// it has) and reports a failure.
func (s *Store[R, P]) Unintend(id string, seq uint64) error {
	return s.intents.clear(id, seq)
}

// ClearJournal empties the journal (once recovery resolved every intent).
func (s *Store[R, P]) ClearJournal() error { return s.intents.clearAll() }

// Read returns the records in the database (not the journal's).
func (s *Store[R, P]) Read() ([]P, error) {
	var out []P
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketContainers).ForEach(func(k, v []byte) error {
			r := P(new(R))
			if err := json.Unmarshal(v, r); err != nil {
				return fmt.Errorf("record %q: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}
