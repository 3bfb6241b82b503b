package isolator

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
)

// gatedHostPorts stops Reserve and Release, once armed, until the gate
// opens: a setup or teardown held in the middle of its host reservations
// (the ledger's mutex held, as it is across the real socket syscalls).
type gatedHostPorts struct {
	*fakeHostPorts
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedHostPorts) wait() {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.gate
	}
}

func (g *gatedHostPorts) Reserve(ports ephemeral.Set) error {
	g.wait()
	return g.fakeHostPorts.Reserve(ports)
}

func (g *gatedHostPorts) Release(ports ephemeral.Set) {
	g.wait()
	g.fakeHostPorts.Release(ports)
}

// arm makes the next Reserve or Release stop until the returned function
// is called (at the latest when the test ends).
func (g *gatedHostPorts) arm(t *testing.T) (open func()) {
	g.entered, g.gate = make(chan struct{}), make(chan struct{})
	g.armed.Store(true)
	var once sync.Once
	gate := g.gate
	open = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	return open
}

// readsAnswer fails the test unless Status, Get, List and Usage of c1 answer
// within 10s, and returns the Status.
func readsAnswer(t *testing.T, s *Isolator, during string) Status {
	t.Helper()
	type answer struct {
		st  Status
		err error
	}
	done := make(chan answer, 1)
	go func() {
		st := s.Status(bg)
		r, err := s.Get(bg, "c1")
		if err == nil && r.State != StateIsolated {
			err = fmt.Errorf("get: state %s, want isolated", r.State)
		}
		if err == nil && len(s.List(bg)) == 0 {
			err = fmt.Errorf("list: empty")
		}
		if err == nil {
			_, _, err = s.Usage(bg, "c1")
		}
		done <- answer{st, err}
	}()
	select {
	case a := <-done:
		if a.err != nil {
			t.Fatalf("%s: %v", during, a.err)
		}
		return a.st
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Status, Get, List and Usage did not answer within 10s", during)
	}
	return Status{}
}

// Status, Get, List and Usage answer while a setup and a teardown of
// another container are held in the middle: in their host port
// reservations (the ledger's mutex held) and between the steps of Isolate.
// Status reports what was published before the held call.
func TestReadsAnswerDuringSetupAndTeardown(t *testing.T) {
	dp := newFakeDP()
	hp := &gatedHostPorts{fakeHostPorts: newFakeHostPorts(t)}
	s, _ := newHostPortsIsolator(t, t.TempDir(), dp, hp.fakeHostPorts)
	s.hostPorts.hp = hp
	if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
		t.Fatal(err)
	}

	// A Prepare held in its host reservation.
	open := hp.arm(t)
	prepared := make(chan error, 1)
	go func() {
		_, err := s.Prepare(bg, "c2", ports("31001"))
		prepared <- err
	}()
	<-hp.entered
	st := readsAnswer(t, s, "prepare held in its host reservation")
	if st.Containers[StateIsolated] != 1 || st.Containers[StatePrepared] != 0 || st.HostPorts.Reserved != 1 || st.ExclusivePorts.String() != "31000" {
		t.Errorf("status during the held prepare: containers %v, reserved %d, ports %s; want 1 isolated, 1 reserved, 31000",
			st.Containers, st.HostPorts.Reserved, st.ExclusivePorts)
	}
	open()
	if err := <-prepared; err != nil {
		t.Fatal(err)
	}
	if st := s.Status(bg); st.Containers[StatePrepared] != 1 || st.HostPorts.Reserved != 2 || st.BlocksUsed != 2 || st.ExclusivePorts.String() != "31000-31001" {
		t.Errorf("status after the prepare: containers %v, reserved %d, blocks %d, ports %s; want 1 prepared, 2 reserved, 2 blocks, 31000-31001",
			st.Containers, st.HostPorts.Reserved, st.BlocksUsed, st.ExclusivePorts)
	}

	// An Isolate held between its steps.
	held, resume := make(chan struct{}), make(chan struct{})
	var resumeOnce sync.Once
	t.Cleanup(func() { resumeOnce.Do(func() { close(resume) }) })
	s.SetHook(func(point string) {
		if point == "isolate:plumbed" {
			close(held)
			<-resume
		}
	})
	isolated := make(chan error, 1)
	go func() {
		_, err := s.Isolate(bg, "c2", nsTarget(t, "c2"))
		isolated <- err
	}()
	<-held
	readsAnswer(t, s, "isolate held after plumbing")
	resumeOnce.Do(func() { close(resume) })
	if err := <-isolated; err != nil {
		t.Fatal(err)
	}
	s.SetHook(nil)

	// A Cleanup held in its host release.
	open = hp.arm(t)
	cleaned := make(chan error, 1)
	go func() { cleaned <- s.Cleanup(bg, "c2") }()
	<-hp.entered
	readsAnswer(t, s, "cleanup held in its host release")
	open()
	if err := <-cleaned; err != nil {
		t.Fatal(err)
	}
	if st := s.Status(bg); st.Containers[StateIsolated] != 1 || st.HostPorts.Reserved != 1 || st.BlocksUsed != 1 {
		t.Errorf("status after the cleanup: containers %v, reserved %d, blocks %d; want 1 isolated, 1 reserved, 1 block",
			st.Containers, st.HostPorts.Reserved, st.BlocksUsed)
	}
}
