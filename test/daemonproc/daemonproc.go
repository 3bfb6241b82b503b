// Package daemonproc runs a long-lived program (isolatord) whose host side
// is a sandbox's host namespace, for the end-to-end tests and the demo and
// benchmark programs: it is started with `nsenter --net=<host ns>` (never
// `ip netns exec`, which would give it a private mount namespace and hide
// its bind mounts), killed with the parent, and waited for until it logs
// that it serves. It has no tests of its own: every end-to-end test, the
// demo's and the benchmark's start and stop their daemons through it.
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
	// Wrap, when set, changes the command before each start (socket
	// activation runs the daemon under a launcher).
	Wrap func(cmd *exec.Cmd)

	mu      sync.Mutex
	log     *lockedBuffer
	cmd     *exec.Cmd
	done    chan struct{} // closed once the current process is reaped
	waitErr error         // cmd.Wait's result, set before done is closed
}

// ServingMarker is the log line isolatord prints once its socket accepts calls.
const ServingMarker = `"msg":"serving"`

// Start launches the daemon and waits (at most timeout) until it logs that it
// serves. It returns how long that took.
func (d *Process) Start(timeout time.Duration) (time.Duration, error) {
	began := time.Now()
	if err := d.Launch(); err != nil {
		return 0, err
	}
	d.mu.Lock()
	cmd, done, log := d.cmd, d.done, d.log
	marker := d.Ready
	if marker == "" {
		marker = ServingMarker
	}
	d.mu.Unlock()
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

// Launch starts the daemon without waiting for it to serve (Done says when
// it exits).
func (d *Process) Launch() error {
	d.mu.Lock()
	if d.done != nil {
		select {
		case <-d.done:
		default:
			d.mu.Unlock()
			return errors.New("isolatord is already running")
		}
	}
	d.mu.Unlock()
	log := &lockedBuffer{}
	cmd := exec.Command("nsenter", append([]string{"--net=" + d.HostNS, "--", d.Bin}, d.Args...)...)
	cmd.Stdout = log
	cmd.Stderr = log
	// If the caller dies, so does its daemon. Pdeathsig fires when the thread
	// that forked exits, so fork from a locked goroutine that outlives the
	// process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if d.Wrap != nil {
		d.Wrap(cmd) // unlocked: it may end the goroutine (t.Skip)
	}
	done := make(chan struct{})
	d.mu.Lock()
	d.log, d.cmd, d.done, d.waitErr = log, cmd, done, nil
	d.mu.Unlock()

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
		err := cmd.Wait()
		d.mu.Lock()
		d.waitErr = err
		d.mu.Unlock()
		close(done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start %s: %w", filepath.Base(d.Bin), err)
	}
	return nil
}

// Done is closed once the process Launch (or Start) last started has exited
// and been reaped; nil before the first start.
func (d *Process) Done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done
}

// ExitErr is the last process's exit status as exec reports it (nil: exit
// 0), once Done is closed.
func (d *Process) ExitErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waitErr
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
