package dataplane

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
)

// runtimePin pins the namespace at nsPath at dir/name the way a runtime
// does (Nomad: /var/run/netns/<allocID>) and checks at the end that the
// pin is still there and still pins that namespace.
func runtimePin(t *testing.T, nsPath, dir, name string) string {
	t.Helper()
	ns, err := nshandle.Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	p, err := nspin.BindMount(ns, dir, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nspin.Unmount(dir, name) })
	return p
}

func stillPins(t *testing.T, p, nsPath string) {
	t.Helper()
	pinned, err := nshandle.Open(p)
	if err != nil {
		t.Fatalf("the runtime's pin %s is gone: %v", p, err)
	}
	defer pinned.Close()
	want, err := nshandle.Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	if !pinned.SameAs(want) {
		t.Fatalf("the runtime's pin %s now pins another namespace", p)
	}
}

// TestRuntimePinNeverRemoved: isolatord touches only the namespace pins it
// made. A runtime's pin of the same namespace at <netns-dir>/<id> is used
// (PinOwned false) and survives teardown and a failed setup's rollback; a
// runtime's pin of another namespace there makes isolatord pin its own at
// <id>@isolatord (PinOwned true), removed at teardown, theirs untouched.
func TestRuntimePinNeverRemoved(t *testing.T) {
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

	// Same namespace already pinned by the runtime under the container's ID.
	pa := e.spawn("A", []uint16{31000}, false)
	a := e.spec("A", pa, 4, "40960-41983", "31000", "")
	theirs := runtimePin(t, pa.NetNS, dir, a.ID)

	// A failed setup's rollback leaves the runtime's pin.
	d.hook = func(s string) error {
		if s == "container" {
			return errors.New("injected")
		}
		return nil
	}
	if _, err := d.Setup(ctx, a); err == nil {
		t.Fatal("Setup with an injected failure succeeded")
	}
	d.hook = nil
	stillPins(t, theirs, pa.NetNS)

	pl, err := d.Setup(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Teardown(ctx, a) })
	if pl.PinOwned || pl.Mount != theirs {
		t.Errorf("Setup with the runtime's pin in place: mount %s owned %v, want %s not owned", pl.Mount, pl.PinOwned, theirs)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
	if _, err := d.Teardown(ctx, a); err != nil {
		t.Fatal(err)
	}
	stillPins(t, theirs, pa.NetNS)

	// Teardown after a restart (a data plane that never saw the container)
	// goes by what the record says: not owned, not removed.
	pl, err = d.Setup(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	a.Pin, a.PinOwned = pl.Mount, pl.PinOwned
	d2, err := New(Config{HostNS: e.sb.Host.Path, NetNSDir: dir, Logger: quietLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.Teardown(ctx, a); err != nil {
		t.Fatal(err)
	}
	stillPins(t, theirs, pa.NetNS)
	if e.hasLink(plane.VethName(a.ID)) {
		t.Errorf("veth of %s left after teardown", a.ID)
	}

	// Another namespace pinned under the container's ID: ours goes beside.
	pb := e.spawn("B", []uint16{31001}, false)
	b := e.spec("B", pb, 5, "41984-43007", "31001", "")
	other := runtimePin(t, pa.NetNS, dir, b.ID)
	pl, err = d2.Setup(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Teardown(ctx, b); nspin.Unmount(dir, b.ID+nspin.Suffix) })
	if want := filepath.Join(dir, b.ID+nspin.Suffix); !pl.PinOwned || pl.Mount != want {
		t.Errorf("Setup with another namespace pinned at its path: mount %s owned %v, want %s owned", pl.Mount, pl.PinOwned, want)
	}
	stillPins(t, other, pa.NetNS)
	stillPins(t, pl.Mount, pb.NetNS)
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31001), "B")
	if _, err := d2.Teardown(ctx, b); err != nil {
		t.Fatal(err)
	}
	stillPins(t, other, pa.NetNS)
	if got, _ := nspin.NsMounts(dir); len(got) != 2 {
		t.Errorf("mounts in %s after teardown: %v, want only the runtime's two", dir, got)
	}
}
