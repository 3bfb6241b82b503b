package isolator

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/store"
)

// found is a container the fake kernel shows, in a fake namespace.
func found(t *testing.T, id string, slot uint16, eph string, ports string) plane.Found {
	p := nsTarget(t, "rb-"+id).NetNSPath
	ino, err := newFakeDP().NetNSInode(p)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ephemeral.ParseSet(eph)
	if err != nil {
		t.Fatal(err)
	}
	return plane.Found{
		Container: plane.Container{ID: id, Slot: slot, NetNS: p, Ephemeral: r.Ranges()[0],
			Ports: ephemeral.MustParseSet(ports), Meta: plane.Meta{ID: id, Labels: map[string]string{"a": id}}},
		Veth: plane.VethName(id), Mount: p, NetNSIno: ino, Created: time.Unix(1700000000, 0).UTC(),
	}
}

// TestRebuildFromKernel: with no state, every container the kernel shows
// gets a record (ports, block, labels, creation time) and its ports are
// held; one whose slot a record holds is left alone and reported; what
// the kernel could not say is named; a second start finds the records.
func TestRebuildFromKernel(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	// a record that holds slot 1 (prepared, unknown to the kernel)
	s := newTestIsolator(t, dir, dp)
	if _, err := s.Prepare(bg, "known", nil); err != nil {
		t.Fatal(err)
	}
	s.Close()

	a := found(t, "a", 2, "33024-33279", "31001")
	b := found(t, "b", 3, "33280-33535", "31002-31003")
	b.Lost = []string{"labels", "creation time"}
	clash := found(t, "clash", 1, "33536-33791", "31004")
	for _, f := range []plane.Found{a, b, clash} {
		dp.Plumbed[f.ID] = f.Container
	}
	dp.Discovered = plane.Discovery{Found: []plane.Found{a, b, clash}, Unattributed: []string{"veth iso000000000000: no container ID"}}

	s2 := newTestIsolator(t, dir, dp)
	ra, err := s2.Get(bg, "a")
	if err != nil || ra.State != StateIsolated || ra.Ports.String() != "31001" || ra.Ephemeral.Begin != 33024 || ra.Labels["a"] != "a" || !ra.Created.Equal(a.Created) || ra.Mount != a.Mount {
		t.Fatalf("a rebuilt as %+v, %v", ra, err)
	}
	rb, err := s2.Get(bg, "b")
	if err != nil || strings.Join(rb.Lost, ",") != "labels,creation time" || rb.Ports.String() != "31002-31003" {
		t.Fatalf("b rebuilt as %+v, %v", rb, err)
	}
	if _, err := s2.Get(bg, "clash"); err == nil {
		t.Fatal("a container whose slot a record holds was given a record")
	}
	if _, ok := dp.Plumbed["clash"]; !ok {
		t.Fatal("the clashing container's plumbing was removed")
	}
	u := strings.Join(s2.Unattributed(), "\n")
	if !strings.Contains(u, "clash") || !strings.Contains(u, "no container ID") {
		t.Fatalf("unattributed: %s", u)
	}
	if s2.RebuiltCount() != 2 {
		t.Fatalf("rebuilt %d, want 2", s2.RebuiltCount())
	}
	// the rebuilt ports are held: nobody else gets them
	if _, err := s2.Prepare(bg, "c", []PortSpec{{Begin: 31002, End: 31002}}); err == nil {
		t.Fatal("port 31002 of a rebuilt container handed out again")
	}
	s2.Close()

	// the next start finds the records: nothing rebuilt
	s3 := newTestIsolator(t, dir, dp)
	if n := s3.RebuiltCount(); n != 0 {
		t.Fatalf("second start rebuilt %d", n)
	}
	if r, err := s3.Get(bg, "a"); err != nil || r.State != StateIsolated {
		t.Fatalf("a after the second start: %+v %v", r, err)
	}
	_ = os.Remove(filepath.Join(dir, "isolatord.db"))
}

