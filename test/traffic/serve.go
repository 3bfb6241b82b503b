// Package traffic is the small TCP/UDP/ICMP toolkit isolatord's tests use
// instead of nc, curl or ping: servers that say who answered, a client that
// can pick its source address and port, benchmark loops, an ICMP echo
// counter that notices duplicate replies, and a bulk stream with a meter on
// its receiving side for shaping tests (Stream).
//
// Protocol. A TCP connection to ServeTCP is in line mode unless its first byte
// is one of the benchmark mode bytes below: each newline-terminated request R
// is answered with "<name> R\n", so a client knows which server (container)
// answered. A UDP datagram R to ServeUDP is answered with "<name> R\n". The
// benchmark modes share the same port, so any `isotraffic serve` can be
// measured:
//
//	0x01 request/response: every byte received is echoed back (TCP); a UDP
//	     datagram of exactly that one byte is echoed back unchanged.
//	0x02 bulk: everything is read and discarded; after the client's FIN the
//	     server writes the byte count (8 bytes, big endian) and closes.
//	0x03 connect/request/response: the server writes one byte and closes
//	     first, so TIME_WAIT lands on the server, not on the client's
//	     (possibly small) ephemeral range.
//
// Everything here works in whichever network namespace the calling thread is
// in when the socket is opened (see sandbox.NS.Do), and the isotraffic binary
// (test/cmd/isotraffic) exposes it on the command line for processes started
// in container namespaces.
package traffic

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Benchmark mode bytes (first byte of a TCP connection, see package doc).
const (
	ModeRR   byte = 0x01
	ModeBulk byte = 0x02
	ModeCRR  byte = 0x03
)

// maxLine bounds a line-mode request.
const maxLine = 64 << 10

// ServeOption configures ServeTCP and ServeUDP.
type ServeOption func(*serveOptions)

type serveOptions struct {
	reusePort bool
}

// WithReusePort sets SO_REUSEPORT on the listening socket, so several
// servers (e.g. in containers sharing a static port) can bind the same port.
func WithReusePort() ServeOption { return func(o *serveOptions) { o.reusePort = true } }

func listenConfig(opts []ServeOption) net.ListenConfig {
	var o serveOptions
	for _, f := range opts {
		f(&o)
	}
	return net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			if serr == nil && o.reusePort {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
}

// Server is a running TCP or UDP server. Close stops it, closes its open
// connections and waits for its goroutines.
type Server struct {
	Name string
	addr net.Addr

	closeOnce sync.Once
	closeFn   func() error
	closeErr  error
	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// Addr is the address the server listens on (with the real port if ":0" was asked).
func (s *Server) Addr() net.Addr { return s.addr }

// Close stops the server; it is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.closeFn()
		s.mu.Lock()
		s.closed = true
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s.closeErr
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// ServeTCP listens on addr ("ip:port", port 0 for any) and answers each
// newline-terminated request R with "<name> R\n" (plus the benchmark modes).
// It runs until ctx is done or Close is called.
func ServeTCP(ctx context.Context, addr, name string, opts ...ServeOption) (*Server, error) {
	lc := listenConfig(opts)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{Name: name, addr: ln.Addr(), closeFn: ln.Close, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// Transient (e.g. EMFILE): back off briefly.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if !s.track(c) {
				c.Close()
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer s.untrack(c)
				defer c.Close()
				serveTCPConn(c, name)
			}()
		}
	}()
	stopOnDone(ctx, s)
	return s, nil
}

// ServeBulk serves the benchmark modes (and line mode, answering as "sink")
// on addr: the peer of RequestResponse, ConnectRate and Bulk.
func ServeBulk(ctx context.Context, addr string, opts ...ServeOption) (*Server, error) {
	return ServeTCP(ctx, addr, "sink", opts...)
}

func stopOnDone(ctx context.Context, s *Server) {
	if ctx.Done() == nil {
		return
	}
	go func() {
		<-ctx.Done()
		s.Close()
	}()
}

func serveTCPConn(c net.Conn, name string) {
	r := bufio.NewReader(c)
	first, err := r.Peek(1)
	if err != nil {
		return
	}
	switch first[0] {
	case ModeRR:
		r.Discard(1)
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	case ModeBulk:
		r.Discard(1)
		n, err := io.Copy(io.Discard, r)
		if err != nil {
			return
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(n))
		c.Write(b[:])
	case ModeCRR:
		c.Write([]byte{1})
	default:
		w := bufio.NewWriter(c)
		for {
			line, err := readLine(r)
			if line != "" || err == nil {
				w.WriteString(name + " " + line + "\n")
				if ferr := w.Flush(); ferr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
}

// readLine reads one request line without its "\n" or "\r\n", at most maxLine bytes.
func readLine(r *bufio.Reader) (string, error) {
	var sb strings.Builder
	for sb.Len() < maxLine {
		frag, err := r.ReadSlice('\n')
		sb.Write(frag)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return strings.TrimRight(sb.String(), "\r\n"), err
		}
		return strings.TrimRight(sb.String(), "\r\n"), nil
	}
	return sb.String(), errors.New("request line too long")
}

// ServeUDP listens on addr and answers each datagram R with "<name> R\n" (a
// datagram beginning with the byte ModeRR is answered with that one byte). It runs until ctx
// is done or Close is called.
func ServeUDP(ctx context.Context, addr, name string, opts ...ServeOption) (*Server, error) {
	lc := listenConfig(opts)
	pc, err := lc.ListenPacket(ctx, "udp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{Name: name, addr: pc.LocalAddr(), closeFn: pc.Close, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			if n >= 1 && buf[0] == ModeRR { // (FragRequestResponse: a large request, a 1-byte reply)
				pc.WriteTo(buf[:1], from)
				continue
			}
			req := strings.TrimRight(string(buf[:n]), "\r\n")
			pc.WriteTo([]byte(name+" "+req+"\n"), from)
		}
	}()
	stopOnDone(ctx, s)
	return s, nil
}
