package nspin

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nshandle/nstest"
)

func TestBindMounts(t *testing.T) {
	nstest.NeedRoot(t)
	dir := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() {
		// Undo EnsureSharedDir's self-bind (and anything stacked) before
		// TempDir's cleanup removes the directory.
		for i := 0; i < 5; i++ {
			if unix.Unmount(dir, unix.MNT_DETACH) != nil {
				break
			}
		}
	})
	if err := EnsureSharedDir(dir); err != nil {
		t.Fatal(err)
	}
	topShared := func() (int, bool) {
		ms, err := ReadMountInfo()
		if err != nil {
			t.Fatal(err)
		}
		n, shared := 0, false
		for _, m := range ms {
			if m.MountPoint == dir {
				n++
				shared = m.Shared()
			}
		}
		return n, shared
	}
	if n, shared := topShared(); n != 1 || !shared {
		t.Fatalf("after EnsureSharedDir: %d mounts on %s, shared=%v", n, dir, shared)
	}
	if err := EnsureSharedDir(dir); err != nil {
		t.Fatal(err)
	}
	if n, _ := topShared(); n != 1 {
		t.Fatalf("EnsureSharedDir is not idempotent: %d mounts", n)
	}

	a, b := nstest.Scratch(t), nstest.Scratch(t)
	p, err := BindMount(a, dir, "ctr-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmount(dir, "ctr-a") })
	if p2, err := BindMount(a, dir, "ctr-a"); err != nil || p2 != p {
		t.Fatalf("re-mount of the same namespace: %v %v", p2, err)
	}
	if _, err := BindMount(b, dir, "ctr-a"); err == nil {
		t.Fatal("mounted another namespace over an existing pin")
	}
	for _, bad := range []string{"", ".", "..", "a/b"} {
		if _, err := BindMount(a, dir, bad); err == nil {
			t.Fatalf("name %q accepted", bad)
		}
	}
	pinned, err := nshandle.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	same := pinned.SameAs(a)
	pinned.Close()
	if !same {
		t.Fatal("the pin is another namespace")
	}
	// A plain file in the dir is not listed.
	os.WriteFile(filepath.Join(dir, "junk"), nil, 0o644)
	ms, err := NsMounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms["ctr-a"] != a.Ino() {
		t.Fatalf("NsMounts = %v, want ctr-a -> %d", ms, a.Ino())
	}
	// An empty stale file is reused.
	if _, err := BindMount(b, dir, "junk"); err != nil {
		t.Fatalf("reusing an empty file: %v", err)
	}
	t.Cleanup(func() { Unmount(dir, "junk") })

	mounted, existed, err := Unmount(dir, "ctr-a")
	if err != nil || !mounted || !existed {
		t.Fatalf("Unmount = %v %v %v", mounted, existed, err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("mount point still there: %v", err)
	}
	mounted, existed, err = Unmount(dir, "ctr-a")
	if err != nil || mounted || existed {
		t.Fatalf("second Unmount = %v %v %v", mounted, existed, err)
	}
	ms, _ = NsMounts(dir)
	if _, ok := ms["ctr-a"]; ok || len(ms) != 1 {
		t.Fatalf("NsMounts after unmount = %v", ms)
	}
	if ms, err := NsMounts(filepath.Join(dir, "nope")); err != nil || len(ms) != 0 {
		t.Fatalf("NsMounts of a missing dir = %v %v", ms, err)
	}
}
