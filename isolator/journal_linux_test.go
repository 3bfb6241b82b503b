package isolator

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// fillJournal makes every later write to dir's intent journal fail as on
// a full disk: the daemon's descriptor of the file is made one of
// /dev/full.
func fillJournal(t *testing.T, dir string) {
	t.Helper()
	want, err := filepath.EvalSymlinks(filepath.Join(dir, "intents.log"))
	if err != nil {
		t.Fatal(err)
	}
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && p == want {
			var fd int
			if _, err := fmt.Sscan(e.Name(), &fd); err != nil {
				t.Fatal(err)
			}
			if err := unix.Dup3(int(full.Fd()), fd, unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d descriptors of %s, want the journal's one", n, want)
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
	fillJournal(t, dir) // every append fails from now on
	if err := s.Cleanup(bg, "c1"); KindOf(err) != ErrInternal {
		t.Fatalf("cleanup with the journal failing: %v, want Internal", err)
	}
	if r, err := s.Get(bg, "c1"); err != nil || r.State != StatePrepared {
		t.Fatalf("c1 after the failed cleanup: %+v %v", r, err)
	}
	release()
}
