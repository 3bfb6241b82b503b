package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// daemon is an isolatord process whose host side is a sandbox's host
// namespace. It is started with `nsenter --net=<host ns>` (never `ip netns
// exec`, which would give it a private mount namespace and hide its bind
// mounts from us).
type daemon struct {
	bin    string   // path of isolatord
	hostNS string   // /run/netns/<sandbox>-host
	args   []string // isolatord's flags
	ready  string   // output that says it is ready; "" = servingMarker

	mu   sync.Mutex
	log  *lockedBuffer
	cmd  *exec.Cmd
	done chan struct{} // closed once the current process is reaped
}

// servingMarker is the log line isolatord prints once its socket accepts calls.
const servingMarker = `"msg":"serving"`

// start launches the daemon and waits (at most timeout) until it logs that it
// serves. It returns how long that took.
func (d *daemon) start(timeout time.Duration) (time.Duration, error) {
	d.mu.Lock()
	if d.done != nil {
		select {
		case <-d.done:
		default:
			d.mu.Unlock()
			return 0, errors.New("isolatord is already running")
		}
	}
	d.log = &lockedBuffer{}
	cmd := exec.Command("nsenter", append([]string{"--net=" + d.hostNS, "--", d.bin}, d.args...)...)
	cmd.Stdout = d.log
	cmd.Stderr = d.log
	// If the demo dies, so does its daemon. Pdeathsig fires when the thread
	// that forked exits, so fork from a locked goroutine that outlives the
	// process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	done := make(chan struct{})
	d.cmd, d.done = cmd, done
	log := d.log
	marker := d.ready
	if marker == "" {
		marker = servingMarker
	}
	d.mu.Unlock()

	began := time.Now()
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(done)
			return
		}
		started <- nil
		cmd.Wait()
		close(done)
	}()
	if err := <-started; err != nil {
		return 0, fmt.Errorf("start isolatord: %w", err)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if strings.Contains(log.String(), marker) {
			return time.Since(began), nil
		}
		select {
		case <-done:
			return 0, fmt.Errorf("%s exited during start-up (%v); its output:\n%s", filepath.Base(d.bin), cmd.ProcessState, indent(tail(log.String(), 15), "    "))
		case <-deadline.C:
			return 0, fmt.Errorf("%s did not print %s within %v; its output:\n%s", filepath.Base(d.bin), marker, timeout, indent(tail(log.String(), 15), "    "))
		case <-tick.C:
		}
	}
}

// pid is the daemon's process id (nsenter execs isolatord), 0 if not running.
func (d *daemon) pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.cmd.Process == nil || d.done == nil {
		return 0
	}
	select {
	case <-d.done:
		return 0
	default:
		return d.cmd.Process.Pid
	}
}

// stop sends sig to the daemon and waits up to 15 s for it to exit, then
// kills it. It is a no-op when the daemon is not running.
func (d *daemon) stop(sig syscall.Signal) error {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	if cmd == nil || cmd.Process == nil || done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal isolatord (pid %d): %w", cmd.Process.Pid, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(15 * time.Second):
	}
	cmd.Process.Kill()
	select {
	case <-done:
		return fmt.Errorf("isolatord (pid %d) ignored %v for 15 s and was killed", cmd.Process.Pid, sig)
	case <-time.After(5 * time.Second):
		return fmt.Errorf("isolatord (pid %d) still running after SIGKILL", cmd.Process.Pid)
	}
}

// logText is everything the current (or last) process printed.
func (d *daemon) logText() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.log == nil {
		return ""
	}
	return d.log.String()
}

// lockedBuffer is a bytes.Buffer safe for exec's copying goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// indent puts prefix in front of every line of s.
func indent(s, prefix string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// rssBytes returns the daemon's resident set size (VmRSS) and its peak
// (VmHWM) from /proc/<pid>/status.
func (d *daemon) rssBytes() (rss, hwm int64, err error) {
	pid := d.pid()
	if pid == 0 {
		return 0, 0, errors.New("isolatord is not running")
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			hwm = v << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, hwm, nil
}

// logField returns field key of the last JSON log line whose msg is msg.
func (d *daemon) logField(msg, key string) (any, bool) {
	lines := strings.Split(d.logText(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], `"msg":"`+msg+`"`) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(lines[i]), &m) != nil {
			continue
		}
		v, ok := m[key]
		return v, ok
	}
	return nil, false
}

// cpuSeconds returns the CPU time (user + system) the daemon used so far,
// from /proc/<pid>/stat.
func (d *daemon) cpuSeconds() (float64, error) {
	pid := d.pid()
	if pid == 0 {
		return 0, errors.New("not running")
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short stat")
	}
	ut, err1 := strconv.ParseFloat(f[11], 64) // field 14: utime
	st, err2 := strconv.ParseFloat(f[12], 64) // field 15: stime
	if err1 != nil || err2 != nil {
		return 0, errors.New("malformed stat")
	}
	return (ut + st) / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100
