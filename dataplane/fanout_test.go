package dataplane

import (
	"context"
	"testing"

	"github.com/isolatord/isolatord/tcfilter"
)

// fanoutNodes reads eth0's ICMP fan-out nodes from the kernel: slot ->
// mirror target.
func fanoutNodes(t *testing.T, d *DataPlane) map[uint16]int {
	t.Helper()
	es, err := d.eth0.Entries()
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint16]int{}
	for _, e := range es {
		if e.Kind == tcfilter.EntryICMP {
			out[e.Slot] = e.Target
		}
	}
	return out
}

// TestFanoutOnlyWithoutEcho: with the echo programs nothing leads to the
// ICMP fan-out table, so a setup makes no fan-out node (and no mirror
// action); a node a run without the echo programs left beside them goes with
// its container's teardown, which reports nothing missing. Without them
// (fanoutAlways plays that here), a setup makes the node, a teardown of a
// container plumbed beside the echo programs misses none, and a restarted
// data plane's Adopt puts back a node that went missing instead of Check
// calling for the container to be plumbed again.
func TestFanoutOnlyWithoutEcho(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	if err := e.d.eth0.EchoSteering(); err != nil {
		t.Skipf("echo replies are not steered by the echo programs here (%v): the fan-out is in use", err)
	}
	ctx := context.Background()
	base := mirredActions(t, e)
	a := e.start("A", 1, "40960-41983", "31000", "", 31000)
	if fs := fanoutNodes(t, e.d); len(fs) != 0 {
		t.Errorf("fan-out nodes beside the echo programs: %v", fs)
	}
	if n := mirredActions(t, e) - base; n > 3 {
		t.Errorf("one container added %d mirred actions, want at most 3 (no fan-out mirror)", n)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")

	// A node a run without the echo programs left for B: removed by B's teardown.
	b := e.start("B", 2, "41984-43007", "31010", "", 31010)
	vethB := e.d.ctrs[b.c.ID].veth
	if err := e.d.eth0.AddFanout(b.c.Slot, vethB); err != nil {
		t.Fatal(err)
	}
	if fs := fanoutNodes(t, e.d); len(fs) != 1 || fs[b.c.Slot] != vethB {
		t.Fatalf("fan-out nodes: %v, want B's", fs)
	}
	for _, x := range []ctr{a, b} {
		if miss, err := e.d.Check(ctx, x.c); err != nil || len(miss) != 0 {
			t.Errorf("Check(%s) = %v, %v; want nothing missing", x.c.ID, miss, err)
		}
		rep, err := e.d.Teardown(ctx, x.c)
		if err != nil || len(rep.Missing) != 0 {
			t.Errorf("Teardown(%s) = %+v, %v; want nothing missing", x.c.ID, rep, err)
		}
	}
	if fs := fanoutNodes(t, e.d); len(fs) != 0 {
		t.Errorf("fan-out nodes after the teardowns: %v", fs)
	}

	// The fan-out in use: the node is made, and put back by Adopt; a
	// container plumbed without one has none to remove.
	d := e.start("D", 4, "44032-45055", "31030", "", 31030)
	e.d.fanoutAlways = true
	if rep, err := e.d.Teardown(ctx, d.c); err != nil || len(rep.Missing) != 0 {
		t.Errorf("Teardown(D) = %+v, %v; want nothing missing", rep, err)
	}
	c := e.start("C", 3, "43008-44031", "31020", "", 31020)
	vethC := e.d.ctrs[c.c.ID].veth
	if fs := fanoutNodes(t, e.d); len(fs) != 1 || fs[c.c.Slot] != vethC {
		t.Fatalf("fan-out nodes with the fan-out in use: %v, want C's", fs)
	}
	d2 := e.newDataPlane()
	d2.fanoutAlways = true
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if m, err := d2.eth0.DelFanout(c.c.Slot); err != nil || m != 0 {
		t.Fatalf("DelFanout = %d, %v", m, err)
	}
	if miss, err := d2.Check(ctx, c.c); err != nil || len(miss) != 0 {
		t.Errorf("Check without C's fan-out node = %v, %v; want nothing missing", miss, err)
	}
	if err := d2.Adopt(ctx, c.c); err != nil {
		t.Fatal(err)
	}
	if fs := fanoutNodes(t, d2); len(fs) != 1 || fs[c.c.Slot] != vethC {
		t.Errorf("fan-out nodes after Adopt: %v, want C's back", fs)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31020), "C")
	if rep, err := d2.Teardown(ctx, c.c); err != nil || len(rep.Missing) != 0 {
		t.Errorf("Teardown(C) = %+v, %v; want nothing missing", rep, err)
	}
	if fs := fanoutNodes(t, d2); len(fs) != 0 {
		t.Errorf("fan-out nodes after C's teardown: %v", fs)
	}
}
