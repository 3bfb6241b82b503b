package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Container is a process running in its own, fresh network namespace (only
// the network namespace is new: it shares the mount namespace, filesystem and
// pid namespace with the test). Nothing links the namespace to anything until
// the data plane (or LinkContainerToClient) plumbs it; its lo is down.
type Container struct {
	Name  string    // label given to StartContainer
	Pid   int       // pid of the process (also the namespace's holder)
	NetNS string    // /proc/<Pid>/ns/net
	Cmd   *exec.Cmd // the running command

	out      *lockedBuffer
	nsMu     sync.Mutex
	nsFd     netns.NsHandle // keeps the namespace open while the container lives; -1 after Stop
	done     chan struct{}  // closed once the process is reaped
	waitErr  error          // set before done is closed
	stopOnce sync.Once
	stopErr  error
}

// HolderArgv is what a container runs when StartContainer gets no argv: a
// process that only holds the namespace; run programs in it with Command.
var HolderArgv = []string{"sleep", "infinity"}

// StartContainer starts argv in a fresh network namespace and returns once
// the process runs (it is in its namespace by then; use WaitFor to wait until
// the program says it is ready). The container is killed by pid and reaped
// on cleanup (and on Sandbox.Close); its stdout and stderr go into the test
// log if the test failed.
func (s *Sandbox) StartContainer(t testing.TB, name string, argv ...string) *Container {
	t.Helper()
	c, err := s.Spawn(name, argv...)
	if err != nil {
		t.Fatalf("start container %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop container %s: %v", name, err)
		}
		if t.Failed() {
			t.Logf("container %s (pid %d, %s) output:\n%s", c.Name, c.Pid, strings.Join(argv, " "), c.Output())
		}
	})
	return c
}

// Spawn is StartContainer without a testing.T: the container is stopped by
// Stop or Sandbox.Close.
func (s *Sandbox) Spawn(name string, argv ...string) (*Container, error) {
	if len(argv) == 0 {
		argv = HolderArgv
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, errors.New("sandbox closed")
	}
	c := &Container{Name: name, out: &lockedBuffer{}, done: make(chan struct{}), nsFd: -1}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = c.out
	cmd.Stderr = c.out
	cmd.WaitDelay = 2 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET,
		// If the test process dies (timeout panic, kill), so does the container.
		Pdeathsig: syscall.SIGKILL,
	}
	c.Cmd = cmd

	// Pdeathsig fires when the *thread* that forked dies, so fork from a
	// locked goroutine that keeps its thread until the child is reaped. It
	// opens the namespace before reaping: a process that already exited has
	// no namespace to open.
	type startResult struct {
		err   error
		nsFd  netns.NsHandle
		nsErr error
	}
	started := make(chan startResult, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- startResult{err: err}
			return
		}
		fd, err := netns.GetFromPath("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net")
		started <- startResult{nsFd: fd, nsErr: err}
		c.waitErr = cmd.Wait()
		close(c.done)
	}()
	r := <-started
	if r.err != nil {
		return nil, fmt.Errorf("start %q: %w", strings.Join(argv, " "), r.err)
	}
	c.Pid = cmd.Process.Pid
	c.NetNS = "/proc/" + strconv.Itoa(c.Pid) + "/ns/net"
	if r.nsErr != nil {
		// Only acceptable if the program already ended (its namespace went
		// with it); then Do and Netlink fail, Output and Exited still work.
		select {
		case <-c.done:
		case <-time.After(2 * time.Second):
			c.Stop()
			return nil, fmt.Errorf("open %s: %w", c.NetNS, r.nsErr)
		}
	} else {
		c.nsFd = r.nsFd
	}
	s.mu.Lock()
	s.containers = append(s.containers, c)
	s.mu.Unlock()
	return c, nil
}

// Do runs fn in the container's network namespace (see DoInNetNS).
func (c *Container) Do(fn func() error) error {
	fd, err := c.openNS()
	if err != nil {
		return err
	}
	defer fd.Close()
	return doInNetNSFd(int(fd), c.NetNS, fn)
}

// Netlink returns a netlink handle opened in the container's namespace.
func (c *Container) Netlink() (*netlink.Handle, error) {
	fd, err := c.openNS()
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	return netlinkAtFd(fd, c.NetNS)
}

// Command returns `nsenter --net=/proc/<Pid>/ns/net -- name args...`, to run
// another program in the container's network namespace (it fails once the
// container has exited).
func (c *Container) Command(name string, args ...string) *exec.Cmd {
	return nsenterCmd(c.NetNS, name, args...)
}

// Run runs name args... in the container's namespace, fails the test with the
// output on error and returns the combined output.
func (c *Container) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	return runCmd(t, c.Command(name, args...))
}

