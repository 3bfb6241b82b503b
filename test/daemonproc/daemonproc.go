// Package daemonproc runs a long-lived program (isolatord) whose host side
// is a sandbox's host namespace, for the demo and benchmark programs: it is
// started with `nsenter --net=<host ns>` (never `ip netns exec`, which would
// give it a private mount namespace and hide its bind mounts), killed with
// the parent, and waited for until it logs that it serves.
package daemonproc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is an isolatord process whose host side is a sandbox's host
// namespace. It is started with `nsenter --net=<host ns>` (never `ip netns
// exec`, which would give it a private mount namespace and hide its bind
// mounts from us).
type Process struct {
	Bin    string   // path of isolatord
	HostNS string   // /run/netns/<sandbox>-host
	Args   []string // isolatord's flags
	Ready  string   // output that says it is ready; "" = ServingMarker

	mu   sync.Mutex
	log  *lockedBuffer
	cmd  *exec.Cmd
	done chan struct{} // closed once the current process is reaped
}

// ServingMarker is the log line isolatord prints once its socket accepts calls.
const ServingMarker = `"msg":"serving"`

// Start launches the daemon and waits (at most timeout) until it logs that it
// serves. It returns how long that took.
func (d *Process) Start(timeout time.Duration) (time.Duration, error) {
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
	cmd := exec.Command("nsenter", append([]string{"--net=" + d.HostNS, "--", d.Bin}, d.Args...)...)
	cmd.Stdout = d.log
	cmd.Stderr = d.log
	// If the demo dies, so does its daemon. Pdeathsig fires when the thread
	// that forked exits, so fork from a locked goroutine that outlives the
	// process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	done := make(chan struct{})
	d.cmd, d.done = cmd, done
	log := d.log
	marker := d.Ready
	if marker == "" {
		marker = ServingMarker
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
			return 0, fmt.Errorf("%s exited during start-up (%v); its output:\n%s", filepath.Base(d.Bin), cmd.ProcessState, Indent(Tail(log.String(), 15), "    "))
		case <-deadline.C:
			return 0, fmt.Errorf("%s did not print %s within %v; its output:\n%s", filepath.Base(d.Bin), marker, timeout, Indent(Tail(log.String(), 15), "    "))
		case <-tick.C:
		}
	}
}

// Pid is the daemon's process id (nsenter execs isolatord), 0 if not running.
func (d *Process) Pid() int {
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

// LastPid is the pid of the last process Start launched, even if it has
// exited since (0 if none was started): for checking that nothing is left.
func (d *Process) LastPid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.cmd.Process == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

// Stop sends sig to the daemon and waits up to 15 s for it to exit, then
// kills it. It is a no-op when the daemon is not running.
func (d *Process) Stop(sig syscall.Signal) error {
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

// Log is everything the current (or last) process printed.
func (d *Process) Log() string {
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

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Indent puts prefix in front of every line of s.
func Indent(s, prefix string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}
