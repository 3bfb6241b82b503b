package isolator

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"
)

// Get, List, Usage and Status answer while the bookkeeping mutex is held
// (as it is, briefly but by every call, during a burst of setups and
// teardowns): they read the records' view and never queue for it.
func TestReadsDoNotWaitForBookkeeping(t *testing.T) {
	dp := newFakeDP()
	s := newTestIsolator(t, t.TempDir(), dp)
	if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	done := make(chan error, 1)
	go func() {
		r, err := s.Get(bg, "c1")
		if err == nil && r.State != StateIsolated {
			err = fmt.Errorf("get: state %s, want isolated", r.State)
		}
		if err == nil {
			if l := s.List(bg); len(l) != 1 || l[0].ID != "c1" {
				err = fmt.Errorf("list: %+v", l)
			}
		}
		if err == nil {
			_, _, err = s.Usage(bg, "c1")
		}
		if err == nil {
			if st := s.Status(bg); st.Containers[StateIsolated] != 1 || st.BlocksUsed != 1 || st.ExclusivePorts.String() != "31000" {
				err = fmt.Errorf("status: containers %v, blocks %d, ports %s", st.Containers, st.BlocksUsed, st.ExclusivePorts)
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		s.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		s.mu.Unlock()
		t.Fatal("Get, List, Usage and Status did not answer within 10s while the bookkeeping mutex was held")
	}
}

// Under a churn of prepares, isolations, updates and cleanups, every record
// a read returns is one the lifecycle published, and once the churn is over
// the view is exactly the records (run with -race).
func TestViewFollowsRecords(t *testing.T) {
	dp := newFakeDP()
	s := newTestIsolator(t, t.TempDir(), dp)
	const workers, rounds = 4, 30
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readErr := make(chan error, 2)
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for i := 0; i < 100_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d", i%workers)
				if r, err := s.Get(bg, id); err == nil && (r.ID != id || !validState(r.State)) {
					readErr <- fmt.Errorf("get %s: %+v", id, r)
					return
				} else if err != nil && KindOf(err) != ErrNotFound {
					readErr <- fmt.Errorf("get %s: %v", id, err)
					return
				}
				l := s.List(bg)
				if !sort.SliceIsSorted(l, func(i, j int) bool { return l[i].ID < l[j].ID }) || len(l) > workers {
					readErr <- fmt.Errorf("list: %+v", l)
					return
				}
			}
		}()
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("w%d", w)
			port := uint32(31000 + w)
			for i := range rounds {
				if _, err := s.Prepare(bg, id, []PortSpec{{Begin: port, End: port}}); err != nil {
					errs <- err
					return
				}
				if _, err := s.Isolate(bg, id, nsTarget(t, id)); err != nil {
					errs <- err
					return
				}
				if _, err := s.Update(bg, id, []PortSpec{{Begin: port + 100, End: port + 100}}); err != nil {
					errs <- err
					return
				}
				if i == rounds-1 && w%2 == 0 {
					return // left isolated
				}
				if err := s.Cleanup(bg, id); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	close(readErr)
	for err := range errs {
		t.Fatal(err)
	}
	for err := range readErr {
		t.Fatal(err)
	}
	s.mu.Lock()
	want := map[string]Record{}
	for id, r := range s.records {
		want[id] = *r
	}
	s.mu.Unlock()
	got := s.List(bg)
	if len(got) != len(want) || len(got) != workers/2 {
		t.Fatalf("list: %d records, the lifecycle has %d, want %d", len(got), len(want), workers/2)
	}
	for _, r := range got {
		w, ok := want[r.ID]
		if !ok || r.State != StateIsolated || w.Seq != r.Seq || !r.Ports.Equal(w.Ports) || r.Veth != w.Veth {
			t.Fatalf("list: %+v, the lifecycle has %+v", r, w)
		}
	}
}

func validState(st State) bool {
	switch st {
	case StatePrepared, StateIsolating, StateIsolated, StateUpdating, StateCleaning:
		return true
	}
	return false
}

// A restart shows the recovered records to reads, and none that recovery
// removed.
func TestViewAfterRestart(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	for _, id := range []string{"a", "b"} {
		if _, err := s.Prepare(bg, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Isolate(bg, "a", nsTarget(t, "a")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2 := newTestIsolator(t, dir, dp)
	l := s2.List(bg)
	if len(l) != 2 || l[0].ID != "a" || l[0].State != StateIsolated || l[1].ID != "b" || l[1].State != StatePrepared {
		t.Fatalf("list after restart: %+v", l)
	}
	if r, err := s2.Get(bg, "a"); err != nil || r.Veth == "" {
		t.Fatalf("get after restart: %+v, %v", r, err)
	}
}
