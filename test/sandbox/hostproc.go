package sandbox

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// HostProcess is a program running in the sandbox's host namespace (a
// "host service"), e.g. an isotraffic server holding a port there.
type HostProcess struct {
	Pid int
	c   *Container // reuses Container's output capture, wait and stop
}

// StartHostProcess starts argv in the host namespace (nsenter --net; nsenter
// execs it, so Pid is the program's own), waits until its output contains
// ready (skip with ""), and kills it by pid at the end of the test.
func (s *Sandbox) StartHostProcess(t testing.TB, ready string, argv ...string) *HostProcess {
	t.Helper()
	cmd := s.Host.Command(argv[0], argv[1:]...)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v in the host namespace: %v", argv, err)
	}
	c := &Container{Name: "host:" + argv[0], Pid: cmd.Process.Pid, Cmd: cmd, out: out, nsFd: -1, done: make(chan struct{})}
	go func() { c.waitErr = cmd.Wait(); close(c.done) }()
	p := &HostProcess{Pid: c.Pid, c: c}
	t.Cleanup(func() { _ = p.Stop() })
	if ready != "" {
		c.WaitFor(t, ready, 10*time.Second)
	}
	return p
}

// Output is what the process printed so far.
func (p *HostProcess) Output() string { return p.c.Output() }

// Stop kills the process (SIGKILL, by pid) and reaps it; idempotent.
func (p *HostProcess) Stop() error {
	err := p.c.Stop()
	if errors.Is(err, os.ErrProcessDone) || errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// Bind opens a socket in n bound to addr ("tcp": listening too; "udp":
// bound), with the given SOL_SOCKET options set to 1 (unix.SO_REUSEADDR,
// unix.SO_REUSEPORT), closes it and returns the error: what a host
// process's bind of that address would get.
func (n NS) Bind(network, addr string, sockopts ...int) error {
	return n.Do(func() error {
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				for _, o := range sockopts {
					if serr == nil {
						serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o, 1)
					}
				}
			})
			return errors.Join(err, serr)
		}}
		if strings.HasPrefix(network, "tcp") {
			l, err := lc.Listen(context.Background(), network, addr)
			if err == nil {
				l.Close()
			}
			return err
		}
		c, err := lc.ListenPacket(context.Background(), network, addr)
		if err == nil {
			c.Close()
		}
		return err
	})
}
