package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
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
	start, err := procStartTicks(os.Getpid())
	if err != nil {
		return err
	}
	pidns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ownerFile), fmt.Appendf(nil, "%d %d %s\n", os.Getpid(), start, pidns), 0o600)
}

// procStartTicks is field 22 of /proc/pid/stat: when the process started.
func procStartTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22 is the 20th after the command
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
	var start uint64
	var pidns string
	if _, err := fmt.Sscanf(string(b), "%d %d %s", &pid, &start, &pidns); err != nil || pid <= 0 {
		return false
	}
	if ours, err := os.Readlink("/proc/self/ns/pid"); err != nil || ours != pidns {
		return false
	}
	now, err := procStartTicks(pid)
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
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cpuBusy is the machine's busy CPU time so far (user, nice, system, irq,
// softirq; not idle, iowait or steal), from /proc/stat.
func cpuBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var ticks uint64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system irq softirq
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / 100, nil // USER_HZ is 100 on Linux
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
