// Package api is isolatord's client-facing protocol. The messages live in
// the generated package isolatordv1 (api/isolatord/v1, from isolator.proto)
// and the service's grpc-go stubs in isolatordv1grpc; this package adds what
// every client (isolatorctl, the CNI plugin, runtimes written in Go) needs to
// reach the daemon: the default socket path, Dial (grpc-go on the unix
// socket, failing fast with an error that names the socket), and
// StateName, a container state as clients show it.
//
// The daemon listens on a unix socket only, so there is no TLS: access is
// controlled by the socket file's permissions.
package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
)

// DefaultSocket is where isolatord listens unless configured otherwise.
const DefaultSocket = "/run/isolatord/isolatord.sock"

// DefaultDialTimeout bounds Dial when its context has no deadline.
const DefaultDialTimeout = 5 * time.Second

// AbsSocket checks a socket path and makes it absolute.
func AbsSocket(socketPath string) (string, error) {
	if socketPath == "" {
		return "", errors.New("isolatord socket path is empty")
	}
	abs, err := filepath.Abs(socketPath)
	if err != nil {
		return "", fmt.Errorf("isolatord socket %q: %w", socketPath, err)
	}
	return abs, nil
}

// ConnectError is the error for a failed connection to the socket at abs:
// it names the socket and wraps cause without net.OpError's "dial unix
// PATH:" prefix, so errors.Is(err, syscall.ENOENT) works.
func ConnectError(abs string, cause error) error {
	var op *net.OpError
	if errors.As(cause, &op) && op.Err != nil {
		cause = op.Err
	}
	return fmt.Errorf("cannot connect to isolatord at %s: %w", abs, cause)
}

// Client calls isolatord's Isolator service: the generated grpc-go client
// on one connection. A call's error is a gRPC status carrying the daemon's
// code and message (status.FromError reads it).
type Client struct {
	isolatordv1grpc.IsolatorClient
	conn *grpc.ClientConn
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the client's grpc-go connection, for other services or
// streaming on the same socket.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Dial connects to isolatord's unix socket at socketPath (a relative path
// is made absolute) and returns a client that is ready for calls.
//
// Dial fails fast: it connects to the socket itself first, so that when
// nothing listens there (no such file, connection refused, permission
// denied) it returns at once with a ConnectError, which names the socket
// and wraps the system error (errors.Is(err, syscall.ENOENT) works).
// grpc-go then speaks HTTP/2 on that connection; Dial waits for the
// daemon's greeting until ctx ends (DefaultDialTimeout when ctx has no
// deadline) and then fails with a ConnectError wrapping ctx's error. Calls
// do not wait for a connection that is down (gRPC's WaitForReady is off):
// after a daemon restart, one fails with UNAVAILABLE, and grpc-go
// reconnects by itself for the next. The caller closes the client.
func Dial(ctx context.Context, socketPath string) (*Client, error) {
	abs, err := AbsSocket(socketPath)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultDialTimeout)
		defer cancel()
	}
	var d net.Dialer
	first, err := d.DialContext(ctx, "unix", abs)
	if err != nil {
		return nil, ConnectError(abs, err)
	}

	// grpc-go's first connection is the one made above; a reconnection
	// dials again. The last system error is kept: gRPC's connectivity
	// states do not carry it.
	var (
		mu      sync.Mutex
		lastErr error
	)
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if c := first; c != nil {
			first = nil
			return c, nil
		}
		c, err := d.DialContext(ctx, "unix", abs)
		if err != nil {
			lastErr = err
		}
		return c, err
	}
	conn, err := grpc.NewClient("unix://"+abs,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   2 * time.Second,
			},
			MinConnectTimeout: DefaultDialTimeout,
		}),
	)
	if err != nil {
		first.Close()
		return nil, ConnectError(abs, err)
	}
	fail := func(cause error) (*Client, error) {
		conn.Close()
		mu.Lock()
		if first != nil {
			first.Close()
			first = nil
		}
		mu.Unlock()
		return nil, ConnectError(abs, cause)
	}
	conn.Connect()
	for {
		st := conn.GetState()
		switch st {
		case connectivity.Ready:
			return &Client{IsolatorClient: isolatordv1grpc.NewIsolatorClient(conn), conn: conn}, nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			mu.Lock()
			cause := lastErr
			mu.Unlock()
			if cause == nil {
				cause = errors.New("the connection failed before isolatord answered")
			}
			return fail(cause)
		}
		if !conn.WaitForStateChange(ctx, st) {
			return fail(ctx.Err())
		}
	}
}
