package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// daemon is an isolatord process whose host side is the sandbox's host
// namespace. It is started with `nsenter --net=<host ns>` (never `ip netns
// exec`, which would hide its bind mounts in a private mount namespace), so
// the namespace handles it mounts under /var/run/netns are visible to
// `ip netns exec`.
type daemon struct {
	bin    string   // path of isolatord
	hostNS string   // /run/netns/<sandbox>-host
	args   []string // isolatord's flags

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
		if strings.Contains(log.String(), servingMarker) {
			return time.Since(began), nil
		}
		select {
		case <-done:
			return 0, fmt.Errorf("isolatord exited during start-up (%v); its log:\n%s", cmd.ProcessState, indent(tail(log.String(), 15), "    "))
		case <-deadline.C:
			return 0, fmt.Errorf("isolatord did not log %s within %v; its log:\n%s", servingMarker, timeout, indent(tail(log.String(), 15), "    "))
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
