package api_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/api"
	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/test/wait"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type statusServer struct {
	isolatordv1grpc.UnimplementedIsolatorServer
}

func (statusServer) Status(context.Context, *isolatordv1.StatusRequest) (*isolatordv1.StatusResponse, error) {
	return &isolatordv1.StatusResponse{Version: "test-1", HostInterface: "eth0"}, nil
}

// serve starts a gRPC server with the Isolator service on a unix socket at
// path and stops it when the test ends.
func serve(t *testing.T, path string) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	isolatordv1grpc.RegisterIsolatorServer(srv, statusServer{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
}

func TestDialCallsTheServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "isolatord.sock")
	serve(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := api.Dial(ctx, sock)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer conn.Close()
	c := conn
	st, err := c.Status(ctx, &isolatordv1.StatusRequest{})
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if st.GetVersion() != "test-1" || st.GetHostInterface() != "eth0" {
		t.Fatalf("Status = %v", st)
	}
	// An RPC the server does not implement comes back as a status, proving
	// the error path goes through the same connection.
	_, err = c.List(ctx, &isolatordv1.ListRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("List error = %v, want Unimplemented", err)
	}
}

func TestDialRelativePath(t *testing.T) {
	dir := t.TempDir()
	serve(t, filepath.Join(dir, "rel.sock"))
	t.Chdir(dir)
	conn, err := api.Dial(context.Background(), "rel.sock")
	if err != nil {
		t.Fatalf("api.Dial(relative): %v", err)
	}
	defer conn.Close()
	if _, err := conn.Status(context.Background(), &isolatordv1.StatusRequest{}); err != nil {
		t.Fatalf("Status over a relative path: %v", err)
	}
}

func TestDialMissingSocketFailsFast(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "missing.sock")
	// A long deadline: Dial must not wait for it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	conn, err := api.Dial(ctx, sock)
	if err == nil {
		conn.Close()
		t.Fatal("Dial of a missing socket succeeded")
	}
	if !errors.Is(err, syscall.ENOENT) {
		t.Errorf("error %v does not wrap ENOENT", err)
	}
	if !strings.Contains(err.Error(), sock) {
		t.Errorf("error %q does not name the socket %s", err, sock)
	}
	if strings.Count(err.Error(), sock) != 1 {
		t.Errorf("error %q repeats the socket path", err)
	}
	if ctx.Err() != nil {
		t.Errorf("Dial waited for the context deadline (%v) instead of failing fast", time.Since(start))
	}
}

func TestDialRefused(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "stale.sock")
	// A socket file nobody listens on, as a crashed daemon leaves behind.
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	lis.Close()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("stale socket file not left behind: %v", err)
	}
	conn, err := api.Dial(context.Background(), sock)
	if err == nil {
		conn.Close()
		t.Fatal("Dial of a stale socket succeeded")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v does not wrap ECONNREFUSED", err)
	}
}

// TestDialHonoursContext: a server that accepts but never speaks HTTP/2
// fails Dial at its context's deadline with an error that names the
// socket and wraps context.DeadlineExceeded.
func TestDialHonoursContext(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "mute.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	conn, err := api.Dial(ctx, sock)
	if err == nil {
		conn.Close()
		t.Fatal("Dial succeeded against a server that never answers")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), sock) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded and name %s", err, sock)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Dial ended %v after it started, past its 300ms deadline", d)
	}
}

// TestCallAfterDaemonRestart: a call on a connection whose daemon went
// away fails at once with UNAVAILABLE rather than waiting for a new
// daemon, and the client reaches the next daemon on the same socket.
func TestCallAfterDaemonRestart(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "restart.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	isolatordv1grpc.RegisterIsolatorServer(srv, statusServer{})
	go srv.Serve(lis)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := api.Dial(ctx, sock)
	if err != nil {
		srv.Stop()
		t.Fatal(err)
	}
	defer c.Close()
	srv.Stop()
	start := time.Now()
	if _, err := c.Status(ctx, &isolatordv1.StatusRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Status with the daemon gone: %v, want UNAVAILABLE", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the call waited %v for a daemon that is gone", d)
	}
	serve(t, sock)
	// grpc-go reconnects with backoff: the next daemon answers within a few
	// attempts.
	wait.For(t, 20*time.Second, "Status to succeed after the restart", func() bool {
		_, err := c.Status(ctx, &isolatordv1.StatusRequest{})
		return err == nil
	})
}

func TestDialEmptyPath(t *testing.T) {
	if _, err := api.Dial(context.Background(), ""); err == nil {
		t.Fatal("api.Dial(\"\") succeeded")
	}
}
