package isolatordv1grpc

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

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type statusServer struct {
	UnimplementedIsolatorServer
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
	RegisterIsolatorServer(srv, statusServer{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
}

func TestDialCallsTheServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "isolatord.sock")
	serve(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := Dial(ctx, sock)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer conn.Close()
	c := NewIsolatorClient(conn)
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
	conn, err := Dial(context.Background(), "rel.sock")
	if err != nil {
		t.Fatalf("Dial(relative): %v", err)
	}
	conn.Close()
}

func TestDialMissingSocketFailsFast(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "missing.sock")
	// A long deadline: Dial must not wait for it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	conn, err := Dial(ctx, sock)
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
	conn, err := Dial(context.Background(), sock)
	if err == nil {
		conn.Close()
		t.Fatal("Dial of a stale socket succeeded")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v does not wrap ECONNREFUSED", err)
	}
}

func TestDialHonoursContext(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "mute.sock")
	// Accepts connections but never speaks HTTP/2: the handshake cannot
	// finish, so only the context can end Dial.
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
	conn, err := Dial(ctx, sock)
	if err == nil {
		conn.Close()
		t.Fatal("Dial succeeded against a server that never answers")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
	}
}

func TestDialEmptyPath(t *testing.T) {
	if _, err := Dial(context.Background(), ""); err == nil {
		t.Fatal("Dial(\"\") succeeded")
	}
}
