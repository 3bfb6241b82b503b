package isolator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/test/wait"
)

// fakeHostPorts is the host namespace as HostPorts sees it: ports host
// processes hold, and ports reserved. Reserving a port twice is a test
// failure (a shared port must be reserved once).
type fakeHostPorts struct {
	t        *testing.T
	mu       sync.Mutex
	host     map[uint16]string // port -> holder ("nginx (pid 42)")
	reserved map[uint16]bool
	reserves int // ports passed to Reserve and taken
}

func newFakeHostPorts(t *testing.T) *fakeHostPorts {
	return &fakeHostPorts{t: t, host: map[uint16]string{}, reserved: map[uint16]bool{}}
}

type fakeHeld struct {
	port   uint16
	holder string
}

func (e fakeHeld) Error() string {
	return fmt.Sprintf("port %d is held on the host by %s", e.port, e.holder)
}
func (e fakeHeld) HeldPort() uint16 { return e.port }

func (f *fakeHostPorts) Reserve(ports ephemeral.Set) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range ports.Ports() {
		if h, ok := f.host[p]; ok {
			return fakeHeld{p, h}
		}
		if f.reserved[p] {
			f.t.Errorf("port %d reserved twice", p)
		}
	}
	for _, p := range ports.Ports() {
		f.reserved[p] = true
		f.reserves++
	}
	return nil
}

func (f *fakeHostPorts) Release(ports ephemeral.Set) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range ports.Ports() {
		delete(f.reserved, p)
	}
}

// set returns the reserved ports.
func (f *fakeHostPorts) set() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var rs []ephemeral.Range
	for p := range f.reserved {
		rs = append(rs, ephemeral.Range{Begin: p, End: p})
	}
	return ephemeral.NewSet(rs...).String()
}

func newHostPortsIsolator(t *testing.T, dir string, dp *fakeDP, hp *fakeHostPorts) (*Isolator, RecoveryReport) {
	t.Helper()
	cfg := testConfig(t, dir)
	cfg.HostPorts = hp
	cfg.HostPortsRetry = 5 * time.Millisecond
	s, err := New(cfg, dp)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := s.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, rep
}

func wantReserved(t *testing.T, s *Isolator, hp *fakeHostPorts, want string) {
	t.Helper()
	if got := hp.set(); got != want {
		t.Fatalf("reserved on the host: %q, want %q", got, want)
	}
	if st := s.Status(bg).HostPorts; !st.Enabled || st.Reserved != ephemeral.MustParseSet(want).Len() {
		t.Fatalf("status: %+v, want %d reserved", st, ephemeral.MustParseSet(want).Len())
	}
}

// TestHostPortHeldRefusesPrepareAndUpdate: a port a host process holds is
// refused, naming port and holder, and the refused call changes nothing.
func TestHostPortHeldRefusesPrepareAndUpdate(t *testing.T) {
	dp := newFakeDP()
	hp := newFakeHostPorts(t)
	hp.host[31005] = "nginx (pid 42)"
	s, _ := newHostPortsIsolator(t, t.TempDir(), dp, hp)

	_, err := s.Prepare(bg, "c1", ports("31000-31009"))
	wantCode(t, err, ErrFailedPrecondition, "ports:", "31005", "nginx (pid 42)")
	if !IsHostPortHeld(err) {
		t.Fatalf("IsHostPortHeld(%v) = false", err)
	}
	if _, err := s.Get(bg, "c1"); KindOf(err) != ErrNotFound {
		t.Fatalf("refused prepare left c1: %v", err)
	}
	if st := s.Status(bg); st.BlocksUsed != 0 || !st.ExclusivePorts.Empty() {
		t.Fatalf("refused prepare holds something: %+v", st)
	}
	wantReserved(t, s, hp, "")
	// Shared too.
	_, err = s.Prepare(bg, "c1", sharedPorts("31005"))
	wantCode(t, err, ErrFailedPrecondition, "31005", "nginx (pid 42)")

	// The other ports are free; the slot, block and ports are reusable.
	if _, err := s.Prepare(bg, "c1", ports("31000-31004")); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, hp, "31000-31004")

	for _, isolated := range []bool{false, true} {
		if isolated {
			if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
				t.Fatal(err)
			}
		}
		_, err = s.Update(bg, "c1", ports("31000-31005"))
		wantCode(t, err, ErrFailedPrecondition, "31005", "nginx (pid 42)")
		if r, _ := s.Get(bg, "c1"); r.Ports.String() != "31000-31004" || r.State != map[bool]State{false: StatePrepared, true: StateIsolated}[isolated] {
			t.Fatalf("refused update changed the record: %+v", r)
		}
		wantReserved(t, s, hp, "31000-31004")
		// c1 still holds its ports.
		_, err = s.Prepare(bg, "c2", ports("31004"))
		wantCode(t, err, ErrFailedPrecondition, "31004", "c1")
	}
	if own := dp.Owners(); len(own[31004]) != 1 || len(own[31005]) != 0 {
		t.Fatalf("data plane ports after a refused update: 31004 %v, 31005 %v", own[31004], own[31005])
	}

	// An update that moves: the new ports reserved, the old released.
	if _, err := s.Update(bg, "c1", ports("31002-31003,31006")); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, hp, "31002-31003,31006")
	// A data plane failure puts the old reservations back.
	dp.FailNext["setports"] = errors.New("injected")
	if _, err := s.Update(bg, "c1", ports("31007")); err == nil {
		t.Fatal("update with a failing data plane succeeded")
	}
	wantReserved(t, s, hp, "31002-31003,31006")

	if err := s.Cleanup(bg, "c1"); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, hp, "")
}

