package store

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
	keep := map[string]*rec{}
	for i := range 5 {
		r := &rec{ID: fmt.Sprintf("keep%d", i), State: stateIsolating, Veth: "kept"}
		if err := st.Intend(r); err != nil {
			t.Fatal(err)
		}
		keep[r.ID] = r
	}
	path := filepath.Join(dir, intentLogName)
	var largest int64
	for i := range 4000 {
		id := fmt.Sprintf("c%d", i%300)
		r := &rec{ID: id, State: stateIsolating}
		if err := st.Intend(r); err != nil {
			t.Fatal(err)
		}
		r2 := &rec{ID: id, State: stateCleaning, Veth: "second-" + id}
		if err := st.Intend(r2); err != nil {
			t.Fatal(err)
		}
		if in := journalOnDisk(t, dir)[id]; i%500 == 0 && (in == nil || in.Veth != r2.Veth || in.Seq != r2.Seq) {
			t.Fatalf("journal holds %+v, want the second intent of %s", in, id)
		}
		st.Settled(id, r2.Seq)
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
	b, _ := json.Marshal(intentEntry[*rec]{Rec: &rec{ID: "ghost", State: stateIsolating, Seq: 1 << 40}})
	if err := os.WriteFile(path+".tmp", frameIntent(b), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st, err = openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
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
	a := &rec{ID: "a", State: stateIsolating}
	if err := st.Intend(a); err != nil {
		t.Fatal(err)
	}
	st.Close()
	tomb, _ := json.Marshal(intentEntry[*rec]{Clear: "a", Seq: a.Seq})
	appendJournal(t, dir, frameIntent(tomb)[:12]) // a's removal, cut short
	appendJournal(t, dir, make([]byte, 700))      // zeros: pages a power loss kept unwritten
	appendIntent(t, dir, &rec{ID: "b", State: stateCleaning, Seq: a.Seq + 1})
	if st, err = openStore(dir, quietLogger()); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got := map[string]string{}
	for _, r := range st.pending {
		got[r.ID] = r.State
	}
	if len(got) != 2 || got["a"] != stateIsolating || got["b"] != stateCleaning {
		t.Fatalf("intents read: %v, want a isolating and b cleaning", got)
	}
	// Writes go on after the damage.
	c := &rec{ID: "c", State: stateIsolating}
	if err := st.Intend(c); err != nil {
		t.Fatal(err)
	}
	st.Settled("b", 0)
	if ids := journalFiles(t, dir); fmt.Sprint(ids) != "[a c]" {
		t.Fatalf("journal holds %v, want [a c]", ids)
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
	defer st.Close()
	r := &rec{ID: "c1", State: statePrepared}
	if err := st.Intend(r); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(&rec{ID: "c1", State: statePrepared}); err != nil {
		t.Fatal(err)
	}
	st.Settled("c1", r.Seq)
	l := st.intents
	if l.synced >= l.appended {
		t.Fatalf("journal synced (%d of %d lines) by a commit that removes nothing", l.synced, l.appended)
	}
	if err := st.Del("c1"); err != nil {
		t.Fatal(err)
	}
	if l.synced != l.appended {
		t.Fatalf("%d of %d journal lines synced before the removal was committed", l.synced, l.appended)
	}
	done := make(chan error, 1)
	st.DelLater("c2", func(err error) { done <- err })
	if err := st.Intend(&rec{ID: "c3", State: stateCleaning}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
