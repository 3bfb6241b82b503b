package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/isolatord/isolatord/api"
	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/isolatortest"
	"github.com/isolatord/isolatord/metrics"
)

// startServer runs the real gRPC server over the lifecycle with a fake data
// plane on a unix socket, and returns a real client.
func startServer(t *testing.T, uids []uint32) (pbgrpc.IsolatorClient, *isolatortest.DataPlane, *grpcConn) {
	return startServerWith(t, uids, isolatortest.New())
}

func startServerWith(t testing.TB, uids []uint32, dp *isolatortest.DataPlane) (pbgrpc.IsolatorClient, *isolatortest.DataPlane, *grpcConn) {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	iso, err := isolator.New(isolator.Config{
		ManagedPorts:  ephemeral.MustParseSet("31000-31999"),
		EphemeralPool: ephemeral.MustParseSet("32768-33791"),
		BlockSize:     256,
		StateDir:      filepath.Join(dir, "state"),
		Version:       "test",
		Logger:        log,
	}, dp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iso.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "run", "isolatord.sock")
	lis, err := listenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	gs, _ := newGRPCServer(iso, newUIDSet(uids), log, metrics.New("test"), nil)
	go gs.Serve(lis)
	conn, err := api.Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		iso.Close()
	})
	return conn, dp, &grpcConn{sock: sock, health: healthpb.NewHealthClient(conn.Conn())}
}

type grpcConn struct {
	sock   string
	health healthpb.HealthClient
}

func pr(b, e uint32, shared bool) *pb.PortRange {
	return &pb.PortRange{Begin: b, End: e, Shared: shared}
}

func TestSocketModeAndHealth(t *testing.T) {
	_, _, gc := startServer(t, []uint32{uint32(os.Getuid())})
	fi, err := os.Stat(gc.sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v, want 0660", fi.Mode().Perm())
	}
	di, _ := os.Stat(filepath.Dir(gc.sock))
	if di.Mode().Perm() != 0o750 {
		t.Fatalf("socket dir mode %v, want 0750", di.Mode().Perm())
	}
	resp, err := gc.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: pbgrpc.Isolator_ServiceDesc.ServiceName})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", resp, err)
	}
	// A second daemon on the same socket is refused.
	if _, err := listenUnix(gc.sock); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
}

func TestPermissionDenied(t *testing.T) {
	c, _, _ := startServer(t, []uint32{uint32(os.Getuid()) + 4242})
	_, err := c.List(context.Background(), &pb.ListRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "uid") {
		t.Fatalf("got %v, want PermissionDenied naming the uid", err)
	}
}

