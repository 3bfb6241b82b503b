// Package api is isolatord's client-facing protocol. The messages live in
// the generated package isolatordv1 (api/isolatord/v1, from isolator.proto)
// and the service's grpc-go stubs in isolatordv1grpc; this package adds what
// every client (isolatorctl, runtimes written in Go) needs to reach the
// daemon: the default socket path; Client, the Isolator service over a
// small HTTP/2 client (unarygrpc, through liteclient) that links neither
// grpc-go's transport nor net/http, so that short-lived clients start fast;
// and StateName, a container state as clients show it. The CNI plugin uses
// liteclient alone, which links no protobuf at all.
//
// The daemon listens on a unix socket only, so there is no TLS: access is
// controlled by the socket file's permissions.
package api

import (
	"context"
	"errors"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/api/liteclient"
	"github.com/isolatord/isolatord/api/unarygrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// DefaultSocket is where isolatord listens unless configured otherwise.
const DefaultSocket = liteclient.DefaultSocket

// DefaultDialTimeout bounds Dial, and the wait for the daemon's greeting,
// when Dial's context has no deadline.
const DefaultDialTimeout = liteclient.DefaultDialTimeout

// AbsSocket checks a socket path and makes it absolute.
func AbsSocket(socketPath string) (string, error) { return liteclient.AbsSocket(socketPath) }

// ConnectError is the error for a failed connection to the socket at abs:
// it names the socket and wraps cause without net.OpError's "dial unix
// PATH:" prefix, so errors.Is(err, syscall.ENOENT) works.
func ConnectError(abs string, cause error) error { return liteclient.ConnectError(abs, cause) }

// Client calls isolatord's Isolator service on one connection. Errors are
// gRPC statuses carrying the daemon's code and message
// (google.golang.org/grpc/status.FromError reads them), or the connection
// error Dial describes. Calls take no options: a deadline comes from the
// context.
type Client struct {
	lc *liteclient.Client
}

// Dial connects to isolatord's unix socket at socketPath (a relative path
// is made absolute) and returns a client, as liteclient.Dial does: it
// fails fast when nothing listens on the socket, with an error that names
// the socket and wraps the system error, and does not wait for the
// daemon's HTTP/2 greeting (the first call reads it with its reply; if it
// has not come by ctx's deadline, or DefaultDialTimeout, that call fails
// with the error Dial would have given, wrapping
// context.DeadlineExceeded). The connection does not reconnect: a client
// for a long-lived program dials again, or uses isolatordv1grpc.Dial. The
// caller closes the client.
func Dial(ctx context.Context, socketPath string) (*Client, error) {
	lc, err := liteclient.Dial(ctx, socketPath)
	if err != nil {
		return nil, err
	}
	return &Client{lc: lc}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.lc.Close() }

// invoke calls method with req and returns its reply.
func invoke[R any, PR interface {
	*R
	proto.Message
}](ctx context.Context, c *Client, method string, req proto.Message) (*R, error) {
	msg, err := proto.Marshal(req)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encoding the request: %v", err)
	}
	b, err := c.lc.Invoke(ctx, method, msg)
	if err != nil {
		var e *unarygrpc.Error
		if errors.As(err, &e) {
			return nil, status.Error(codes.Code(e.Code), e.Message)
		}
		return nil, err
	}
	reply := PR(new(R))
	if err := proto.Unmarshal(b, reply); err != nil {
		return nil, status.Errorf(codes.Internal, "decoding the reply: %v", err)
	}
	return reply, nil
}

// Prepare reserves a new container's ports.
func (c *Client) Prepare(ctx context.Context, r *pb.PrepareRequest) (*pb.PrepareResponse, error) {
	return invoke[pb.PrepareResponse](ctx, c, "Prepare", r)
}

// Isolate plumbs a prepared container's namespace.
func (c *Client) Isolate(ctx context.Context, r *pb.IsolateRequest) (*pb.IsolateResponse, error) {
	return invoke[pb.IsolateResponse](ctx, c, "Isolate", r)
}

// Attach is Prepare then Isolate in one call.
func (c *Client) Attach(ctx context.Context, r *pb.AttachRequest) (*pb.AttachResponse, error) {
	return invoke[pb.AttachResponse](ctx, c, "Attach", r)
}

// Update changes a container's static ports or limits.
func (c *Client) Update(ctx context.Context, r *pb.UpdateRequest) (*pb.UpdateResponse, error) {
	return invoke[pb.UpdateResponse](ctx, c, "Update", r)
}

// Usage reports a container's traffic.
func (c *Client) Usage(ctx context.Context, r *pb.UsageRequest) (*pb.UsageResponse, error) {
	return invoke[pb.UsageResponse](ctx, c, "Usage", r)
}

// Cleanup removes a container.
func (c *Client) Cleanup(ctx context.Context, r *pb.CleanupRequest) (*pb.CleanupResponse, error) {
	return invoke[pb.CleanupResponse](ctx, c, "Cleanup", r)
}

// Get returns one container.
func (c *Client) Get(ctx context.Context, r *pb.GetRequest) (*pb.GetResponse, error) {
	return invoke[pb.GetResponse](ctx, c, "Get", r)
}

// List returns every container.
func (c *Client) List(ctx context.Context, r *pb.ListRequest) (*pb.ListResponse, error) {
	return invoke[pb.ListResponse](ctx, c, "List", r)
}

// Status describes the daemon.
func (c *Client) Status(ctx context.Context, r *pb.StatusRequest) (*pb.StatusResponse, error) {
	return invoke[pb.StatusResponse](ctx, c, "Status", r)
}

// RemoveUnattributed removes kernel objects that belong to no container.
func (c *Client) RemoveUnattributed(ctx context.Context, r *pb.RemoveUnattributedRequest) (*pb.RemoveUnattributedResponse, error) {
	return invoke[pb.RemoveUnattributedResponse](ctx, c, "RemoveUnattributed", r)
}
