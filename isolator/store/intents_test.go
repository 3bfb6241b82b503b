package store

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// journalOnDisk reads dir's intent journal as the next start would: the
// intents in place, by container.
func journalOnDisk(t *testing.T, dir string) map[string]*rec {
	t.Helper()
	m, err := Intents[rec](dir, validKey)
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

// appendIntent appends r to dir's journal, as the daemon would have left
// it.
func appendIntent(t *testing.T, dir string, r *rec) {
	t.Helper()
	b, err := json.Marshal(intentEntry[*rec]{Rec: r})
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
		if err := st.Put(&rec{ID: id, State: statePrepared}); err != nil {
			t.Fatal(err)
		}
	}
	top := st.seq.Load()
	st.Close()

	appendIntent(t, dir, &rec{ID: "newer", State: stateIsolating, Seq: top + 10})
	appendIntent(t, dir, &rec{ID: "stale", State: stateIsolating, Seq: 1})
	// an intent of an earlier container of that ID, cleaned up since
	appendIntent(t, dir, &rec{ID: "reprepared", State: stateCleaning, Seq: 0})
	appendIntent(t, dir, &rec{ID: "unknown", State: stateCleaning, Seq: top + 11})
	// a line cut short (by a power loss), then one whose bytes changed
	b, _ := json.Marshal(intentEntry[*rec]{Rec: &rec{ID: "cut", State: stateCleaning, Seq: top + 12}})
	appendJournal(t, dir, frameIntent(b)[:20])
	bent := frameIntent(b)
	bent[len(bent)-3] = 'x'
	appendJournal(t, dir, bent)

	st, err = openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range recs {
		got[r.ID] = r.State
	}
	want := map[string]string{"newer": stateIsolating, "stale": statePrepared, "reprepared": statePrepared}
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
	if err := st.ClearJournal(); err != nil {
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
	defer st.Close()
	r := &rec{ID: "c1", State: stateIsolated}
	if err := st.Put(r); err != nil {
		t.Fatal(err)
	}
	first := &rec{ID: "c1", State: stateCleaning}
	second := &rec{ID: "c1", State: stateCleaning, Veth: "second"}
	for _, in := range []*rec{first, second} {
		if err := st.Intend(in); err != nil {
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
	if err := st.Put(&rec{ID: "c1", State: stateIsolated}); err != nil {
		t.Fatal(err)
	}
	st.Settled("c1", 0)
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intent left after the outcome: %v", left)
	}
	// A line cut short at the end of the journal (an earlier write that
	// failed part way) does not hide the next intent.
	appendJournal(t, dir, []byte("\n1234"))
	if err := st.Intend(&rec{ID: "c2", State: stateCleaning, Veth: "c2"}); err != nil {
		t.Fatal(err)
	}
	if onDisk := journalOnDisk(t, dir)["c2"]; onDisk == nil || onDisk.Veth != "c2" {
		t.Fatalf("journal holds %+v, want c2's intent", onDisk)
	}
}
