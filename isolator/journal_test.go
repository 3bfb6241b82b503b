package isolator

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/store"
)

// journalOnDisk reads dir's intent journal as the next start would: the
// intents in place, by container.
func journalOnDisk(t *testing.T, dir string) map[string]*Record {
	t.Helper()
	m, err := store.Intents[Record](dir, validateID)
	if err != nil {
		t.Fatal(err)
	}
	return m
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

// txid is the id of the database's last committed write transaction.
func txid(t *testing.T, st *store.Store[Record, *Record]) int {
	t.Helper()
	var id int
	if err := st.DB().View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	return id
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
	s.store.WaitQueued() // the prepared record is committed after the answer
	var inDB, inJournal State
	s.SetHook(func(p string) {
		if p != "isolate:intent" {
			return
		}
		recs, err := s.store.Read()
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
	s.store.WaitQueued() // the outcome is committed after the answer
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intent left after isolate: %v", left)
	}
	if err := s.Cleanup(bg, "c1"); err != nil {
		t.Fatal(err)
	}
	s.store.WaitQueued() // the record's removal is committed after the answer
	if n := txid(t, s.store) - before; n != 3 {
		t.Fatalf("%d database transactions for a setup and a teardown, want 3 (prepared, isolated, deleted)", n)
	}
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intent left after cleanup: %v", left)
	}
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
	s.store.WaitQueued() // the outcome is committed after the answer
	// Hold the database's writer: nothing queued can be committed.
	hold, held := make(chan struct{}), make(chan struct{})
	go s.store.DB().Update(func(*bolt.Tx) error { close(held); <-hold; return nil })
	<-held
	if err := s.Cleanup(bg, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(bg, "c1"); KindOf(err) != ErrNotFound {
		t.Fatalf("c1 after its cleanup: %v", err)
	}
	recs, err := s.store.Read()
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
	s.store.WaitQueued()
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
