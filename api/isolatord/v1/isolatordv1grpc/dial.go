package isolatordv1grpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isolatord/isolatord/api"
)

// Dial connects grpc-go to isolatord's unix socket at socketPath (a relative path is
// made absolute) and returns a connection that is ready for calls.
//
// Dial fails fast: when nothing listens on the socket (no such file,
// connection refused, permission denied) it returns at the first failed
// attempt with an error that names the socket and wraps the system error, so
// errors.Is(err, syscall.ENOENT) works. Otherwise it waits for the connection
// until ctx ends, or at most api.DefaultDialTimeout when ctx has no deadline.
// Once Dial has returned, the connection reconnects by itself (with backoff)
// if the daemon restarts: for long-lived clients and streaming; a
// short-lived client starts faster with api.Dial. The caller closes the
// connection.
func Dial(ctx context.Context, socketPath string) (*grpc.ClientConn, error) {
	abs, err := api.AbsSocket(socketPath)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, api.DefaultDialTimeout)
		defer cancel()
	}

	// Dial the socket ourselves to keep the last system error: gRPC's
	// connectivity states do not carry it.
	var (
		mu      sync.Mutex
		lastErr error
	)
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", abs)
		if err != nil {
			mu.Lock()
			lastErr = err
			mu.Unlock()
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
			MinConnectTimeout: api.DefaultDialTimeout,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("isolatord at %s: %w", abs, err)
	}
	conn.Connect()
	for {
		st := conn.GetState()
		switch st {
		case connectivity.Ready:
			return conn, nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			mu.Lock()
			cause := lastErr
			mu.Unlock()
			conn.Close()
			if cause == nil {
				cause = errors.New("connection failed")
			}
			return nil, api.ConnectError(abs, cause)
		}
		if !conn.WaitForStateChange(ctx, st) {
			conn.Close()
			return nil, fmt.Errorf("cannot connect to isolatord at %s: %w", abs, ctx.Err())
		}
	}
}
