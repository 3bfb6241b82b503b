package traffic

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Flow is a TCP connection to a name server (ServeTCP, isotraffic serve)
// that stays open: a live flow the data plane must keep where it is.
type Flow struct {
	Src  int    // the client's source port
	Name string // the server that answered the first request
	c    net.Conn
	r    *bufio.Reader
}

// OpenFlow connects from local (SO_REUSEADDR) to addr in the namespace do
// runs its function in, and asks once to learn which server answers. It
// fails the test if either fails; the connection closes when the test
// ends.
func OpenFlow(t testing.TB, do func(func() error) error, local *net.TCPAddr, addr string) *Flow {
	t.Helper()
	var c net.Conn
	err := do(func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: local,
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) }); err != nil {
					return err
				}
				return serr
			}}
		c, err = d.Dial("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("connect from port %d: %v", local.Port, err)
	}
	t.Cleanup(func() { c.Close() })
	f := &Flow{Src: local.Port, c: c, r: bufio.NewReader(c)}
	if f.Name, err = f.Ask("hello"); err != nil {
		t.Fatalf("first request from port %d: %v", local.Port, err)
	}
	return f
}

// Ask sends msg and returns the name of the server that echoed it within
// 2 s.
func (f *Flow) Ask(msg string) (string, error) {
	f.c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := f.c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := f.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	name, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	if rest != msg {
		return "", fmt.Errorf("reply %q to %q", line, msg)
	}
	return name, nil
}

// Close ends the connection.
func (f *Flow) Close() error { return f.c.Close() }
