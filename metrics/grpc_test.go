package metrics

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const checkMethod = "/grpc.health.v1.Health/Check"

// startHealth serves the gRPC health service on a unix socket in a temporary
// directory, with m's interceptor first in the chain and a second
// interceptor that refuses uid "666" the way the daemon's authorization does.
// The caller's "uid" comes from the x-test-uid metadata key (the daemon
// reads SO_PEERCRED instead).
func startHealth(t *testing.T, m *Metrics, uid func(context.Context) string) healthpb.HealthClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "grpc.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	deny := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if uid != nil && uid(ctx) == "666" {
			return nil, status.Error(codes.PermissionDenied, "uid 666 may not call isolatord")
		}
		return handler(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(m.UnaryServerInterceptor(uid), deny))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	hs.SetServingStatus("isolatord.v1.Isolator", healthpb.HealthCheckResponse_SERVING)
	m.InitRPC(srv, "0", "1000")
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func testUID(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-test-uid"); len(v) > 0 {
		return v[0]
	}
	return ""
}

func TestRPCInterceptor(t *testing.T) {
	m := New("test")
	client := startHealth(t, m, testUID)

	// Before any call: InitRPC created every method × code × allowed uid.
	f := scrape(t, m.Handler())
	for _, u := range []string{"0", "1000"} {
		for _, c := range allCodes() {
			if v := f.value(t, "isolatord_rpc_requests_total", "method", checkMethod, "code", c.String(), "peer_uid", u); v != 0 {
				t.Errorf("rpc %s/%s/%s = %v before any call", checkMethod, c, u, v)
			}
		}
	}
	if h := f.histogram(t, "isolatord_rpc_duration_seconds", "method", checkMethod); h.GetSampleCount() != 0 {
		t.Errorf("rpc histogram count = %d before any call", h.GetSampleCount())
	}
	// Health's streaming Watch is not a unary method.
	if f.find("isolatord_rpc_duration_seconds", "method", "/grpc.health.v1.Health/Watch") != nil {
		t.Errorf("streaming method pre-created")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	as := func(uid string) context.Context { return metadata.AppendToOutgoingContext(ctx, "x-test-uid", uid) }
	if _, err := client.Check(as("1000"), &healthpb.HealthCheckRequest{Service: "isolatord.v1.Isolator"}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if _, err := client.Check(as("1000"), &healthpb.HealthCheckRequest{Service: "no.such.Service"}); status.Code(err) != codes.NotFound {
		t.Fatalf("Check unknown service: %v, want NotFound", err)
	}
	if _, err := client.Check(as("666"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Check as 666: %v, want PermissionDenied", err)
	}
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check without uid: %v", err)
	}

	f = scrape(t, m.Handler())
	want := []string{
		"{code=NotFound,method=" + checkMethod + ",peer_uid=1000}",
		"{code=OK,method=" + checkMethod + ",peer_uid=1000}",
		"{code=OK,method=" + checkMethod + ",peer_uid=unknown}",
		"{code=PermissionDenied,method=" + checkMethod + ",peer_uid=666}",
	}
	got := f.nonZero("isolatord_rpc_requests_total")
	if len(got) != len(want) {
		t.Fatalf("non-zero rpc series:\n got %v\nwant %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("non-zero rpc series %d: got %s, want %s", i, got[i], want[i])
		}
	}
	if v := f.value(t, "isolatord_rpc_requests_total", "method", checkMethod, "code", "OK", "peer_uid", "1000"); v != 1 {
		t.Errorf("OK calls by 1000 = %v, want 1", v)
	}
	if h := f.histogram(t, "isolatord_rpc_duration_seconds", "method", checkMethod); h.GetSampleCount() != 4 || h.GetSampleSum() <= 0 {
		t.Errorf("rpc histogram count = %d sum = %v, want 4 calls and a positive sum", h.GetSampleCount(), h.GetSampleSum())
	}
}

func TestRPCInterceptorNilUID(t *testing.T) {
	m := New("test")
	client := startHealth(t, m, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	f := scrape(t, m.Handler())
	if v := f.value(t, "isolatord_rpc_requests_total", "method", checkMethod, "code", "OK", "peer_uid", UnknownUID); v != 1 {
		t.Errorf("calls with unknown uid = %v, want 1", v)
	}
}
