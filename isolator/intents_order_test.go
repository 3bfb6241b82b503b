package isolator

import (
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/isolatord/isolatord/test/wait"
)

// TestKilledBeforeRemovalPortTakenByUpdate: a container cleaned up (its
// record's removal queued, not committed) frees its port at once, and an
// update of another container takes it (an intent only, in the journal).
// A daemon killed then finds both holding the port at its next start:
// the one being cleaned up must not keep the other out of the ledger, or
// the port could be handed out a third time.
func TestKilledBeforeRemovalPortTakenByUpdate(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	for id, p := range map[string]string{"a1": "31000", "c1": "31001"} {
		if _, err := s.Prepare(bg, id, ports(p)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Isolate(bg, id, nsTarget(t, id)); err != nil {
			t.Fatal(err)
		}
	}
	s.store.WaitQueued() // the outcomes are committed after the answers
	hold, held := make(chan struct{}), make(chan struct{})
	go s.store.DB().Update(func(*bolt.Tx) error { close(held); <-hold; return nil })
	<-held
	if err := s.Cleanup(bg, "a1"); err != nil {
		t.Fatal(err)
	}
	// The update's intent is in the journal; its outcome waits behind the removal.
	updated := make(chan error, 1)
	go func() { _, err := s.Update(bg, "c1", ports("31000,31001")); updated <- err }()
	crashed := t.TempDir()
	wait.For(t, 10*time.Second, "c1's update intent published", func() bool {
		r, err := s.Get(bg, "c1")
		return err == nil && r.State == StateUpdating
	})
	copyDir(t, dir, crashed)
	close(hold)
	if err := <-updated; err != nil {
		t.Fatal(err)
	}
	s.Close()

	s2 := newTestIsolator(t, crashed, dp)
	defer s2.Close()
	if _, err := s2.Get(bg, "a1"); KindOf(err) != ErrNotFound {
		t.Fatalf("a1 after a kill before its removal was committed: %v", err)
	}
	if _, err := s2.Prepare(bg, "x1", ports("31000")); err == nil {
		t.Fatal("port 31000, held by c1, handed out again after the restart")
	}
	checkInvariants(t, s2, dp)
}

// TestKilledBeforeRemovalNamespaceTakenByIsolate: as above with the
// namespace: a container isolated into the namespace of one cleaned up
// (whose removal was not committed, and neither is its own outcome) keeps
// its claim on it after a kill, and is isolated.
func TestKilledBeforeRemovalNamespaceTakenByIsolate(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	for _, id := range []string{"z1", "b1", "x1"} {
		if _, err := s.Prepare(bg, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Isolate(bg, "z1", nsTarget(t, "nsShared")); err != nil {
		t.Fatal(err)
	}
	s.store.WaitQueued() // the outcomes are committed after the answers
	hold, held := make(chan struct{}), make(chan struct{})
	go s.store.DB().Update(func(*bolt.Tx) error { close(held); <-hold; return nil })
	<-held
	if err := s.Cleanup(bg, "z1"); err != nil {
		t.Fatal(err)
	}
	isolated := make(chan error, 1)
	go func() { _, err := s.Isolate(bg, "b1", nsTarget(t, "nsShared")); isolated <- err }()
	// b1's answer does not wait for its outcome's commit, held behind the
	// removal: only its intent is written when the daemon is killed.
	crashed := t.TempDir()
	select {
	case err := <-isolated:
		if err != nil {
			close(hold)
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(hold)
		t.Fatal("b1's Isolate did not answer within 10 s while the database was busy")
	}
	if r, err := s.Get(bg, "b1"); err != nil || r.State != StateIsolated {
		close(hold)
		t.Fatalf("b1 after its Isolate answered: %+v %v", r, err)
	}
	copyDir(t, dir, crashed)
	close(hold)
	s.Close()

	s2 := newTestIsolator(t, crashed, dp)
	defer s2.Close()
	if _, err := s2.Get(bg, "z1"); KindOf(err) != ErrNotFound {
		t.Fatalf("z1 after a kill before its removal was committed: %v", err)
	}
	if r, err := s2.Get(bg, "b1"); err != nil || r.State != StateIsolated {
		t.Fatalf("b1 after the restart: %+v %v", r, err)
	}
	if _, err := s2.Isolate(bg, "x1", nsTarget(t, "nsShared")); err == nil {
		t.Fatal("b1's namespace isolated a second time (x1) after the restart")
	}
}
