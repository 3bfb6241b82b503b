package isolator

// The intent journal. Before a lifecycle step touches the kernel (isolate,
// update of an isolated container's ports, cleanup of an isolated one) it
// records its intent: the record in its transitional state. The intent is
// a small file per container in <state-dir>/intents, replaced atomically
// (written into a spare file, then renamed into place: intentspare.go) and
// not fsynced; the outcome goes to the database (store.go), fsynced, and
// then the intent file is removed. A stable state a caller is told about
// is written before the answer: in the database, or, for a Prepare and for
// the outcome of an Isolate or of a Cleanup of an isolated container, in
// the journal (the prepared record itself, or the intent from which
// recovery reaches that state: the plumbing complete, or gone), while the
// commit is queued and lands after the answer (preparedStored,
// isolatedStored, deleted). Intents cost a few file-system calls instead
// of a database commit (two fsyncs).
//
// Why an intent needs no fsync: it protects kernel objects, and it is
// exactly as durable as they are. A daemon killed (kill -9, a crash) loses
// nothing written before: the file is in the page cache, and the next
// start reads it. Only a machine crash or power loss loses unsynced files,
// and that loses every kernel object an intent is about too (veths,
// filters, namespaces and the processes holding them, pins under /run,
// host port reservations): recovery then finds the database's stable
// state with nothing in the kernel, the outcome it would reach with the
// intent as well (an isolated or isolating container whose namespace is
// gone is cleaned up; a prepared one has nothing in the kernel). A
// prepared record whose commit a power loss cut short (within a commit's
// time of the answer) is lost with the processes of its container: the
// runtime that starts the container again prepares it again.
//
// Every write of a record, to the database or to the journal, carries a
// sequence number from one counter that only grows (store.nextSeq, started
// above every number on disk at open). At load an intent replaces the
// database's record only if that record exists and is older: an intent
// whose outcome reached the database before its file was removed (a kill
// in between, or a power loss that kept the commit but not the removal),
// or one left of a container since cleaned up and prepared again, is
// stale and ignored. A prepared or isolating intent of a container with no
// record is its Prepare's record whose commit had not landed, and is
// loaded (overlay). A file that does not decode (a write cut short by a
// power loss) is ignored: no kernel object outlived what cut it short.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// intentDir is the journal's directory in the state directory.
const intentDir = "intents"

// tmpPrefix started the name an intent was written under before it was
// renamed into place, before the journal wrote into spares
// (intentspare.go); container IDs never start with a dot.
const tmpPrefix = ".tmp-"

// intentLog is the journal of one state directory.
type intentLog struct {
	dir string

	mu        sync.Mutex
	present   map[string]uint64 // containers with an intent file: its sequence number
	spares    []string          // paths of spare files (intentspare.go)
	lastSpare uint64            // numbers the spare names
}

// openIntents opens (creating) the journal in stateDir and reads it: the
// intents that decode, and the names of the files that do not.
func openIntents(stateDir string) (*intentLog, []*Record, []string, error) {
	l := &intentLog{dir: filepath.Join(stateDir, intentDir), present: map[string]uint64{}}
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return nil, nil, nil, fmt.Errorf("intent journal %s: %w", l.dir, err)
	}
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("intent journal %s: %w", l.dir, err)
	}
	var recs []*Record
	var bad []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, sparePrefix) {
			os.Remove(filepath.Join(l.dir, name)) // a spare of an earlier run: no intent
			continue
		}
		if strings.HasPrefix(name, tmpPrefix) {
			bad = append(bad, name) // never renamed into place: its step never began
			continue
		}
		l.present[name] = 0
		b, err := os.ReadFile(filepath.Join(l.dir, name))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("intent journal: %w", err)
		}
		r := new(Record)
		if err := json.Unmarshal(b, r); err != nil || r.ID != name {
			bad = append(bad, name)
			continue
		}
		recs = append(recs, r)
	}
	return l, recs, bad, nil
}

// write records r as its container's intent, replacing any earlier one:
// r is written into a spare file (intentspare.go), which is then renamed
// into place, so that the earlier intent stays whole until it is replaced
// and a write cut short by a kill is never read as an intent.
func (l *intentLog) write(r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	l.mu.Lock()
	_, had := l.present[r.ID]
	l.mu.Unlock()
	spare, err := l.takeSpare(b)
	if err != nil {
		return fmt.Errorf("write intent of %s: %w", r.ID, err)
	}
	if err := l.place(spare, filepath.Join(l.dir, r.ID), had); err != nil {
		os.Remove(spare)
		return fmt.Errorf("write intent of %s: %w", r.ID, err)
	}
	l.mu.Lock()
	l.present[r.ID] = r.Seq
	l.mu.Unlock()
	return nil
}

// clear removes id's intent, if it has one numbered seq (0: any). Calls
// for one container are serialised by the caller.
func (l *intentLog) clear(id string, seq uint64) error {
	l.mu.Lock()
	cur, has := l.present[id]
	l.mu.Unlock()
	if !has || (seq != 0 && cur != seq) {
		return nil
	}
	if err := l.retire(filepath.Join(l.dir, id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove intent of %s: %w", id, err)
	}
	l.mu.Lock()
	delete(l.present, id)
	l.mu.Unlock()
	return nil
}

// clearAll removes every file of the journal (once recovery resolved
// them all).
func (l *intentLog) clearAll() error {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if err := os.Remove(filepath.Join(l.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	l.mu.Lock()
	clear(l.present)
	l.spares = nil
	l.mu.Unlock()
	return errors.Join(errs...)
}

// overlay replaces each record of recs by its container's intent when the
// intent is newer, and adds the intent of a container with no record when
// it is prepared or isolating: its Prepare's commit had not landed. Such
// an intent is never stale: a cleanup replaces an isolating intent by its
// own, and removes a prepared one before the record. It returns the
// records and the IDs of those added (in the journal only).
func overlay(recs, intents []*Record) (_ []*Record, added []string) {
	byID := make(map[string]int, len(recs))
	for i, r := range recs {
		byID[r.ID] = i
	}
	for _, in := range intents {
		i, ok := byID[in.ID]
		switch {
		case !ok && (in.State == StatePrepared || in.State == StateIsolating):
			recs = append(recs, in)
			added = append(added, in.ID)
		case !ok || in.Seq <= recs[i].Seq:
			continue // stale: its outcome is in the database, or its container is gone
		default:
			recs[i] = in
		}
	}
	return recs, added
}
