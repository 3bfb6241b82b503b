package isolator

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

// journalOnDisk reads dir's intent journal as the next start would: the
// intents in place, by container.
func journalOnDisk(t *testing.T, dir string) map[string]*Record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, intentLogName))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	l := &intentLog{live: map[string]liveIntent{}}
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		if e, ok := parseIntentLine(line); ok {
			l.apply(e, append([]byte{'\n'}, line...))
		}
	}
	out := map[string]*Record{}
	for id, in := range l.live {
		e, _ := parseIntentLine(in.line[1:])
		out[id] = e.Rec
	}
	return out
}

// journalFiles lists the containers with an intent in dir's journal.
func journalFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for id := range journalOnDisk(t, dir) {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// appendIntent appends r to dir's journal, as the daemon would have left
// it.
func appendIntent(t *testing.T, dir string, r *Record) {
	t.Helper()
	b, err := json.Marshal(intentEntry{Rec: r})
	if err != nil {
		t.Fatal(err)
	}
	appendJournal(t, dir, frameIntent(b))
}

// appendJournal appends raw bytes to dir's journal.
func appendJournal(t *testing.T, dir string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, intentLogName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

// txid is the id of the database's last committed write transaction.
func txid(t *testing.T, st *store) int {
	t.Helper()
	var id int
	if err := st.db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestIntentsOutsideTheDatabase: a setup and a teardown commit the
// database only for the states a caller is told about (prepared, isolated,
// gone): three fsynced transactions, the intents going to the journal;
// while a step runs its intent is in the journal and the database still
// holds the stable state before it.
func TestIntentsOutsideTheDatabase(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	before := txid(t, s.store)
	if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
		t.Fatal(err)
	}
	s.store.later.Wait() // the prepared record is committed after the answer
	var inDB, inJournal State
	s.SetHook(func(p string) {
		if p != "isolate:intent" {
			return
		}
		recs, err := s.store.read()
		if err != nil || len(recs) != 1 {
			t.Errorf("database: %v %v", recs, err)
			return
		}
		inDB = recs[0].State
		r, ok := journalOnDisk(t, dir)["c1"]
		if !ok {
			t.Errorf("no intent of c1 in the journal")
			return
		}
		inJournal = r.State
	})
	if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
		t.Fatal(err)
	}
	s.SetHook(nil)
	if inDB != StatePrepared || inJournal != StateIsolating {
		t.Fatalf("during isolate: database says %q, journal %q; want prepared and isolating", inDB, inJournal)
	}
	s.store.later.Wait() // the outcome is committed after the answer
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intent left after isolate: %v", left)
	}
	if err := s.Cleanup(bg, "c1"); err != nil {
		t.Fatal(err)
	}
	s.store.later.Wait() // the record's removal is committed after the answer
	if n := txid(t, s.store) - before; n != 3 {
		t.Fatalf("%d database transactions for a setup and a teardown, want 3 (prepared, isolated, deleted)", n)
	}
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intent left after cleanup: %v", left)
	}
}

// TestIntentOverlay: at load an intent replaces its container's record only
// when that record exists and is older; stale intents, intents of unknown
// containers and lines cut short are ignored; the sequence numbers go on
// above every number on disk.
func TestIntentOverlay(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"newer", "stale", "reprepared"} {
		if err := st.put(&Record{ID: id, State: StatePrepared}); err != nil {
			t.Fatal(err)
		}
	}
	top := st.seq.Load()
	st.close()

	appendIntent(t, dir, &Record{ID: "newer", State: StateIsolating, Seq: top + 10})
	appendIntent(t, dir, &Record{ID: "stale", State: StateIsolating, Seq: 1})
	// an intent of an earlier container of that ID, cleaned up since
	appendIntent(t, dir, &Record{ID: "reprepared", State: StateCleaning, Seq: 0})
	appendIntent(t, dir, &Record{ID: "unknown", State: StateCleaning, Seq: top + 11})
	// a line cut short (by a power loss), then one whose bytes changed
	b, _ := json.Marshal(intentEntry{Rec: &Record{ID: "cut", State: StateCleaning, Seq: top + 12}})
	appendJournal(t, dir, frameIntent(b)[:20])
	bent := frameIntent(b)
	bent[len(bent)-3] = 'x'
	appendJournal(t, dir, bent)

	st, err = openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	recs, err := st.load()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]State{}
	for _, r := range recs {
		got[r.ID] = r.State
	}
	want := map[string]State{"newer": StateIsolating, "stale": StatePrepared, "reprepared": StatePrepared}
	if len(got) != len(want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %q, want %q", id, got[id], w)
		}
	}
	if n := st.nextSeq(); n <= top+11 {
		t.Fatalf("next sequence number %d is not above the %d on disk", n, top+11)
	}
	if err := st.intents.clearAll(); err != nil {
		t.Fatal(err)
	}
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("journal not cleared: %v", left)
	}
}