// TestBadRequests sends malformed and conflicting requests through a real
// gRPC client: each gets its specific code and a message naming the field or
// holder, and none changes the daemon's state.
func TestBadRequests(t *testing.T) {
	c, _, _ := startServer(t, []uint32{uint32(os.Getuid())})
	ctx := context.Background()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "held", Ports: []*pb.PortRange{pr(31500, 31500, false)}}))
	must(c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "sharer", Ports: []*pb.PortRange{pr(31600, 31600, true)}}))
	must(c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "live"}))
	must(c.Isolate(ctx, &pb.IsolateRequest{ContainerId: "live", Target: &pb.IsolateRequest_Pid{Pid: int32(os.Getpid())}}))
	must(c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "other"}))

	long := strings.Repeat("a", 129)
	pid := func(id string, p int32) *pb.IsolateRequest {
		return &pb.IsolateRequest{ContainerId: id, Target: &pb.IsolateRequest_Pid{Pid: p}}
	}
	path := func(id, p string) *pb.IsolateRequest {
		return &pb.IsolateRequest{ContainerId: id, Target: &pb.IsolateRequest_NetnsPath{NetnsPath: p}}
	}
	prep := func(id string, ps ...*pb.PortRange) func() error {
		return func() error { _, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: id, Ports: ps}); return err }
	}
	iso := func(r *pb.IsolateRequest) func() error {
		return func() error { _, err := c.Isolate(ctx, r); return err }
	}
	upd := func(id string, ps ...*pb.PortRange) func() error {
		return func() error { _, err := c.Update(ctx, &pb.UpdateRequest{ContainerId: id, Ports: ps}); return err }
	}
	cases := []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"prepare empty id", prep(""), codes.InvalidArgument, "container_id"},
		{"prepare id with slash", prep("a/b"), codes.InvalidArgument, "container_id"},
		{"prepare id dot-dot", prep(".."), codes.InvalidArgument, "container_id"},
		{"prepare id too long", prep(long), codes.InvalidArgument, "container_id"},
		{"prepare id with space", prep("a b"), codes.InvalidArgument, "container_id"},
		{"prepare port 0", prep("x", pr(0, 10, false)), codes.InvalidArgument, "ports[0].begin"},
		{"prepare end 0", prep("x", pr(31000, 0, false)), codes.InvalidArgument, "ports[0].end"},
		{"prepare begin > 65535", prep("x", pr(70000, 70001, false)), codes.InvalidArgument, "ports[0].begin"},
		{"prepare end > 65535", prep("x", pr(31000, 65536, false)), codes.InvalidArgument, "ports[0].end"},
		{"prepare reversed", prep("x", pr(31010, 31000, false)), codes.InvalidArgument, "reversed"},
		{"prepare second range bad", prep("x", pr(31000, 31000, false), pr(5, 1, false)), codes.InvalidArgument, "ports[1]"},
		{"prepare unmanaged port", prep("x", pr(40000, 40000, false)), codes.InvalidArgument, "40000"},
		{"prepare ephemeral pool port", prep("x", pr(32800, 32800, false)), codes.InvalidArgument, "32800"},
		{"prepare well-known port", prep("x", pr(80, 80, false)), codes.InvalidArgument, "80"},
		{"prepare held exclusive", prep("x", pr(31500, 31500, false)), codes.FailedPrecondition, "held"},
		{"prepare shared on exclusive", prep("x", pr(31500, 31500, true)), codes.FailedPrecondition, "held"},
		{"prepare exclusive on shared", prep("x", pr(31600, 31600, false)), codes.FailedPrecondition, "sharer"},
		{"prepare both shared and exclusive", prep("x", pr(31700, 31700, false), pr(31700, 31700, true)), codes.InvalidArgument, "both shared and exclusive"},
		{"prepare repeat with other ports", prep("held", pr(31501, 31501, false)), codes.AlreadyExists, "held"},
		{"isolate no target", iso(&pb.IsolateRequest{ContainerId: "held"}), codes.InvalidArgument, "target"},
		{"isolate pid 0", iso(pid("held", 0)), codes.InvalidArgument, "pid"},
		{"isolate pid negative", iso(pid("held", -1)), codes.InvalidArgument, "pid"},
		{"isolate empty netns path", iso(path("held", "")), codes.InvalidArgument, "netns_path"},
		{"isolate missing pid", iso(pid("held", 1<<30)), codes.NotFound, "pid"},
		{"isolate missing netns path", iso(path("held", "/nonexistent/netns")), codes.NotFound, "netns_path"},
		{"isolate path not a namespace", iso(path("held", "/etc/hostname")), codes.NotFound, "not a network namespace"},
		{"isolate before prepare", iso(pid("unknown", int32(os.Getpid()))), codes.FailedPrecondition, "not prepared"},
		{"isolate bad id", iso(pid("a/b", int32(os.Getpid()))), codes.InvalidArgument, "container_id"},
		{"isolate again elsewhere", iso(pid("live", int32(os.Getppid()))), codes.AlreadyExists, "already isolated"},
		{"isolate into a namespace already used", iso(pid("other", int32(os.Getpid()))), codes.FailedPrecondition, "already holds container live"},
		{"update unknown", upd("unknown"), codes.NotFound, "unknown"},
		{"update to held port", upd("live", pr(31500, 31500, false)), codes.FailedPrecondition, "held"},
		{"update bad range", upd("live", pr(31000, 70000, false)), codes.InvalidArgument, "ports[0].end"},
		{"usage unknown", func() error { _, err := c.Usage(ctx, &pb.UsageRequest{ContainerId: "unknown"}); return err }, codes.NotFound, "unknown"},
		{"get unknown", func() error { _, err := c.Get(ctx, &pb.GetRequest{ContainerId: "unknown"}); return err }, codes.NotFound, "unknown"},
		{"get bad id", func() error { _, err := c.Get(ctx, &pb.GetRequest{ContainerId: "../x"}); return err }, codes.InvalidArgument, "container_id"},
		{"cleanup bad id", func() error { _, err := c.Cleanup(ctx, &pb.CleanupRequest{ContainerId: ""}); return err }, codes.InvalidArgument, "container_id"},
	}
	snapshot := func() *pb.ListResponse {
		l, err := c.List(ctx, &pb.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	before := snapshot()
	st0, _ := c.Status(ctx, &pb.StatusRequest{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			st, _ := status.FromError(err)
			if st.Code() != tc.code {
				t.Fatalf("code %v (%v), want %v", st.Code(), err, tc.code)
			}
			if !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("message %q does not mention %q", st.Message(), tc.msg)
			}
			if after := snapshot(); !proto.Equal(before, after) {
				t.Fatalf("state changed:\nbefore %v\nafter  %v", before, after)
			}
			st1, _ := c.Status(ctx, &pb.StatusRequest{})
			if st1.EphemeralBlocksUsed != st0.EphemeralBlocksUsed || st1.StaticPortsExclusive != st0.StaticPortsExclusive || st1.StaticPortsShared != st0.StaticPortsShared {
				t.Fatalf("holdings changed: %v -> %v", st0, st1)
			}
		})
	}
	if len(cases) < 25 {
		t.Fatalf("only %d bad requests", len(cases))
	}
}

