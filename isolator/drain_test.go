package isolator

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
)

// drainDP is the fake data plane with drains recorded.
type drainDP struct {
	*fakeDP
	mu    sync.Mutex
	calls []string
	fail  uint16 // a drain of this port fails
}

func (d *drainDP) Drain(_ context.Context, c plane.Container, port uint16, on bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if on && port == d.fail {
		return errors.New("drain fails")
	}
	d.calls = append(d.calls, c.ID+":"+strconv.Itoa(int(port))+":"+map[bool]string{true: "on", false: "off"}[on])
	return nil
}

func (d *drainDP) DrainState(string) []plane.DrainPort { return nil }

func (d *drainDP) CutDrain(context.Context, plane.Container, uint16) error { return nil }

func (d *drainDP) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.calls...)
}

func wantKind(t *testing.T, err error, k *Kind, mentions ...string) {
	t.Helper()
	if !errors.Is(err, k) {
		t.Fatalf("got %v, want %s", err, k)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("%q does not mention %q", err, m)
		}
	}
}

// TestHandoffBookkeeping: bad handoffs and drains change nothing; a
// successor reserves the port shared with its predecessor (made shared),
// the predecessor drains once the successor is isolated, and the
// successor holds the port exclusively again after the predecessor's
// cleanup.
func TestHandoffBookkeeping(t *testing.T) {
	dp := &drainDP{fakeDP: newFakeDP()}
	s, err := New(testConfig(t, t.TempDir()), dp)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	if _, err := s.Start(bg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	one := func(p uint32) []PortSpec { return []PortSpec{{p, p, false}} }
	if _, err := s.Prepare(bg, "a", one(31000)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "a", nsTarget(t, "a")); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Get(bg, "a")

	_, err = s.PrepareWith(bg, "x", PrepareOptions{Ports: one(31001), HandoffFrom: "a", HandoffPorts: []uint16{31001}})
	wantKind(t, err, ErrFailedPrecondition, "handoff_ports", "31001", "nobody")
	_, err = s.PrepareWith(bg, "x", PrepareOptions{Ports: one(31002), HandoffFrom: "a", HandoffPorts: []uint16{31000}})
	wantKind(t, err, ErrInvalidArgument, "handoff_ports", "31000")
	_, err = s.PrepareWith(bg, "x", PrepareOptions{Ports: one(31000), HandoffFrom: "ghost", HandoffPorts: []uint16{31000}})
	wantKind(t, err, ErrInvalidArgument, "handoff_from", "ghost")
	_, err = s.PrepareWith(bg, "x", PrepareOptions{Ports: one(31000), HandoffPorts: []uint16{31000}})
	wantKind(t, err, ErrInvalidArgument, "handoff_ports")
	_, err = s.Drain(bg, "a", []uint16{31005}, false, 0)
	wantKind(t, err, ErrInvalidArgument, "ports", "31005", "nobody")
	_, err = s.Drain(bg, "x", []uint16{31000}, false, 0)
	wantKind(t, err, ErrNotFound, "x")
	after, _ := s.Get(bg, "a")
	if !after.Ports.Equal(before.Ports) || !after.Shared.Equal(before.Shared) || !after.Draining.Empty() {
		t.Fatalf("bad input changed a: %+v", after)
	}
	if _, err := s.Get(bg, "x"); err == nil {
		t.Fatal("a refused prepare left x")
	}
	if c := dp.got(); len(c) != 0 {
		t.Fatalf("drains after bad input: %v", c)
	}

	b, err := s.PrepareWith(bg, "b", PrepareOptions{Ports: one(31000), HandoffFrom: "a", HandoffPorts: []uint16{31000}})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.Get(bg, "a")
	if !a.Shared.Contains(31000) || a.Ports.Contains(31000) || !b.Shared.Contains(31000) || b.HandoffFrom != "a" {
		t.Fatalf("after b's prepare: a %s/%s, b %s/%s from %q", a.Ports, a.Shared, b.Ports, b.Shared, b.HandoffFrom)
	}
	if c := dp.got(); len(c) != 0 {
		t.Fatalf("drains before b is isolated: %v", c)
	}
	if b, err = s.Isolate(bg, "b", nsTarget(t, "b")); err != nil {
		t.Fatal(err)
	}
	if c := dp.got(); len(c) != 1 || c[0] != "a:31000:on" {
		t.Fatalf("drains after b's isolate: %v", c)
	}
	a, _ = s.Get(bg, "a")
	if !a.Draining.Contains(31000) || b.HandoffFrom != "" {
		t.Fatalf("after b's isolate: a drains %s, b handoff from %q", a.Draining, b.HandoffFrom)
	}
	if err := s.Cleanup(bg, "a"); err != nil {
		t.Fatal(err)
	}
	b, _ = s.Get(bg, "b")
	if !b.Ports.Contains(31000) || !b.Shared.Empty() {
		t.Fatalf("after a's cleanup b holds %s exclusively, %s shared; want 31000 exclusively", b.Ports, b.Shared)
	}
	_, err = s.Prepare(bg, "y", []PortSpec{{31000, 31000, true}})
	wantKind(t, err, ErrFailedPrecondition, "b")
}

// TestHandoffPrepareFailsGivesBack: a successor's Prepare that fails after
// the predecessor's exclusive port became shared (no ephemeral block left)
// leaves the predecessor holding it exclusively again, as before the call;
// the same Prepare succeeds once a block is free.
func TestHandoffPrepareFailsGivesBack(t *testing.T) {
	dp := &drainDP{fakeDP: newFakeDP()}
	s, err := New(testConfig(t, t.TempDir()), dp)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	if _, err := s.Start(bg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	one := func(p uint32) []PortSpec { return []PortSpec{{p, p, false}} }
	if _, err := s.Prepare(bg, "a", one(31000)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "a", nsTarget(t, "a")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"f1", "f2", "f3"} { // the pool's other 3 blocks
		if _, err := s.Prepare(bg, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	opts := PrepareOptions{Ports: one(31000), HandoffFrom: "a", HandoffPorts: []uint16{31000}}
	_, err = s.PrepareWith(bg, "b", opts)
	wantKind(t, err, ErrResourceExhausted, "ephemeral")
	a, _ := s.Get(bg, "a")
	if !a.Ports.Contains(31000) || a.Shared.Contains(31000) {
		t.Fatalf("after b's failed prepare a holds %s exclusively, %s shared; want 31000 exclusively again", a.Ports, a.Shared)
	}
	_, err = s.Prepare(bg, "y", []PortSpec{{31000, 31000, true}})
	wantKind(t, err, ErrFailedPrecondition, "a")
	if err := s.Cleanup(bg, "f3"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PrepareWith(bg, "b", opts); err != nil {
		t.Fatal(err)
	}
	if a, _ = s.Get(bg, "a"); !a.Shared.Contains(31000) {
		t.Fatalf("after b's prepare a holds %s exclusively, %s shared; want 31000 shared", a.Ports, a.Shared)
	}
}

// TestDrainFailsGivesBack: a drain the data plane refuses leaves the
// container's exclusive ports exclusive (they became shared for the
// drain), its other drains undone and nothing draining.
func TestDrainFailsGivesBack(t *testing.T) {
	dp := &drainDP{fakeDP: newFakeDP(), fail: 31001}
	s, err := New(testConfig(t, t.TempDir()), dp)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	if _, err := s.Start(bg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Prepare(bg, "a", []PortSpec{{31000, 31001, false}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "a", nsTarget(t, "a")); err != nil {
		t.Fatal(err)
	}
	_, err = s.Drain(bg, "a", []uint16{31000, 31001}, false, 0)
	wantKind(t, err, ErrInternal, "31001")
	a, _ := s.Get(bg, "a")
	if !a.Ports.Contains(31000) || !a.Ports.Contains(31001) || !a.Shared.Empty() || !a.Draining.Empty() {
		t.Fatalf("after a failed drain a holds %s exclusively, %s shared, drains %s; want 31000-31001 exclusively", a.Ports, a.Shared, a.Draining)
	}
	if c := dp.got(); len(c) != 2 || c[0] != "a:31000:on" || c[1] != "a:31000:off" {
		t.Errorf("drains: %v, want 31000 on then off", c)
	}
	_, err = s.Prepare(bg, "y", []PortSpec{{31000, 31000, true}})
	wantKind(t, err, ErrFailedPrecondition, "a")
	// A drain with a deadline records both at once.
	r, err := s.Drain(bg, "a", []uint16{31000}, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Draining.Contains(31000) || time.Until(r.DrainDeadline) < 59*time.Minute {
		t.Errorf("drain with a deadline: draining %s, deadline %v", r.Draining, r.DrainDeadline)
	}
}
