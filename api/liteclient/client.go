// Package liteclient is a client of isolatord's Isolator service for
// programs that start once per call, such as the CNI plugin: the few
// messages they need, encoded and decoded by hand in the protobuf wire
// format (wire.go; no protobuf package, whose initialisation would come
// before every call), over unarygrpc.
// It also holds what every client shares: the default socket, the dial
// timeout, and the errors for a socket nobody answers on. Package api's
// Client, which speaks the generated messages, is built on it.
package liteclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/isolatord/isolatord/api/unarygrpc"
)

// DefaultSocket is where isolatord listens unless configured otherwise.
const DefaultSocket = "/run/isolatord/isolatord.sock"

// DefaultDialTimeout bounds Dial, and the wait for the daemon's greeting,
// when Dial's context has no deadline.
const DefaultDialTimeout = 5 * time.Second

// servicePrefix starts the Isolator service's method paths.
const servicePrefix = "/isolatord.v1.Isolator/"

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

// Client calls isolatord's Isolator service on one connection. A call's
// error is an *unarygrpc.Error (the daemon's code and message), or, when
// the daemon never greeted the connection, the ConnectError Dial would
// have returned had it waited (it wraps the *unarygrpc.HandshakeError).
type Client struct {
	conn *unarygrpc.Conn
	// abs is the socket's path, for errors.
	abs string
}

// Dial connects to isolatord's unix socket at socketPath (a relative path
// is made absolute). When nothing listens on the socket (no such file,
// connection refused, permission denied) it fails at once with an error
// that names the socket and wraps the system error. It does not wait for
// the daemon's HTTP/2 greeting: the first call sends its request with the
// connection's preface and reads the greeting with the reply. If the
// greeting has not come when ctx's deadline passes (DefaultDialTimeout
// after Dial when ctx has none), that call fails with a ConnectError
// wrapping context.DeadlineExceeded. The caller closes the client.
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
	conn, err := unarygrpc.Dial(ctx, abs)
	if err != nil {
		return nil, ConnectError(abs, err)
	}
	return &Client{conn: conn, abs: abs}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Invoke calls the Isolator service's method (its name, such as "Get")
// with an encoded request and returns the encoded reply.
func (c *Client) Invoke(ctx context.Context, method string, req []byte) ([]byte, error) {
	b, err := c.conn.Invoke(ctx, servicePrefix+method, req)
	var he *unarygrpc.HandshakeError
	if errors.As(err, &he) {
		return nil, ConnectError(c.abs, err)
	}
	return b, err
}

// call invokes method and decodes its reply into reply.
func call[R any, PR interface {
	*R
	Unmarshal([]byte) error
}](ctx context.Context, c *Client, method string, req []byte) (*R, error) {
	b, err := c.Invoke(ctx, method, req)
	if err != nil {
		return nil, err
	}
	reply := PR(new(R))
	if err := reply.Unmarshal(b); err != nil {
		return nil, &unarygrpc.Error{Code: unarygrpc.Internal, Message: "decoding the reply: " + err.Error()}
	}
	return reply, nil
}

// Attach is Prepare then Isolate in one call. A request with a string
// that is not UTF-8 is refused (INVALID_ARGUMENT naming the field) and not
// sent; so are Cleanup's and Get's.
func (c *Client) Attach(ctx context.Context, r *AttachRequest) (*AttachResponse, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	return call[AttachResponse](ctx, c, "Attach", r.Marshal())
}

// Cleanup removes a container.
func (c *Client) Cleanup(ctx context.Context, r *CleanupRequest) (*CleanupResponse, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	return call[CleanupResponse](ctx, c, "Cleanup", r.Marshal())
}

// Get returns one container.
func (c *Client) Get(ctx context.Context, r *GetRequest) (*GetResponse, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	return call[GetResponse](ctx, c, "Get", r.Marshal())
}

// List returns every container (ListRequest has no fields).
func (c *Client) List(ctx context.Context) (*ListResponse, error) {
	return call[ListResponse](ctx, c, "List", nil)
}

// Status describes the daemon (StatusRequest has no fields).
func (c *Client) Status(ctx context.Context) (*StatusResponse, error) {
	return call[StatusResponse](ctx, c, "Status", nil)
}
