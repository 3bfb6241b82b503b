package store

// The intent journal's file (intents.go says what it holds and why it is
// not fsynced). The journal is one file opened once in append mode: an
// intent is one line written with one write(2), ~15 µs, and so is its
// removal (a file per intent replaced by a rename costs an open, a
// truncate, a write, a close and a rename, ~0.2 ms on ext4).
//
// A line is "\n" + the CRC-32C of the payload (8 hex digits) + " " + the
// payload, a JSON entry: {"r": record} writes a container's intent,
// replacing any earlier one; {"c": id, "s": seq} removes it (a tombstone,
// written only when the intent in place is the one numbered seq, so that
// replaying the file reaches the state the daemon had). Every line starts
// with its own newline, so a line cut short by a full disk or a power loss
// never runs into the next one: it fails its checksum and is skipped, and
// the lines after it are read. Reading the file applies the lines in
// order.
//
// The file is fdatasynced before every database commit that removes a
// record (intents.go says why), by the committing goroutine and without
// the journal's lock: intents go on being written meanwhile. It is rewritten
// with only the intents in place (compact: a new file, synced, renamed
// over the old one, which stays whole until then) once it has
// grown past compactMinBytes and four times their size, and is emptied
// when recovery has resolved every intent (clearAll). A daemon killed in
// the middle of a rewrite leaves the old file and a temporary one, removed
// at the next open.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

const (
	// intentLogName is the journal's file in the state directory.
	intentLogName = "intents.log"
	// compactMinBytes: the file is rewritten (compact) only past this size.
	compactMinBytes = 256 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// intentEntry is the payload of one line of the journal.
type intentEntry[P any] struct {
	Rec   P      `json:"r,omitempty"` // an intent: it replaces the container's earlier one
	Clear string `json:"c,omitempty"` // a removal of the intent of this container...
	Seq   uint64 `json:"s,omitempty"` // ...numbered this (0: whichever it has)
}

// liveIntent is an intent in place: its sequence number and its line (a
// rewrite copies the lines).
type liveIntent struct {
	seq  uint64
	line []byte
}

// intentLog is the journal of one state directory.
type intentLog[R any, P Entry[R]] struct {
	path     string
	validKey func(string) error // (Open)

	mu        sync.Mutex
	f         *os.File // the file, open for appending
	size      int64    // bytes written to it (compact)
	live      map[string]liveIntent
	liveBytes int64 // the size of the live lines
	// appended counts the lines appended; synced is the count the last
	// sync (or rewrite) made durable.
	appended, synced uint64
	// retryAt: a failed rewrite is tried again only once the file has
	// grown this far (compactIfLarge).
	retryAt int64
}

// frameIntent returns the journal line of payload b.
func frameIntent(b []byte) []byte {
	line := make([]byte, 0, len(b)+10)
	line = append(line, '\n')
	line = fmt.Appendf(line, "%08x ", crc32.Checksum(b, castagnoli))
	return append(line, b...)
}

// parseIntentLine returns the entry of one line (without its newline) and
// whether it is whole.
func (l *intentLog[R, P]) parseIntentLine(line []byte) (intentEntry[P], bool) {
	var e intentEntry[P]
	sum, payload, ok := bytes.Cut(line, []byte{' '})
	if !ok || len(sum) != 8 {
		return e, false
	}
	want, err := strconv.ParseUint(string(sum), 16, 32)
	if err != nil || uint32(want) != crc32.Checksum(payload, castagnoli) {
		return e, false
	}
	if json.Unmarshal(payload, &e) != nil {
		return e, false
	}
	switch {
	case e.Rec != nil && e.Clear == "" && l.validKey(e.Rec.Key()) == nil:
		return e, true
	case e.Rec == nil && e.Clear != "":
		return e, true
	}
	return e, false
}

// openIntents opens (creating) the journal in stateDir and reads it: the
// intents in place, and a description of each piece of it that does not
// decode.
func openIntents[R any, P Entry[R]](stateDir string, validKey func(string) error) (*intentLog[R, P], []P, []string, error) {
	l := &intentLog[R, P]{path: filepath.Join(stateDir, intentLogName), validKey: validKey, live: map[string]liveIntent{}}
	os.Remove(l.path + ".tmp") // a rewrite cut short: the file itself is whole
	var bad []string
	b, err := os.ReadFile(l.path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil, fmt.Errorf("intent journal: %w", err)
	}
	entry := 0
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		if len(line) == 0 {
			continue
		}
		entry++
		e, ok := l.parseIntentLine(line)
		if !ok {
			bad = append(bad, fmt.Sprintf("%s entry %d", intentLogName, entry))
			continue
		}
		l.apply(e, append([]byte{'\n'}, line...))
	}
	l.size = int64(len(b))
	if l.f, err = os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
		return nil, nil, nil, fmt.Errorf("intent journal: %w", err)
	}
	var recs []P // nil when there is none (Store.Load)
	for _, in := range l.live {
		e, _ := l.parseIntentLine(in.line[1:])
		recs = append(recs, e.Rec)
	}
	return l, recs, bad, nil
}

