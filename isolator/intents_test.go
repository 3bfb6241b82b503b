package isolator

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// journalFiles lists the files of dir's intent journal.
func journalFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, intentDir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
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
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intent left after isolate: %v", left)
	}
	if err := s.Cleanup(bg, "c1"); err != nil {
		t.Fatal(err)
	}
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
	st.settled("c1", quietLogger())
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intent left after the outcome: %v", left)
	}
}
