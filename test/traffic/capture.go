package traffic

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/test/wait"
)

// maxCaptured bounds the frames a Capture keeps (a flood test's capture
// stops growing there; the counts it asserts are far below).
const maxCaptured = 200000

// Capture collects the frames one AF_PACKET socket sees on one interface
// (every ethertype, both directions), from StartCapture until the test
// ends: the receiving side of FrameSender, for tests that assert what
// reached a device and what did not.
type Capture struct {
	// Name names the capture in failure messages ("client", "host lo").
	Name   string
	fd     int
	mu     sync.Mutex
	frames [][]byte
	out    []bool // per frame: the interface sent it (PACKET_OUTGOING)
}

// StartCapture opens a packet socket on ifname inside a namespace (do runs
// its function there, as sandbox namespaces' Do does; nil: the calling
// thread's namespace). The socket stays in that namespace; a goroutine
// reads it until the test ends. It fails the test if the socket cannot be
// opened.
func StartCapture(t testing.TB, do func(func() error) error, ifname, name string) *Capture {
	t.Helper()
	if do == nil {
		do = func(f func() error) error { return f() }
	}
	c := &Capture{Name: name, fd: -1}
	err := do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		c.fd = fd
		// Room for a burst the reader has not caught up with yet (best
		// effort: the default buffer holds about a hundred frames).
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			return err
		}
		// A read times out every 50 ms so the reader sees the test's end.
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50000})
	})
	if err != nil {
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
		t.Fatalf("capture on %s (%s): %v", ifname, name, err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 70000)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, from, err := unix.Recvfrom(c.fd, buf, 0)
			if err != nil || n <= 0 {
				continue
			}
			ll, _ := from.(*unix.SockaddrLinklayer)
			c.mu.Lock()
			if len(c.frames) < maxCaptured {
				c.frames = append(c.frames, bytes.Clone(buf[:n]))
				c.out = append(c.out, ll != nil && ll.Pkttype == unix.PACKET_OUTGOING)
			}
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(stop); <-done; unix.Close(c.fd) })
	return c
}

// Count is the number of frames seen so far that contain marker.
func (c *Capture) Count(marker []byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, f := range c.frames {
		if bytes.Contains(f, marker) {
			n++
		}
	}
	return n
}

// Outgoing is the frames seen so far that the interface sent
// (PACKET_OUTGOING: on a host-side veth, what went to the container), in
// order; the caller must not change them.
func (c *Capture) Outgoing() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [][]byte
	for i, f := range c.frames {
		if c.out[i] {
			out = append(out, f)
		}
	}
	return out
}

// WaitFor waits until a frame containing marker has been seen, at most
// within, and reports whether one was.
func (c *Capture) WaitFor(marker []byte, within time.Duration) bool {
	return wait.Until(within, func() bool { return c.Count(marker) > 0 })
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
