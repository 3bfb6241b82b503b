package dataplane

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nspin"
)

// TestRemoveStraysLeavesRuntimePins: RemoveStrays (the operator's
// remove-unattributed) unmounts only the namespace pins isolatord made for
// stray veths. Three containers whose veths a restarted data plane cannot
// attribute: A uses a runtime's pin of its namespace at <id>, B has
// isolatord's own pin at <id>, C has isolatord's pin at <id>@isolatord
// beside a runtime's pin of another namespace at <id>. Afterwards the
// runtime's pins of A and C still pin their namespaces; B's and C's own
// are gone; the veths are gone.
func TestRemoveStraysLeavesRuntimePins(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	dir := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() {
		for i := 0; i < 4; i++ {
			if unix.Unmount(dir, unix.MNT_DETACH) != nil {
				break
			}
		}
	})
	d, err := New(Config{HostNS: e.sb.Host.Path, NetNSDir: dir, Logger: quietLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	if _, err := d.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}

	pa := e.spawn("A", []uint16{31000}, false)
	a := e.spec("A", pa, 4, "40960-41983", "31000", "")
	theirsA := runtimePin(t, pa.NetNS, dir, a.ID)
	pb := e.spawn("B", []uint16{31001}, false)
	b := e.spec("B", pb, 5, "41984-43007", "31001", "")
	pc := e.spawn("C", []uint16{31002}, false)
	c := e.spec("C", pc, 6, "43008-44031", "31002", "")
	theirsC := runtimePin(t, pa.NetNS, dir, c.ID) // another namespace
	want := map[string]bool{a.ID: false, b.ID: true, c.ID: true}
	for _, x := range []plane.Container{a, b, c} {
		pl, err := d.Setup(ctx, x)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Teardown(ctx, x); nspin.Unmount(dir, x.ID); nspin.Unmount(dir, x.ID+nspin.Suffix) })
		if pl.PinOwned != want[x.ID] {
			t.Fatalf("Setup %s: pin %s owned %v, want owned %v", x.ID, pl.Mount, pl.PinOwned, want[x.ID])
		}
	}
	ownB, ownC := filepath.Join(dir, b.ID), filepath.Join(dir, c.ID+nspin.Suffix)
	stillPins(t, ownB, pb.NetNS)
	stillPins(t, ownC, pc.NetNS)

	// A restarted data plane without records: all three veths are strays.
	d2, err := New(Config{HostNS: e.sb.Host.Path, NetNSDir: dir, Logger: quietLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	listed, err := d2.Strays(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	removed, err := d2.RemoveStrays(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range [][]string{listed, removed} {
		for _, p := range []string{ownB, ownC} {
			if !slices.Contains(got, "bind mount "+p) {
				t.Errorf("isolatord's own pin %s of a stray veth not reported removed: %v", p, got)
			}
		}
		for _, p := range []string{theirsA, theirsC} {
			if slices.Contains(got, "bind mount "+p) {
				t.Errorf("the runtime's pin %s reported removed: %v", p, got)
			}
		}
		for _, x := range []plane.Container{a, b, c} {
			if !slices.Contains(got, "veth "+plane.VethName(x.ID)) {
				t.Errorf("stray veth of %s not reported: %v", x.ID, got)
			}
		}
	}
	stillPins(t, theirsA, pa.NetNS)
	stillPins(t, theirsC, pa.NetNS)
	mounts, err := nspin.NsMounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 2 {
		t.Errorf("mounts in %s after RemoveStrays: %v, want only the runtime's two", dir, mounts)
	}
	for _, x := range []plane.Container{a, b, c} {
		if e.hasLink(plane.VethName(x.ID)) {
			t.Errorf("stray veth of %s left", x.ID)
		}
	}
}
