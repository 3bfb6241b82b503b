package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/test/sandbox"
)

// A run's temp dir holds its namespace files and its daemons' pins, all
// mounts: a run killed with SIGKILL (or a machine's session ending) cannot
// unmount them, and each keeps a network namespace alive. Hundreds of those
// slow every later run (every namespace and mount is walked by some kernel
// path, and every Go process reads /proc/self/mountinfo at start), so the
// next run removes them: only a dir whose owner file names a process that
// no longer runs.

// ownerFile names the run that made a temp dir: its pid, the process's
// start time (clock ticks since boot), so a reused pid is not taken for
// it, and its pid namespace, so a run whose pids this one cannot see is
// never taken for a dead one.
const ownerFile = "owner"

// writeOwner records this process as the owner of dir.
func writeOwner(dir string) error {
	start, err := sandbox.ProcessStart(os.Getpid())
	if err != nil {
		return err
	}
	pidns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ownerFile), fmt.Appendf(nil, "%d %s %s\n", os.Getpid(), start, pidns), 0o600)
}

// ownerGone reports whether dir's owner file names a process that no
// longer runs; a dir without one (or with one it cannot read) is never
// taken for a dead run's.
func ownerGone(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return false
	}
	var pid int
	var start, pidns string
	if _, err := fmt.Sscanf(string(b), "%d %s %s", &pid, &start, &pidns); err != nil || pid <= 0 {
		return false
	}
	if ours, err := os.Readlink("/proc/self/ns/pid"); err != nil || ours != pidns {
		return false
	}
	now, err := sandbox.ProcessStart(pid)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	return err == nil && now != start
}

// sweepStale removes the temp dirs under root (isobench-*) of runs that
// ended without cleaning up: each mount under one is detached, deepest
// first, and the dir removed. It returns the dirs removed and the mounts
// detached.
func sweepStale(root string) (dirs []string, mounts int, err error) {
	matches, err := filepath.Glob(filepath.Join(root, "isobench-*"))
	if err != nil {
		return nil, 0, err
	}
	var errs []error
	for _, d := range matches {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() || !ownerGone(d) {
			continue
		}
		under, err := mountsUnder(d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		failed := false
		for _, m := range under {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
				failed = true
				continue
			}
			mounts++
		}
		if failed {
			continue // never remove files under a mount still there
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
			continue
		}
		dirs = append(dirs, d)
	}
	return dirs, mounts, errors.Join(errs...)
}

// mountsUnder lists the mount points at or under dir in this mount
// namespace, deepest (longest) first.
func mountsUnder(dir string) ([]string, error) {
	all, err := nspin.ReadMountInfo()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range all {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out = append(out, m.MountPoint)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// cpuTicks is the machine's CPU time so far by kind, in USER_HZ ticks:
// the numbers of the first ("cpu") line of /proc/stat (user, nice,
// system, idle, iowait, irq, softirq, steal, ...).
func cpuTicks() ([]int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return nil, fmt.Errorf("unexpected /proc/stat: %q", line)
	}
	ticks := make([]int64, len(f)-1)
	for i, v := range f[1:] {
		if ticks[i], err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, fmt.Errorf("/proc/stat: %w", err)
		}
	}
	return ticks, nil
}

// cpuBusy is the machine's busy CPU time so far (user, nice, system, irq,
// softirq; not idle, iowait or steal).
func cpuBusy() (time.Duration, error) {
	t, err := cpuTicks()
	if err != nil {
		return 0, err
	}
	busy := t[0] + t[1] + t[2] + t[5] + t[6]
	return time.Duration(busy) * time.Second / userHZ, nil
}

// waitQuiet waits until the machine used less than busy CPUs over a whole
// window (the kernel done with what earlier phases left it: namespaces
// being freed, links being deleted), at most timeout. It returns how long
// it waited and whether the machine became quiet.
func waitQuiet(busy float64, window, timeout time.Duration) (time.Duration, bool, error) {
	t0 := time.Now()
	deadline := t0.Add(timeout)
	for {
		w0 := time.Now()
		b0, err := cpuBusy()
		if err != nil {
			return 0, false, err
		}
		time.Sleep(window) // the measurement window of a condition with a deadline
		b1, err := cpuBusy()
		if err != nil {
			return 0, false, err
		}
		if float64(b1-b0) < busy*float64(time.Since(w0)) {
			return time.Since(t0), true, nil
		}
		if time.Now().After(deadline) {
			return time.Since(t0), false, nil
		}
	}
}
