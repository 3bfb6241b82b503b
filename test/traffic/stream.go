package traffic

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Stream is one bulk TCP connection sending as fast as its path allows
// until Stop, with a meter on the receiving side: what shaping tests read a
// rate from.
type Stream struct {
	n    atomic.Int64 // bytes the receiver read
	err  atomic.Value // the sender's error, if any
	once sync.Once
	stop func()
}

// StartStream listens on listen inside the namespace that to runs its
// function in, dials dialAddr from inside from's (a sandbox NS's or
// Container's Do), and starts sending. It fails the test if either end
// cannot be set up; the test's cleanup stops the stream.
func StartStream(t testing.TB, to, from func(func() error) error, listen, dialAddr string) *Stream {
	t.Helper()
	var ln net.Listener
	if err := to(func() (err error) {
		// A small receive buffer bounds how much a reader that falls
		// behind (busy cores) can catch up on inside a window, which would
		// inflate a measured rate.
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 256<<10)
			})
			return errors.Join(err, serr)
		}}
		ln, err = lc.Listen(context.Background(), "tcp", listen)
		return err
	}); err != nil {
		t.Fatalf("listen %s: %v", listen, err)
	}
	s := &Stream{}
	received := make(chan struct{})
	go func() {
		defer close(received)
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			s.n.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	var c net.Conn
	if err := from(func() (err error) {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err = d.Dial("tcp", dialAddr)
		return err
	}); err != nil {
		ln.Close()
		t.Fatalf("dial %s: %v", dialAddr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		buf := make([]byte, 64<<10)
		for ctx.Err() == nil {
			c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := c.Write(buf); err != nil && !os.IsTimeout(err) {
				s.err.Store(err)
				return
			}
		}
	}()
	s.stop = func() {
		cancel()
		<-sent
		c.Close()
		select {
		case <-received:
		case <-time.After(3 * time.Second):
		}
	}
	t.Cleanup(s.Stop)
	return s
}

// Received is the number of bytes the receiver has read so far.
func (s *Stream) Received() int64 { return s.n.Load() }

// Measure waits skip (a shaper's burst, TCP's start), then returns the
// receive rate over window in bytes/s. Both sleeps are the measurement
// itself: a rate is bytes over a span of time.
func (s *Stream) Measure(skip, window time.Duration) float64 {
	time.Sleep(skip)
	t0, n0 := time.Now(), s.n.Load()
	time.Sleep(window)
	return float64(s.n.Load()-n0) / time.Since(t0).Seconds()
}

// Err is the error that stopped the sender, nil while it runs.
func (s *Stream) Err() error {
	if e, ok := s.err.Load().(error); ok {
		return e
	}
	return nil
}

// Stop ends the stream and waits (at most 3 s) for the receiver to see the
// end; later calls do nothing.
func (s *Stream) Stop() { s.once.Do(s.stop) }
