package isolator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
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
