package isolator

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestIntentLogCompacts: intents written and removed over and over (an
// isolate, then a cleanup, of container after container) keep the journal
// bounded: it is rewritten with the intents in place, which survive the
// rewrites and a reopen; a rewrite a kill cut short leaves a temporary
// file that is never read.
func TestIntentLogCompacts(t *testing.T) {
	if testing.Short() {
		t.Skip("8,000 journal writes, tens of seconds on a busy machine: skipped with -short")
	}
	dir := t.TempDir()
	st, err := openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	keep := map[string]*Record{}
	for i := range 5 {
		r := &Record{ID: fmt.Sprintf("keep%d", i), State: StateIsolating, Veth: "kept"}
		if err := st.intend(r); err != nil {
			t.Fatal(err)
		}
		keep[r.ID] = r
	}
	path := filepath.Join(dir, intentLogName)
	var largest int64
	for i := range 4000 {
		id := fmt.Sprintf("c%d", i%300)
		r := &Record{ID: id, State: StateIsolating}
		if err := st.intend(r); err != nil {
			t.Fatal(err)
		}
		r2 := &Record{ID: id, State: StateCleaning, Veth: "second-" + id}
		if err := st.intend(r2); err != nil {
			t.Fatal(err)
		}
		if in := journalOnDisk(t, dir)[id]; i%500 == 0 && (in == nil || in.Veth != r2.Veth || in.Seq != r2.Seq) {
			t.Fatalf("journal holds %+v, want the second intent of %s", in, id)
		}
		st.settled(id, r2.Seq, quietLogger())
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		largest = max(largest, fi.Size())
	}
	if largest > compactMinBytes+4096 {
		t.Fatalf("journal grew to %d bytes, want it rewritten past %d", largest, compactMinBytes)
	}
	got := journalOnDisk(t, dir)
	if len(got) != len(keep) {
		t.Fatalf("journal holds %v, want the %d intents kept", journalFiles(t, dir), len(keep))
	}
	// A rewrite cut short by a kill: a temporary file holding an intent.
	b, _ := json.Marshal(intentEntry{Rec: &Record{ID: "ghost", State: StateIsolating, Seq: 1 << 40}})
	if err := os.WriteFile(path+".tmp", frameIntent(b), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := st.close(); err != nil {
		t.Fatal(err)
	}
	st, err = openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	if len(st.pending) != len(keep) {
		t.Fatalf("intents read at open: %d, want %d", len(st.pending), len(keep))
	}
	for _, r := range st.pending {
		if k := keep[r.ID]; k == nil || k.Seq != r.Seq || r.Veth != "kept" {
			t.Fatalf("intent read at open: %+v, want one of those kept", r)
		}
	}
	if _, err := os.Stat(path + ".tmp"); err == nil {
		t.Fatal("the temporary file of a rewrite cut short is left at open")
	}
}

// TestIntentLogDamage: a line cut short (a full disk, a power loss) or
// zeroed is skipped and the lines after it are read; a removal whose line
// was cut short did not happen.
func TestIntentLogDamage(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	a := &Record{ID: "a", State: StateIsolating}
	if err := st.intend(a); err != nil {
		t.Fatal(err)
	}
	st.close()
	tomb, _ := json.Marshal(intentEntry{Clear: "a", Seq: a.Seq})
	appendJournal(t, dir, frameIntent(tomb)[:12]) // a's removal, cut short
	appendJournal(t, dir, make([]byte, 700))      // zeros: pages a power loss kept unwritten
	appendIntent(t, dir, &Record{ID: "b", State: StateCleaning, Seq: a.Seq + 1})
	if st, err = openStore(dir, quietLogger()); err != nil {
		t.Fatal(err)
	}
	defer st.close()
	got := map[string]State{}
	for _, r := range st.pending {
		got[r.ID] = r.State
	}
	if len(got) != 2 || got["a"] != StateIsolating || got["b"] != StateCleaning {
		t.Fatalf("intents read: %v, want a isolating and b cleaning", got)
	}
	// Writes go on after the damage.
	c := &Record{ID: "c", State: StateIsolating}
	if err := st.intend(c); err != nil {
		t.Fatal(err)
	}
	st.settled("b", 0, quietLogger())
	if ids := journalFiles(t, dir); fmt.Sprint(ids) != "[a c]" {
		t.Fatalf("journal holds %v, want [a c]", ids)
	}
}

// TestIntentJournalOfAnEarlierVersion: a state directory of a version that
// kept one file per intent (a daemon killed mid-step, then upgraded): its
// intents are read, moved into the journal and the directory removed;
// spares and unrenamed temporaries are no intents.
func TestIntentJournalOfAnEarlierVersion(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.put(&Record{ID: "c1", State: StateIsolated}); err != nil {
		t.Fatal(err)
	}
	top := st.seq.Load()
	st.close()
	os.Remove(filepath.Join(dir, intentLogName))
	old := filepath.Join(dir, intentDir)
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	put := func(name string, r *Record) {
		b, _ := json.Marshal(r)
		if err := os.WriteFile(filepath.Join(old, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	put("c1", &Record{ID: "c1", State: StateCleaning, Seq: top + 1})
	put(sparePrefix+"3", &Record{ID: "c9", State: StateIsolating, Seq: top + 2})
	put(tmpPrefix+"c1", &Record{ID: "c1", State: StateIsolating, Seq: top + 3})
	put("c2", &Record{ID: "other", State: StateIsolating, Seq: top + 4}) // not its name: damaged
	for range 2 {                                                        // a second start finds the same
		st, err = openStore(dir, quietLogger())
		if err != nil {
			t.Fatal(err)
		}
		recs, err := st.load()
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1 || recs[0].ID != "c1" || recs[0].State != StateCleaning || recs[0].Seq != top+1 {
			t.Fatalf("loaded %+v, want c1 cleaning", recs)
		}
		if _, err := os.Stat(old); err == nil {
			t.Fatal("the earlier version's journal directory is left")
		}
		if ids := journalFiles(t, dir); fmt.Sprint(ids) != "[c1]" {
			t.Fatalf("journal holds %v, want [c1]", ids)
		}
		if n := st.nextSeq(); n <= top+1 {
			t.Fatalf("next sequence number %d is not above the %d on disk", n, top+1)
		}
		st.close()
	}
}

// TestRemovalSyncsTheJournal: a commit that removes a record makes the
// journal's lines written before it durable first (a power loss must not
// keep the removal and lose a tombstone); commits that only put records
// do not sync.
func TestRemovalSyncsTheJournal(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	r := &Record{ID: "c1", State: StatePrepared}
	if err := st.intend(r); err != nil {
		t.Fatal(err)
	}
	if err := st.put(&Record{ID: "c1", State: StatePrepared}); err != nil {
		t.Fatal(err)
	}
	st.settled("c1", r.Seq, quietLogger())
	l := st.intents
	if l.synced >= l.appended {
		t.Fatalf("journal synced (%d of %d lines) by a commit that removes nothing", l.synced, l.appended)
	}
	if err := st.del("c1"); err != nil {
		t.Fatal(err)
	}
	if l.synced != l.appended {
		t.Fatalf("%d of %d journal lines synced before the removal was committed", l.synced, l.appended)
	}
	done := make(chan error, 1)
	st.delLater("c2", func(err error) { done <- err })
	if err := st.intend(&Record{ID: "c3", State: StateCleaning}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPreparedCleanupKeepsTheRecordWithItsIntent: when the prepared
// intent of a container cannot be removed (its tombstone cannot be
// written), its cleanup fails and the record stays: a record removed with
// its intent left would come back at the next start.
func TestPreparedCleanupKeepsTheRecordWithItsIntent(t *testing.T) {
	dir := t.TempDir()
	s := newTestIsolator(t, dir, newFakeDP())
	release := holdWriter(s) // the prepared commit stays queued: the intent stays
	if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
		t.Fatal(err)
	}
	l := s.store.intents
	l.mu.Lock()
	f := l.f
	f.Close() // every append fails from now on
	l.mu.Unlock()
	if err := s.Cleanup(bg, "c1"); KindOf(err) != ErrInternal {
		t.Fatalf("cleanup with the journal failing: %v, want Internal", err)
	}
	if r, err := s.Get(bg, "c1"); err != nil || r.State != StatePrepared {
		t.Fatalf("c1 after the failed cleanup: %+v %v", r, err)
	}
	release()
}