// apply applies entry e, read from line, to the intents in place.
func (l *intentLog[R, P]) apply(e intentEntry[P], line []byte) {
	if e.Rec != nil {
		l.drop(e.Rec.Key())
		l.live[e.Rec.Key()] = liveIntent{seq: e.Rec.Sequence(), line: line}
		l.liveBytes += int64(len(line))
		return
	}
	if cur, ok := l.live[e.Clear]; ok && (e.Seq == 0 || cur.seq == e.Seq) {
		l.drop(e.Clear)
	}
}

// drop forgets id's intent in place, if any.
func (l *intentLog[R, P]) drop(id string) {
	if cur, ok := l.live[id]; ok {
		l.liveBytes -= int64(len(cur.line))
		delete(l.live, id)
	}
}

// write records r as its container's intent, replacing any earlier one.
func (l *intentLog[R, P]) write(r P) error {
	b, err := json.Marshal(intentEntry[P]{Rec: r})
	if err != nil {
		return err
	}
	line := frameIntent(b)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.append(line); err != nil {
		return fmt.Errorf("write intent of %s: %w", r.Key(), err)
	}
	l.apply(intentEntry[P]{Rec: r}, line)
	l.compactIfLarge()
	return nil
}

// clear removes id's intent, if it has one numbered seq (0: any). Calls
// for one container are serialised by the caller.
func (l *intentLog[R, P]) clear(id string, seq uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur, has := l.live[id]
	if !has || (seq != 0 && cur.seq != seq) {
		return nil
	}
	b, err := json.Marshal(intentEntry[P]{Clear: id, Seq: cur.seq})
	if err != nil {
		return err
	}
	if err := l.append(frameIntent(b)); err != nil {
		return fmt.Errorf("remove intent of %s: %w", id, err)
	}
	l.drop(id)
	l.compactIfLarge()
	return nil
}

// append writes line at the end of the file. A write that fails part way
// is cut off again where it can be (its line would be skipped anyway);
// the size is read back, whatever is left.
func (l *intentLog[R, P]) append(line []byte) error {
	n, err := l.f.Write(line)
	if err != nil {
		if n > 0 {
			l.f.Truncate(l.size)
			if fi, serr := l.f.Stat(); serr == nil {
				l.size = fi.Size()
			}
		}
		return err
	}
	l.size += int64(n)
	l.appended++
	return nil
}

// sync makes the lines appended so far durable (fdatasync), without
// holding the journal's lock meanwhile: intents are written on answer
// paths, syncs are made by the database's commits (commitBatch), before
// a record's removal.
func (l *intentLog[R, P]) sync() error {
	for range 3 {
		l.mu.Lock()
		f, upTo := l.f, l.appended
		done := l.synced >= upTo
		l.mu.Unlock()
		if done {
			return nil
		}
		err := fdatasync(f)
		l.mu.Lock()
		if l.f != f {
			l.mu.Unlock()
			continue // rewritten meanwhile (and synced): the new file's later lines
		}
		if err == nil {
			l.synced = max(l.synced, upTo)
		}
		l.mu.Unlock()
		return err
	}
	return errors.New("intent journal: rewritten during every sync")
}

// compactIfLarge rewrites the file with only the intents in place once it
// has grown past compactMinBytes and four times their size. A failed
// rewrite leaves the file as it was (tried again at the next write).
func (l *intentLog[R, P]) compactIfLarge() {
	if l.size < compactMinBytes || l.size < 4*l.liveBytes || l.size < l.retryAt {
		return
	}
	lines := make([][]byte, 0, len(l.live))
	for _, in := range l.live {
		lines = append(lines, in.line)
	}
	if err := l.replace(bytes.Join(lines, nil)); err != nil {
		l.retryAt = l.size + compactMinBytes // the file stays as it was
	}
}

// replace makes b the whole content of the file: written to a temporary
// file, synced, and renamed over it, so that a kill or a power loss in
// between leaves the old one (and a power loss after, the new one whole).
func (l *intentLog[R, P]) replace(b []byte) error {
	tmp := l.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, l.path); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	l.f.Close()
	l.f, l.size, l.retryAt = f, int64(len(b)), 0
	l.synced = l.appended
	return nil
}

// clearAll empties the journal (once recovery resolved every intent).
func (l *intentLog[R, P]) clearAll() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.replace(nil); err != nil {
		return fmt.Errorf("empty the intent journal: %w", err)
	}
	clear(l.live)
	l.liveBytes = 0
	return nil
}

// close closes the file.
func (l *intentLog[R, P]) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}

// Intents reads the intents in place in dir's journal, by key, as the
// next start would, without opening the journal for writing (tests and
// tools).
func Intents[R any, P Entry[R]](dir string, validKey func(string) error) (map[string]P, error) {
	b, err := os.ReadFile(filepath.Join(dir, intentLogName))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	l := &intentLog[R, P]{validKey: validKey, live: map[string]liveIntent{}}
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		if e, ok := l.parseIntentLine(line); ok {
			l.apply(e, append([]byte{'\n'}, line...))
		}
	}
	out := make(map[string]P, len(l.live))
	for id, in := range l.live {
		e, _ := l.parseIntentLine(in.line[1:])
		out[id] = e.Rec
	}
	return out, nil
}