// openNS returns a new fd for the container's namespace, duplicated from the
// handle held since start, so it cannot be a recycled pid's namespace.
func (c *Container) openNS() (netns.NsHandle, error) {
	c.nsMu.Lock()
	defer c.nsMu.Unlock()
	if c.nsFd < 0 {
		return -1, fmt.Errorf("container %s (pid %d): network namespace gone (stopped or exited before it could be opened)", c.Name, c.Pid)
	}
	fd, err := unix.FcntlInt(uintptr(c.nsFd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("dup netns fd: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// SetSysctl sets a sysctl inside the container's namespace (see NS.SetSysctl).
func (c *Container) SetSysctl(key, value string) error {
	return c.Do(func() error { return writeSysctl(key, value) })
}

// Sysctl reads a sysctl inside the container's namespace.
func (c *Container) Sysctl(key string) (v string, err error) {
	err = c.Do(func() (err error) { v, err = readSysctl(key); return err })
	return v, err
}

// Output returns what the container printed so far (stdout and stderr).
func (c *Container) Output() string { return c.out.String() }

// Exited reports whether the process has ended.
func (c *Container) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// WaitOutput waits until the container's output contains substr, it exits, or
// timeout passes.
func (c *Container) WaitOutput(substr string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if strings.Contains(c.Output(), substr) {
			return nil
		}
		select {
		case <-c.done:
			if strings.Contains(c.Output(), substr) {
				return nil
			}
			return fmt.Errorf("container %s exited (%v) before printing %q; output:\n%s", c.Name, c.waitErr, substr, c.Output())
		case <-deadline.C:
			return fmt.Errorf("container %s did not print %q within %v; output:\n%s", c.Name, substr, timeout, c.Output())
		case <-tick.C:
		}
	}
}

// WaitFor is WaitOutput that fails the test (e.g. c.WaitFor(t, "ready", 10*time.Second)).
func (c *Container) WaitFor(t testing.TB, substr string, timeout time.Duration) {
	t.Helper()
	if err := c.WaitOutput(substr, timeout); err != nil {
		t.Fatal(err)
	}
}

// Stop kills the process by pid (SIGKILL), reaps it and releases the
// namespace handle. It is idempotent. The exit caused by the kill is not an
// error.
func (c *Container) Stop() error {
	c.stopOnce.Do(func() {
		if !c.Exited() {
			if err := c.Cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
				c.stopErr = fmt.Errorf("kill pid %d: %w", c.Pid, err)
			}
		}
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			c.stopErr = errors.Join(c.stopErr, fmt.Errorf("pid %d not reaped 10s after SIGKILL", c.Pid))
		}
		c.nsMu.Lock()
		if c.nsFd >= 0 {
			c.nsFd.Close()
			c.nsFd = -1
		}
		c.nsMu.Unlock()
	})
	return c.stopErr
}

// LinkContainerToClient is a test-only shortcut that wires a container
// straight to the client namespace, bypassing the data plane: a veth whose
// container end is eth0 (containerCIDR, default route via clientCIDR's
// address, lo up) and whose client end is "ct<pid>" (clientCIDR). Use a
// different 198.18.x.0/24 per container, e.g. "198.18.1.1/24", "198.18.1.2/24".
func (s *Sandbox) LinkContainerToClient(c *Container, clientCIDR, containerCIDR string) error {
	cIP, cNet, err := net.ParseCIDR(clientCIDR)
	if err != nil {
		return fmt.Errorf("clientCIDR: %w", err)
	}
	kIP, kNet, err := net.ParseCIDR(containerCIDR)
	if err != nil {
		return fmt.Errorf("containerCIDR: %w", err)
	}
	clientNL, err := s.Client.Netlink()
	if err != nil {
		return err
	}
	defer clientNL.Close()
	ctrNL, err := c.Netlink()
	if err != nil {
		return err
	}
	defer ctrNL.Close()

	ctrFd, err := c.openNS()
	if err != nil {
		return err
	}
	defer ctrFd.Close()
	name := "ct" + strconv.Itoa(c.Pid)
	if err := clientNL.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ctrFd)),
	}); err != nil {
		return fmt.Errorf("veth %s <-> container eth0: %w", name, err)
	}
	if err := configureLink(clientNL, name, &net.IPNet{IP: cIP.To4(), Mask: cNet.Mask}); err != nil {
		return err
	}
	if err := configureLink(ctrNL, "eth0", &net.IPNet{IP: kIP.To4(), Mask: kNet.Mask}); err != nil {
		return err
	}
	eth0, err := ctrNL.LinkByName("eth0")
	if err != nil {
		return err
	}
	return ctrNL.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: cIP.To4()})
}

// lockedBuffer is a bytes.Buffer safe for the copying goroutines of exec.Cmd.
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
