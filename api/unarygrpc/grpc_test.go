package unarygrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/api/unarygrpc"
)

// A message with what grpc-message must percent-encode: non-ASCII, '%',
// a newline.
const oddMessage = "ports: port 31001 is held exclusively by \"c1\" (100% füll)\nsecond line"

// testService is a grpc-go Isolator service whose answers the tests pick.
type testService struct {
	pbgrpc.UnimplementedIsolatorServer
	// list is what List returns.
	list []*pb.Container
	// entered is signalled when Usage starts; Usage then waits for its
	// context.
	entered chan struct{}
}

func (s *testService) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	r := &pb.StatusResponse{Version: "test"}
	if d, ok := ctx.Deadline(); ok {
		r.HostInterface = time.Until(d).Round(time.Second).String()
	}
	return r, nil
}

func (s *testService) Get(_ context.Context, r *pb.GetRequest) (*pb.GetResponse, error) {
	if r.GetContainerId() == "odd" {
		return nil, status.Error(codes.FailedPrecondition, oddMessage)
	}
	return nil, status.Errorf(codes.NotFound, "container_id: %s is not known", r.GetContainerId())
}

func (s *testService) List(context.Context, *pb.ListRequest) (*pb.ListResponse, error) {
	return &pb.ListResponse{Containers: s.list}, nil
}

// Prepare echoes the request's labels.
func (s *testService) Prepare(_ context.Context, r *pb.PrepareRequest) (*pb.PrepareResponse, error) {
	return &pb.PrepareResponse{Container: &pb.Container{ContainerId: r.GetContainerId(), Labels: r.GetLabels()}}, nil
}

func (s *testService) Usage(ctx context.Context, _ *pb.UsageRequest) (*pb.UsageResponse, error) {
	s.entered <- struct{}{}
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// serveGRPC runs svc on a grpc-go server on a fresh unix socket.
func serveGRPC(t *testing.T, svc *testService) (*grpc.Server, string) {
	t.Helper()
	sock, lis := listenUnix(t)
	if svc.entered == nil {
		svc.entered = make(chan struct{}, 1)
	}
	srv := grpc.NewServer()
	pbgrpc.RegisterIsolatorServer(srv, svc)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return srv, sock
}

func dial(t *testing.T, sock string) *unarygrpc.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := unarygrpc.Dial(ctx, sock)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// invoke calls method on c with req encoded by the generated code and
// decodes the reply into reply; an *unarygrpc.Error comes back as the
// grpc-go status it stands for.
func invoke(ctx context.Context, c *unarygrpc.Conn, method string, req, reply proto.Message) error {
	b, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	out, err := c.Invoke(ctx, method, b)
	if err != nil {
		var e *unarygrpc.Error
		if errors.As(err, &e) {
			return status.Error(codes.Code(e.Code), e.Message)
		}
		return err
	}
	return proto.Unmarshal(out, reply)
}

const (
	mStatus  = "/isolatord.v1.Isolator/Status"
	mGet     = "/isolatord.v1.Isolator/Get"
	mList    = "/isolatord.v1.Isolator/List"
	mPrepare = "/isolatord.v1.Isolator/Prepare"
	mUsage   = "/isolatord.v1.Isolator/Usage"
)

// TestCallsAndErrorsOnOneConnection: replies, the server's codes and
// messages (percent-encoded on the wire) and an unknown method, one after
// another on one connection (stream IDs and the header tables advance).
func TestCallsAndErrorsOnOneConnection(t *testing.T) {
	_, sock := serveGRPC(t, &testService{})
	c := dial(t, sock)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		var st pb.StatusResponse
		if err := invoke(ctx, c, mStatus, &pb.StatusRequest{}, &st); err != nil || st.GetVersion() != "test" {
			t.Fatalf("Status #%d = %v, %v", i, &st, err)
		}
		err := invoke(ctx, c, mGet, &pb.GetRequest{ContainerId: "odd"}, &pb.GetResponse{})
		if s, ok := status.FromError(err); !ok || s.Code() != codes.FailedPrecondition || s.Message() != oddMessage {
			t.Fatalf("Get(odd) #%d = %v, want FailedPrecondition %q", i, err, oddMessage)
		}
		err = invoke(ctx, c, mGet, &pb.GetRequest{ContainerId: "c9"}, &pb.GetResponse{})
		if s, _ := status.FromError(err); s.Code() != codes.NotFound || s.Message() != "container_id: c9 is not known" {
			t.Fatalf("Get(c9) = %v", err)
		}
		err = invoke(ctx, c, "/isolatord.v1.Isolator/Nope", &pb.GetRequest{}, &pb.GetResponse{})
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("unknown method = %v, want Unimplemented", err)
		}
	}
}

