package dataplane

import (
	"context"
	"net"
	"testing"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/tcfilter"
)

// cutOrGone fails unless host link idx is gone or muted (down without
// cls_bpf).
func cutOrGone(t *testing.T, d *DataPlane, idx int, when string) {
	t.Helper()
	l, err := d.h.LinkByIndex(idx)
	if err != nil {
		return // deleted
	}
	if !d.sink.BPF {
		if l.Attrs().Flags&net.FlagUp != 0 {
			t.Errorf("%s: retired veth %s is up without cls_bpf", when, l.Attrs().Name)
		}
		return
	}
	if muted, err := tcfilter.Muted(d.h, idx); err != nil || !muted {
		t.Errorf("%s: retired veth %s (group %#x) not muted: %v %v", when, l.Attrs().Name, l.Attrs().Group, muted, err)
	}
}

// TestRetiredVethCutAgain: a veth moved to the deletion group but not cut
// off (a retire that failed, or a daemon killed, between the two) keeps
// its filters: the tenant would still send with its old ports once they
// are released. The teardown done again and the next start cut it off.
func TestRetiredVethCutAgain(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	b := e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	group := func(c ctr) int {
		t.Helper()
		l, err := e.d.h.LinkByName(plane.VethName(c.c.ID))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.d.h.LinkSetGroup(l, RetiredGroup); err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}

	// The teardown done again, in the same run.
	e.d.retired.held.Add(1)
	vethA := group(a)
	e.cleanupMount(a.c.ID)
	if _, err := e.d.Teardown(context.Background(), a.c); err != nil {
		t.Fatal(err)
	}
	cutOrGone(t, e.d, vethA, "after the teardown")
	e.d.retired.held.Add(-1)

	// The next start.
	vethB := group(b)
	e.cleanupMount(b.c.ID)
	e.d.Close()
	d := e.newDataPlane()
	if _, err := d.PrepareHost(context.Background()); err != nil {
		t.Fatal(err)
	}
	cutOrGone(t, d, vethB, "after the start")
	e.waitNoRetired(d)
}
