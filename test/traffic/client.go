package traffic

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultTimeout bounds Echo when neither WithTimeout nor a context deadline
// says otherwise.
const DefaultTimeout = 5 * time.Second

// Option configures a client call (Echo).
type Option func(*clientOptions)

type clientOptions struct {
	source  string
	timeout time.Duration
}

// WithSource binds the client socket to the local address "ip:port" before
// connecting (port 0: any port; ip empty or 0.0.0.0: any address). The socket
// gets SO_REUSEADDR so the same source port can be reused right after a TCP
// connection from it closed. Used to check that a container cannot send
// from a port it does not own.
func WithSource(ipPort string) Option { return func(o *clientOptions) { o.source = ipPort } }

// WithTimeout bounds the whole call (connect, send and reply).
func WithTimeout(d time.Duration) Option { return func(o *clientOptions) { o.timeout = d } }

func dialer(network string, o clientOptions) (*net.Dialer, error) {
	d := &net.Dialer{}
	if o.source != "" {
		var err error
		switch network {
		case "tcp", "tcp4", "tcp6":
			d.LocalAddr, err = net.ResolveTCPAddr(network, o.source)
		case "udp", "udp4", "udp6":
			d.LocalAddr, err = net.ResolveUDPAddr(network, o.source)
		default:
			return nil, fmt.Errorf("unsupported network %q", network)
		}
		if err != nil {
			return nil, fmt.Errorf("source %q: %w", o.source, err)
		}
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	return d, nil
}

// Echo sends msg (one line) over network "tcp" or "udp" to addr and returns
// the reply without its trailing newline: "<server name> <msg>". It fails if
// no reply comes within the timeout (WithTimeout, the context's deadline, or
// DefaultTimeout).
func Echo(ctx context.Context, network, addr, msg string, opts ...Option) (string, error) {
	o := clientOptions{timeout: DefaultTimeout}
	for _, f := range opts {
		f(&o)
	}
	if strings.ContainsAny(msg, "\n") {
		return "", errors.New("msg must be a single line")
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	d, err := dialer(network, o)
	if err != nil {
		return "", err
	}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	switch network {
	case "udp", "udp4", "udp6":
		buf := make([]byte, 65536)
		n, err := c.Read(buf)
		if err != nil {
			return "", err
		}
		return strings.TrimRight(string(buf[:n]), "\r\n"), nil
	default:
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				return "", fmt.Errorf("connection closed before a reply: %w", err)
			}
			return "", err
		}
		return strings.TrimRight(line, "\r\n"), nil
	}
}

// ReplyName returns the server name in an Echo reply ("<name> <msg>").
func ReplyName(reply string) string {
	name, _, _ := strings.Cut(reply, " ")
	return name
}

// RequestResponse runs one-byte request/response round trips on a single
// connection ("tcp") or socket ("udp") to a ServeTCP/ServeUDP/ServeBulk
// server for dur and returns round trips per second. Over UDP a lost datagram
// costs a one-second wait; more than 10 losses is an error.
func RequestResponse(ctx context.Context, network, addr string, dur time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, dur+10*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	isUDP := strings.HasPrefix(network, "udp")
	if !isUDP {
		if _, err := c.Write([]byte{ModeRR}); err != nil {
			return 0, err
		}
	}
	b := []byte{ModeRR}
	in := make([]byte, 64)
	var n, lost int
	start := time.Now()
	end := start.Add(dur)
	for time.Now().Before(end) {
		if _, err := c.Write(b); err != nil {
			return 0, err
		}
		if isUDP {
			c.SetReadDeadline(time.Now().Add(time.Second))
		}
		if _, err := c.Read(in[:1]); err != nil {
			var ne net.Error
			if isUDP && errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
				if lost++; lost > 10 {
					return 0, fmt.Errorf("udp rr: %d datagrams lost: %w", lost, err)
				}
				continue
			}
			return 0, err
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// ConnectRate opens TCP connections to a ServeTCP/ServeBulk server for dur,
// each exchanging one byte (the server closes first), and returns
// connections per second. Any failed connection is an error.
func ConnectRate(ctx context.Context, addr string, dur time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, dur+10*time.Second)
	defer cancel()
	var d net.Dialer
	b := make([]byte, 1)
	var n int
	start := time.Now()
	end := start.Add(dur)
	for time.Now().Before(end) {
		if err := func() error {
			dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
			defer dcancel()
			c, err := d.DialContext(dctx, "tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := c.Write([]byte{ModeCRR}); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, b); err != nil {
				return err
			}
			// Wait for the server's FIN so it, not us, holds TIME_WAIT.
			c.Read(b)
			return nil
		}(); err != nil {
			return 0, fmt.Errorf("connection %d: %w", n+1, err)
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// Bulk streams data over one TCP connection to a ServeTCP/ServeBulk server
// for dur and returns the bytes per second the server counted.
func Bulk(ctx context.Context, addr string, dur time.Duration) (float64, error) {
	return bulk(ctx, addr, dur, -1)
}

// BulkBytes streams exactly n bytes and returns the bytes per second the
// server counted (bounded by the context, at most a minute).
func BulkBytes(ctx context.Context, addr string, n int64) (float64, error) {
	return bulk(ctx, addr, time.Minute, n)
}

func bulk(ctx context.Context, addr string, dur time.Duration, limit int64) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, dur+10*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	tc := c.(*net.TCPConn)
	if _, err := c.Write([]byte{ModeBulk}); err != nil {
		return 0, err
	}
	buf := make([]byte, 128<<10)
	var sent int64
	start := time.Now()
	end := start.Add(dur)
	for time.Now().Before(end) && (limit < 0 || sent < limit) {
		chunk := buf
		if limit >= 0 && limit-sent < int64(len(chunk)) {
			chunk = chunk[:limit-sent]
		}
		n, err := c.Write(chunk)
		sent += int64(n)
		if err != nil {
			return 0, err
		}
	}
	if err := tc.CloseWrite(); err != nil {
		return 0, err
	}
	var cnt [8]byte
	if _, err := io.ReadFull(c, cnt[:]); err != nil {
		return 0, fmt.Errorf("reading byte count: %w", err)
	}
	got := int64(binary.BigEndian.Uint64(cnt[:]))
	if got != sent {
		return 0, fmt.Errorf("server counted %d bytes, sent %d", got, sent)
	}
	return float64(got) / time.Since(start).Seconds(), nil
}
