package isolator

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

// journalFiles lists the files of dir's intent journal (its spares aside).
func journalFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, intentDir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), sparePrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// writeIntentFile puts r in dir's journal as a file, as the daemon would
// have left it.
func writeIntentFile(t *testing.T, dir string, r *Record) {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, intentDir, r.ID), b, 0o600); err != nil {
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
		b, err := os.ReadFile(filepath.Join(dir, intentDir, "c1"))
		var r Record
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil {
			t.Errorf("intent of c1: %v", err)
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
// containers, files cut short and unrenamed temporaries are ignored; the
// sequence numbers go on above every number on disk.
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

	writeIntentFile(t, dir, &Record{ID: "newer", State: StateIsolating, Seq: top + 10})
	writeIntentFile(t, dir, &Record{ID: "stale", State: StateIsolating, Seq: 1})
	// an intent of an earlier container of that ID, cleaned up since
	writeIntentFile(t, dir, &Record{ID: "reprepared", State: StateCleaning, Seq: 0})
	writeIntentFile(t, dir, &Record{ID: "unknown", State: StateCleaning, Seq: top + 11})
	if err := os.WriteFile(filepath.Join(dir, intentDir, "cut"), []byte(`{"id":"cut","sta`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, intentDir, tmpPrefix+"stale"), []byte(`{"id":"stale","state":"cleaning","seq":99}`), 0o600); err != nil {
		t.Fatal(err)
	}

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
	b, err := os.ReadFile(filepath.Join(dir, intentDir, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	var onDisk Record
	if err := json.Unmarshal(b, &onDisk); err != nil || onDisk.Veth != "second" {
		t.Fatalf("journal holds %+v (%v), want the second intent", onDisk, err)
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
	// A file the journal does not know of (an earlier write cut short) is
	// replaced too.
	if err := os.WriteFile(filepath.Join(dir, intentDir, "c2"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := st.intend(&Record{ID: "c2", State: StateCleaning, Veth: "c2"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, intentDir, "c2")); err != nil || json.Unmarshal(b, &onDisk) != nil || onDisk.Veth != "c2" {
		t.Fatalf("journal holds %q (%v), want c2's intent", b, err)
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