// TestRebuildHoldsAndInfers: a container whose veth alias does not name
// its block (a setup cut short before the alias) gets the pool block among the ranges the
// host routes to it; what an unattributed object still routes (a slot, a
// block, a static port) is never handed out until RemoveUnattributed.
func TestRebuildHoldsAndInfers(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	old := found(t, "old", 2, "32768-33023", "31005")
	dp.Plumbed[old.ID] = old.Container
	old.Ephemeral, old.Ports = ephemeral.Range{}, ephemeral.MustParseSet("31005,32768-33023")
	held := plane.Held{What: "veth iso0123456789ab: its namespace pin is gone", Slots: []uint16{1},
		Ports: ephemeral.MustParseSet("31010,33024-33279")}
	dp.Discovered = plane.Discovery{Found: []plane.Found{old}, Held: []plane.Held{held},
		Unattributed: []string{held.What}}

	s := newTestIsolator(t, dir, dp)
	r, err := s.Get(bg, "old")
	if err != nil || r.Ephemeral.String() != "32768-33023" || r.Ports.String() != "31005" || !strings.Contains(strings.Join(r.Lost, ","), "ephemeral block") {
		t.Fatalf("old rebuilt as %+v, %v", r, err)
	}
	if _, err := s.Prepare(bg, "p0", []PortSpec{{Begin: 31010, End: 31010}}); err == nil {
		t.Fatal("a held static port handed out")
	}
	for _, id := range []string{"p1", "p2"} {
		p, err := s.Prepare(bg, id, nil)
		if err != nil {
			t.Fatal(err)
		}
		if p.Ephemeral.Begin == 33024 || p.Slot == 1 {
			t.Fatalf("%s got the held block or slot: %+v", id, p)
		}
	}
	if _, err := s.Prepare(bg, "p3", nil); err == nil {
		t.Fatal("a fourth block out of four, one of them held")
	}
	if _, err := s.RemoveUnattributed(bg); err != nil {
		t.Fatal(err)
	}
	p, err := s.Prepare(bg, "p3", []PortSpec{{Begin: 31010, End: 31010}})
	if err != nil || p.Ephemeral.Begin != 33024 {
		t.Fatalf("after RemoveUnattributed: %+v, %v", p, err)
	}
}

// TestRecoveryFailureDoesNotStopStart: a container whose recovery fails is
// reported and left as it is; the others are recovered and the API serves.
func TestRecoveryFailureDoesNotStopStart(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	for _, id := range []string{"a", "b"} {
		if _, err := s.Prepare(bg, id, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Isolate(bg, id, nsTarget(t, "rf-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	dp.FailNext["check"] = errors.New("netlink: injected")
	s2 := newTestIsolator(t, dir, dp)
	u := strings.Join(s2.Unattributed(), "\n")
	if !strings.Contains(u, "container a: recovery failed") || !strings.Contains(u, "injected") {
		t.Fatalf("failure not reported: %q", u)
	}
	for _, id := range []string{"a", "b"} {
		if r, err := s2.Get(bg, id); err != nil || r.State != StateIsolated {
			t.Fatalf("%s after start: %+v, %v", id, r, err)
		}
	}
	if _, err := s2.Prepare(bg, "c", nil); err != nil {
		t.Fatalf("API after a failed recovery: %v", err)
	}
}

// A record whose slot is taken at start is reported, and what it holds
// stays held: its kernel objects may still route its block and ports, so
// neither goes to a new container.
func TestRecordWithTakenSlotKeepsItsPorts(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	for _, id := range []string{"a", "b"} {
		if _, err := s.Prepare(bg, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	st, err := store.Open[Record](dir, quietLogger(), validateID)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	var a, b *Record
	for _, r := range recs {
		switch r.ID {
		case "a":
			a = r
		case "b":
			b = r
		}
	}
	if a == nil || b == nil {
		t.Fatalf("records: %+v", recs)
	}
	b.Slot = a.Slot
	if err := st.Put(b); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := newTestIsolator(t, dir, dp)
	if u := strings.Join(s2.Unattributed(), "\n"); !strings.Contains(u, "container b: ") {
		t.Fatalf("b's taken slot not reported: %q", u)
	}
	got := 0
	for i := range 8 {
		r, err := s2.Prepare(bg, fmt.Sprintf("n%d", i), nil)
		if err != nil {
			break
		}
		got++
		if r.Ephemeral == b.Ephemeral {
			t.Fatalf("b's block %v, still held in the kernel, handed to n%d", b.Ephemeral, i)
		}
	}
	if got == 0 {
		t.Fatal("no container could be prepared after the start")
	}
}