// TestIntentReplaced: a second intent of a container (a cleanup tried
// again after its teardown failed) replaces the first, and the stable
// state's commit removes it.
func TestIntentReplaced(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	r := &Record{ID: "c1", State: StateIsolated}
	if err := st.put(r); err != nil {
		t.Fatal(err)
	}
	first := &Record{ID: "c1", State: StateCleaning}
	second := &Record{ID: "c1", State: StateCleaning, Veth: "second"}
	for _, in := range []*Record{first, second} {
		if err := st.intend(in); err != nil {
			t.Fatal(err)
		}
	}
	if second.Seq <= first.Seq || first.Seq <= r.Seq {
		t.Fatalf("sequence numbers %d, %d, %d do not grow", r.Seq, first.Seq, second.Seq)
	}
	if onDisk := journalOnDisk(t, dir)["c1"]; onDisk == nil || onDisk.Veth != "second" {
		t.Fatalf("journal holds %+v, want the second intent", onDisk)
	}
	if left := journalFiles(t, dir); len(left) != 1 {
		t.Fatalf("journal: %v, want the one intent", left)
	}
	if err := st.put(&Record{ID: "c1", State: StateIsolated}); err != nil {
		t.Fatal(err)
	}
	st.settled("c1", 0, quietLogger())
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intent left after the outcome: %v", left)
	}
	// A line cut short at the end of the journal (an earlier write that
	// failed part way) does not hide the next intent.
	appendJournal(t, dir, []byte("\n1234"))
	if err := st.intend(&Record{ID: "c2", State: StateCleaning, Veth: "c2"}); err != nil {
		t.Fatal(err)
	}
	if onDisk := journalOnDisk(t, dir)["c2"]; onDisk == nil || onDisk.Veth != "c2" {
		t.Fatalf("journal holds %+v, want c2's intent", onDisk)
	}
}

// copyDir copies the files of src (and its directories) to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := copyTree(src, dst); err != nil {
		t.Fatal(err)
	}
}

// copyTree copies src into dst, the state of a daemon killed now. The
// daemon may be running: a file renamed away while the copy walks (an
// intent retired to a spare, a spare taken) makes the copy start again,
// at most 50 times.
func copyTree(src, dst string) error {
	var err error
	for range 50 {
		if err = os.RemoveAll(dst); err != nil {
			return err
		}
		err = filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(src, p)
			if d.IsDir() {
				return os.MkdirAll(filepath.Join(dst, rel), 0o700)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
		})
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

// TestCleanupAnswersBeforeTheRemoval: the cleanup of an isolated container
// answers once its kernel objects are gone, its record's removal queued:
// it is gone for readers, its ports and ID can be taken again at once, and
// a daemon killed before the removal is committed (the state as it is on
// disk then) finishes the cleanup at its next start. Writes queued after
// the removal are committed with it or after it.
func TestCleanupAnswersBeforeTheRemoval(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
		t.Fatal(err)
	}
	s.store.later.Wait() // the outcome is committed after the answer
	// Hold the database's writer: nothing queued can be committed.
	hold, held := make(chan struct{}), make(chan struct{})
	go s.store.db.Update(func(*bolt.Tx) error { close(held); <-hold; return nil })
	<-held
	if err := s.Cleanup(bg, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(bg, "c1"); KindOf(err) != ErrNotFound {
		t.Fatalf("c1 after its cleanup: %v", err)
	}
	recs, err := s.store.read()
	if err != nil || len(recs) != 1 || recs[0].State != StateIsolated {
		t.Fatalf("database before the removal is committed: %v %v", recs, err)
	}
	// A daemon killed now: its state as on disk.
	crashed := t.TempDir()
	copyDir(t, dir, crashed)
	// The port and the ID are free at once; their writes wait behind the removal.
	errs := make(chan error, 1)
	go func() {
		_, err := s.Prepare(bg, "c2", ports("31000"))
		if err == nil {
			_, err = s.Prepare(bg, "c1", ports("31001"))
		}
		errs <- err
	}()
	close(hold)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	s.store.later.Wait()
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intent left after the removal: %v", left)
	}
	s.Close()
	s2 := newTestIsolator(t, dir, dp)
	checkInvariants(t, s2, dp)
	if r, err := s2.Get(bg, "c1"); err != nil || r.State != StatePrepared || !r.Ports.Equal(ephemeral.MustParseSet("31001")) {
		t.Fatalf("c1 prepared again: %+v %v", r, err)
	}
	if r, err := s2.Get(bg, "c2"); err != nil || !r.Ports.Equal(ephemeral.MustParseSet("31000")) {
		t.Fatalf("c2: %+v %v", r, err)
	}
	s2.Close()

	// The daemon killed before the removal was committed: the cleanup is finished at the start.
	dp.Plumbed["c1"] = plane.Container{ID: "c1"} // what a kill during the teardown could have left
	s3 := newTestIsolator(t, crashed, dp)
	if _, err := s3.Get(bg, "c1"); KindOf(err) != ErrNotFound {
		t.Fatalf("c1 after a kill before its removal was committed: %v", err)
	}
	if _, ok := dp.Plumbed["c1"]; ok {
		t.Fatal("c1's plumbing not removed at the start")
	}
	if left := journalFiles(t, crashed); len(left) > 0 {
		t.Fatalf("journal not empty after the start: %v", left)
	}
}