func TestIsolateIntoHostNamespace(t *testing.T) {
	dp := isolatortest.New()
	ino, err := nsInodeForTest("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	dp.HostIno = ino // the fake data plane's host namespace is ours
	c, _, _ := startServerWith(t, []uint32{uint32(os.Getuid())}, dp)
	ctx := context.Background()
	if _, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "h"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Isolate(ctx, &pb.IsolateRequest{ContainerId: "h", Target: &pb.IsolateRequest_Pid{Pid: int32(os.Getpid())}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "host's own network namespace") {
		t.Fatalf("got %v", err)
	}
	g, _ := c.Get(ctx, &pb.GetRequest{ContainerId: "h"})
	if g.GetContainer().GetState() != pb.ContainerState_CONTAINER_STATE_PREPARED {
		t.Fatalf("state changed: %v", g)
	}
}

func TestExhaustedAndIdempotent(t *testing.T) {
	c, _, _ := startServer(t, []uint32{uint32(os.Getuid())})
	ctx := context.Background()
	var first *pb.Container
	for i, id := range []string{"a", "b", "c", "d"} {
		r, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = r.Container
		}
	}
	_, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "e"})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v, want ResourceExhausted", err)
	}
	again, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "a"})
	if err != nil || !proto.Equal(again.Container, first) {
		t.Fatalf("repeat prepare: %v %v", again, err)
	}
	if _, err := c.Cleanup(ctx, &pb.CleanupRequest{ContainerId: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cleanup(ctx, &pb.CleanupRequest{ContainerId: "a"}); err != nil {
		t.Fatalf("second cleanup: %v", err)
	}
	if _, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "e"}); err != nil {
		t.Fatalf("block not reusable after cleanup: %v", err)
	}
}

func nsInodeForTest(p string) (uint64, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return 0, err
	}
	return fi.Sys().(*syscall.Stat_t).Ino, nil
}