// TestHostPortsSharedReservedOnce: a shared port is reserved for its first
// holder and released when its last holder leaves.
func TestHostPortsSharedReservedOnce(t *testing.T) {
	dp := newFakeDP()
	hp := newFakeHostPorts(t)
	s, _ := newHostPortsIsolator(t, t.TempDir(), dp, hp)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Prepare(bg, id, sharedPorts("31100-31101")); err != nil {
			t.Fatal(err)
		}
	}
	wantReserved(t, s, hp, "31100-31101")
	if hp.reserves != 2 {
		t.Fatalf("%d ports reserved for 3 holders of 2 shared ports, want 2", hp.reserves)
	}
	if _, err := s.Update(bg, "b", sharedPorts("31101")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "c"} {
		wantReserved(t, s, hp, "31100-31101")
		if err := s.Cleanup(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	wantReserved(t, s, hp, "31101")
	if err := s.Cleanup(bg, "b"); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, hp, "")
}

// TestHostPortsRetakenAtRestart: a restarted lifecycle (the reservations
// died with the process) takes them again; a port a host process bound in
// between is reported (recovery report, status), and reserved again once
// that process lets it go.
func TestHostPortsRetakenAtRestart(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	hp := newFakeHostPorts(t)
	s, _ := newHostPortsIsolator(t, dir, dp, hp)
	if _, err := s.Prepare(bg, "c1", ports("31000-31002")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(bg, "c2", sharedPorts("31010")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(bg, "c3", sharedPorts("31010")); err != nil {
		t.Fatal(err)
	}
	s.Close()

	hp2 := newFakeHostPorts(t) // the old process's sockets are gone
	hp2.host[31001] = "squatter (pid 7)"
	s2, rep := newHostPortsIsolator(t, dir, dp, hp2)
	if len(rep.HostPortConflicts) != 1 || rep.HostPortConflicts[0].Port != 31001 {
		t.Fatalf("recovery conflicts: %+v", rep.HostPortConflicts)
	}
	wantReserved(t, s2, hp2, "31000,31002,31010")
	st := s2.Status(bg).HostPorts
	if len(st.Conflicts) != 1 || st.Conflicts[0].Port != 31001 || st.Conflicts[0].Holder != "port 31001 is held on the host by squatter (pid 7)" {
		t.Fatalf("status conflicts: %+v", st.Conflicts)
	}
	if r, err := s2.Get(bg, "c1"); err != nil || r.State != StateIsolated || r.Ports.String() != "31000-31002" {
		t.Fatalf("c1 after restart: %+v %v", r, err)
	}
	// The squatter goes: the port is reserved again, the conflict cleared.
	hp2.mu.Lock()
	delete(hp2.host, 31001)
	hp2.mu.Unlock()
	if !wait.Until(5*time.Second, func() bool { return len(s2.Status(bg).HostPorts.Conflicts) == 0 }) {
		t.Fatalf("conflict not cleared 5s after the squatter left: %+v", s2.Status(bg).HostPorts)
	}
	wantReserved(t, s2, hp2, "31000-31002,31010")
	if err := s2.Cleanup(bg, "c1"); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s2, hp2, "31010")
	for _, id := range []string{"c2", "c3"} {
		if err := s2.Cleanup(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	wantReserved(t, s2, hp2, "")
}

// TestHostPortsOff: without a HostPorts nothing is reserved or refused.
func TestHostPortsOff(t *testing.T) {
	s := newTestIsolator(t, t.TempDir(), newFakeDP())
	if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
		t.Fatal(err)
	}
	if st := s.Status(bg).HostPorts; st.Enabled || st.Reserved != 0 {
		t.Fatalf("status without host ports: %+v", st)
	}
}
