package isolator

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// inode returns the inode number of path.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Skip("no inode numbers here")
	}
	return uint64(st.Ino)
}

// TestIntentFilesRecycled: intents written and removed over and over (an
// isolate, then a cleanup, of container after container) reuse the
// journal's files instead of creating and deleting one per intent; a
// second intent of a container replaces the first whole; the spares stay
// bounded, and neither they nor a spare written but never renamed into
// place (a kill in between) are read as intents at the next open.
func TestIntentFilesRecycled(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for i := 0; i < 50; i++ {
		id := "c" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		first := &Record{ID: id, State: StateIsolating}
		if err := st.intend(first); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, intentDir, id)
		ino := inode(t, path)
		if i >= 2 && !seen[ino] {
			t.Fatalf("intent %d got a new file (inode %d), want one of the journal's: %v", i, ino, seen)
		}
		seen[ino] = true
		second := &Record{ID: id, State: StateCleaning, Veth: "second-" + id}
		if err := st.intend(second); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var onDisk Record
		if err := json.Unmarshal(b, &onDisk); err != nil || onDisk.Veth != second.Veth || onDisk.Seq != second.Seq {
			t.Fatalf("journal holds %q (%v), want the second intent of %s", b, err, id)
		}
		seen[inode(t, path)] = true
		st.settled(id, second.Seq, quietLogger())
		if left := journalFiles(t, dir); len(left) > 0 {
			t.Fatalf("intents left after the outcome: %v", left)
		}
	}
	if len(seen) > 3 {
		t.Fatalf("%d files used for 100 intents, want them recycled", len(seen))
	}
	ents, err := os.ReadDir(filepath.Join(dir, intentDir))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) == 0 || len(ents) > maxSpares {
		t.Fatalf("%d spare files, want 1..%d", len(ents), maxSpares)
	}
	// A spare holding a complete intent (written, never renamed into
	// place): not an intent.
	b, _ := json.Marshal(&Record{ID: "ghost", State: StateIsolating, Seq: 1000})
	if err := os.WriteFile(filepath.Join(dir, intentDir, sparePrefix+"999"), b, 0o600); err != nil {
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
	if len(st.pending) != 0 {
		t.Fatalf("intents read at open: %+v, want none", st.pending)
	}
	ents, _ = os.ReadDir(filepath.Join(dir, intentDir))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), sparePrefix) {
			t.Fatalf("spare %s of the earlier run left at open", e.Name())
		}
	}
}

// TestIntentSparesBounded: a drain clears many intents at once; the
// journal keeps at most maxSpares files of them.
func TestIntentSparesBounded(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	var recs []*Record
	for i := 0; i < maxSpares+40; i++ {
		r := &Record{ID: "d" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26)), State: StateCleaning}
		if err := st.intend(r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	for _, r := range recs {
		st.settled(r.ID, r.Seq, quietLogger())
	}
	ents, err := os.ReadDir(filepath.Join(dir, intentDir))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) > maxSpares {
		t.Fatalf("%d files left in the journal, want at most %d spares", len(ents), maxSpares)
	}
}
