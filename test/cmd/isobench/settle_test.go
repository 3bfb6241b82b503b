package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/test/sandbox"
)

// TestSweepStale: the temp dir of a run whose owner is gone is removed with
// the mounts under it; one whose owner runs, one without an owner file and
// one whose owner is in another pid namespace are kept.
func TestSweepStale(t *testing.T) {
	sandbox.RequireRoot(t)
	root := t.TempDir()

	// A dead owner: a process that has exited (its pid is gone).
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadPid := cmd.Process.Pid
	deadStart, err := sandbox.ProcessStart(deadPid)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	pidns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Fatal(err)
	}

	mk := func(name, owner string) string {
		d := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Join(d, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(d, ownerFile), []byte(owner), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	// bind mounts a file on a new file under d (a namespace pin's shape),
	// with a space in its name (mountinfo escapes it).
	bind := func(d, name string) string {
		p := filepath.Join(d, "ns", name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("/proc/self/ns/net", p, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind mount %s: %v", p, err)
		}
		t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
		return p
	}

	dead := mk("isobench-dead", fmt.Sprintf("%d %s %s\n", deadPid, deadStart, pidns))
	deadPins := []string{bind(dead, "c0000"), bind(dead, "c 0001")}
	live := mk("isobench-live", "")
	if err := writeOwner(live); err != nil {
		t.Fatal(err)
	}
	livePin := bind(live, "c0000")
	noOwner := mk("isobench-noowner", "")
	otherNS := mk("isobench-otherns", fmt.Sprintf("%d %s pid:[1]\n", deadPid, deadStart))
	reused := mk("isobench-reused", fmt.Sprintf("%d 1 %s\n", os.Getpid(), pidns)) // our pid, another start time
	notOurs := mk("other-tool", fmt.Sprintf("%d %s %s\n", deadPid, deadStart, pidns))

	dirs, mounts, err := sweepStale(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != 2 || mounts != 2 {
		t.Fatalf("swept %v (%d mounts), want %s and %s with 2 mounts", dirs, mounts, dead, reused)
	}
	for _, d := range []string{dead, reused} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", d, err)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range deadPins {
		if strings.Contains(string(mi), strings.ReplaceAll(p, " ", `\040`)+" ") {
			t.Errorf("mount %s still there", p)
		}
	}
	if !strings.Contains(string(mi), livePin+" ") {
		t.Errorf("the live run's mount %s was removed", livePin)
	}
	for _, d := range []string{live, noOwner, otherNS, notOurs} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s removed: %v", d, err)
		}
	}
}

// TestWaitQuiet: a machine the test keeps busy is not quiet, and the wait
// ends at its limit.
func TestWaitQuiet(t *testing.T) {
	var stop atomic.Bool
	done := make(chan struct{})
	go func() { // one CPU busy until told
		defer close(done)
		for !stop.Load() {
		}
	}()
	took, quiet, err := waitQuiet(0.5, 200*time.Millisecond, 600*time.Millisecond)
	stop.Store(true)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if quiet {
		t.Errorf("quiet with a CPU kept busy (after %v)", took)
	}
	if took < 600*time.Millisecond || took > 5*time.Second {
		t.Errorf("waited %v, want its limit of 600ms (and a window more at most)", took)
	}
}