// TestLargeReplyAndRequest: a reply many times the announced window (the
// client must send WINDOW_UPDATEs) and a request larger than the server's
// initial window (the client must wait for the server's).
func TestLargeReplyAndRequest(t *testing.T) {
	svc := &testService{}
	for i := 0; i < 20000; i++ {
		svc.list = append(svc.list, &pb.Container{
			ContainerId: fmt.Sprintf("container-%05d", i),
			State:       pb.ContainerState_CONTAINER_STATE_ISOLATED,
			Labels:      map[string]string{"cni.network": "isobench", "cni.ifname": "eth0", "pad": strings.Repeat("x", 200)},
		})
	}
	_, sock := serveGRPC(t, svc)
	c := dial(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ {
		var l pb.ListResponse
		if err := invoke(ctx, c, mList, &pb.ListRequest{}, &l); err != nil {
			t.Fatalf("List #%d: %v", i, err)
		}
		if n := len(l.GetContainers()); n != 20000 || l.GetContainers()[19999].GetContainerId() != "container-19999" {
			t.Fatalf("List #%d: %d containers", i, n)
		}
	}
	big := map[string]string{}
	for i := 0; i < 40; i++ {
		big[fmt.Sprint("k", i)] = strings.Repeat(string(rune('a'+i%26)), 8000)
	}
	var p pb.PrepareResponse
	if err := invoke(ctx, c, mPrepare, &pb.PrepareRequest{ContainerId: "big", Labels: big}, &p); err != nil {
		t.Fatalf("Prepare with %d bytes of labels: %v", 40*8000, err)
	}
	if len(p.GetContainer().GetLabels()) != 40 || p.GetContainer().GetLabels()["k39"] != big["k39"] {
		t.Fatal("labels did not come back whole")
	}
}

// TestDeadlineReachesServer: the context's deadline travels as
// grpc-timeout, and a call the server does not finish in time ends with
// DeadlineExceeded at the deadline (whether the client's socket deadline or
// the server's reset of the stream comes first).
func TestDeadlineReachesServer(t *testing.T) {
	svc := &testService{}
	_, sock := serveGRPC(t, svc)
	c := dial(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 42*time.Second)
	defer cancel()
	var st pb.StatusResponse
	if err := invoke(ctx, c, mStatus, &pb.StatusRequest{}, &st); err != nil {
		t.Fatal(err)
	}
	if st.GetHostInterface() != "42s" {
		t.Errorf("the server saw a deadline %q away, want 42s", st.GetHostInterface())
	}

	sctx, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer scancel()
	start := time.Now()
	err := invoke(sctx, c, mUsage, &pb.UsageRequest{}, &pb.UsageResponse{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("slow call = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("slow call took %v", d)
	}
}

// TestCancel: cancelling the context ends a call the server is still
// working on.
func TestCancel(t *testing.T) {
	svc := &testService{}
	_, sock := serveGRPC(t, svc)
	c := dial(t, sock)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-svc.entered
		cancel()
	}()
	err := invoke(ctx, c, mUsage, &pb.UsageRequest{}, &pb.UsageResponse{})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call = %v, want Canceled", err)
	}
}

// TestServerStops: the server closing the connection during a call, and
// a graceful stop between calls, are Unavailable.
func TestServerStops(t *testing.T) {
	svc := &testService{}
	srv, sock := serveGRPC(t, svc)
	c := dial(t, sock)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-svc.entered
		srv.Stop()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := invoke(ctx, c, mUsage, &pb.UsageRequest{}, &pb.UsageResponse{})
	wg.Wait()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("call during Stop = %v, want Unavailable", err)
	}

	srv2, sock2 := serveGRPC(t, &testService{})
	c2 := dial(t, sock2)
	if err := invoke(ctx, c2, mStatus, &pb.StatusRequest{}, &pb.StatusResponse{}); err != nil {
		t.Fatal(err)
	}
	// A graceful stop: later calls are Unavailable.
	go srv2.GracefulStop()
	deadline := time.Now().Add(5 * time.Second)
	err = nil // the loop below must see c2's own error, not the first call's
	for err == nil && time.Now().Before(deadline) {
		err = invoke(ctx, c2, mStatus, &pb.StatusRequest{}, &pb.StatusResponse{})
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("call after GracefulStop = %v, want Unavailable", err)
	}
}

// TestDialErrors: nothing listening is the system's error, at once.
func TestDialErrors(t *testing.T) {
	_, err := unarygrpc.Dial(context.Background(), filepath.Join(t.TempDir(), "none.sock"))
	var op *net.OpError
	if err == nil || !errors.As(err, &op) {
		t.Fatalf("Dial of a missing socket = %v", err)
	}
}
