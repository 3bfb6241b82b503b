package isolator

import (
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/isolatord/isolatord/ephemeral"
)

// holdWriter holds the database's writer, so that nothing queued is
// committed until release is called.
func holdWriter(s *Isolator) (release func()) {
	hold, held := make(chan struct{}), make(chan struct{})
	go s.store.DB().Update(func(*bolt.Tx) error { close(held); <-hold; return nil })
	<-held
	return func() { close(hold) }
}

// TestPrepareAnswersBeforeTheCommit: a Prepare answers once its record is
// in the journal, its commit queued. A daemon killed before the commit
// lands (its state as on disk then) has the container prepared, with its
// ports, at its next start, and still at the start after (recovery commits
// it); so does one killed during the Isolate that followed, before the
// Prepare's commit, with the container's plumbing resolved as for any
// isolating container. A prepared container cleaned up while its prepared
// record is still in the journal does not come back.
func TestPrepareAnswersBeforeTheCommit(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	release := holdWriter(s)
	if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
		t.Fatal(err)
	}
	if recs, err := s.store.Read(); err != nil || len(recs) != 0 {
		t.Fatalf("database before the commit: %v %v", recs, err)
	}
	preparedOnly := t.TempDir()
	copyDir(t, dir, preparedOnly)
	// An Isolate meanwhile: its intent replaces the prepared record.
	if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
		t.Fatal(err)
	}
	isolating := t.TempDir()
	copyDir(t, dir, isolating)
	release()
	s.store.WaitQueued()
	if left := journalFiles(t, dir); len(left) > 0 {
		t.Fatalf("intents left after the commits: %v", left)
	}
	s.Close()

	s2 := newTestIsolator(t, preparedOnly, newFakeDP())
	if r, err := s2.Get(bg, "c1"); err != nil || r.State != StatePrepared || !r.Ports.Equal(ephemeral.MustParseSet("31000")) {
		t.Fatalf("c1 after a kill before its Prepare's commit: %+v %v", r, err)
	}
	if _, err := s2.Prepare(bg, "c2", ports("31000")); KindOf(err) != ErrFailedPrecondition {
		t.Fatalf("c1's port taken by c2 after the restart: %v", err)
	}
	s2.Close()
	s2 = newTestIsolator(t, preparedOnly, newFakeDP())
	if r, err := s2.Get(bg, "c1"); err != nil || r.State != StatePrepared {
		t.Fatalf("c1 at the second start: %+v %v", r, err)
	}
	s2.Close()

	// Killed during the Isolate: the plumbing the kill left is found and
	// the container recorded as isolated (the fake's plumbing is complete).
	dp3 := newFakeDP()
	dp3.Plumbed["c1"] = dp.Plumbed["c1"]
	s3 := newTestIsolator(t, isolating, dp3)
	if r, err := s3.Get(bg, "c1"); err != nil || (r.State != StateIsolated && r.State != StatePrepared) {
		t.Fatalf("c1 after a kill during its Isolate, before its Prepare's commit: %+v %v", r, err)
	}
	checkInvariants(t, s3, dp3)
	s3.Close()

	// Cleaned up with its prepared record still in the journal.
	dir4 := t.TempDir()
	s4 := newTestIsolator(t, dir4, newFakeDP())
	release = holdWriter(s4)
	if _, err := s4.Prepare(bg, "c4", ports("31002")); err != nil {
		t.Fatal(err)
	}
	killed := t.TempDir() // the state of a daemon killed once the removal is committed
	s4.SetHook(func(p string) {
		if p == "cleanup:deleted" {
			copyDir(t, dir4, killed)
		}
	})
	done := make(chan error, 1)
	go func() { done <- s4.Cleanup(bg, "c4") }()
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s4.store.WaitQueued()
	s4.Close()
	s4 = newTestIsolator(t, dir4, newFakeDP())
	if _, err := s4.Get(bg, "c4"); KindOf(err) != ErrNotFound {
		t.Fatalf("c4 after its cleanup and a restart: %v", err)
	}
	s4.Close()
	s5 := newTestIsolator(t, killed, newFakeDP())
	if _, err := s5.Get(bg, "c4"); KindOf(err) != ErrNotFound {
		t.Fatalf("c4 after a kill once its removal was committed: %v", err)
	}
}

// TestPrepareAfterQueuedRemoval: a container cleaned up after its
// isolation answers with its record's removal queued; a Prepare that takes
// its slot and port at once answers only once that removal has ended, so
// that a daemon killed when the Prepare answered (its state as on disk
// then) does not find both at its next start.
func TestPrepareAfterQueuedRemoval(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
		t.Fatal(err)
	}
	s.store.WaitQueued()
	release := holdWriter(s)
	if err := s.Cleanup(bg, "c1"); err != nil {
		t.Fatal(err)
	}
	killed := t.TempDir()
	done := make(chan error, 1)
	go func() {
		_, err := s.Prepare(bg, "c2", ports("31000"))
		if err == nil {
			err = copyTree(dir, killed) // the state of a daemon killed once c2 is prepared
		}
		done <- err
	}()
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.store.WaitQueued()
	s.Close()
	s2, err := New(testConfig(t, killed), newFakeDP())
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := s2.Start(bg); err != nil {
		t.Fatalf("start after a kill once c2 was prepared: %v", err)
	}
	if r, err := s2.Get(bg, "c2"); err != nil || !r.Ports.Equal(ephemeral.MustParseSet("31000")) {
		t.Fatalf("c2: %+v %v", r, err)
	}
	if _, err := s2.Get(bg, "c1"); KindOf(err) != ErrNotFound {
		t.Fatalf("c1: %v", err)
	}
}
