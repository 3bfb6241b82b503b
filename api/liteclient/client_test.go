package liteclient_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/api/liteclient"
	"github.com/isolatord/isolatord/api/unarygrpc"
)

// recorder is a grpc-go Isolator service that keeps the requests it gets
// and answers with fixed replies.
type recorder struct {
	pbgrpc.UnimplementedIsolatorServer
	attach  *pb.AttachRequest
	cleanup *pb.CleanupRequest
}

var ctr = &pb.Container{ContainerId: "c1", State: pb.ContainerState_CONTAINER_STATE_ISOLATED, Veth: "iso0", NetnsSource: "/proc/1/ns/net",
	Ports: []*pb.PortRange{{Begin: 31001, End: 31001, Shared: true}}, Labels: map[string]string{"cni.network": "n"}, Pid: 1}

func (r *recorder) Attach(_ context.Context, q *pb.AttachRequest) (*pb.AttachResponse, error) {
	r.attach = q
	return &pb.AttachResponse{Container: ctr, WasIsolated: true}, nil
}

func (r *recorder) Cleanup(_ context.Context, q *pb.CleanupRequest) (*pb.CleanupResponse, error) {
	r.cleanup = q
	return &pb.CleanupResponse{Kept: true}, nil
}

func (r *recorder) Get(_ context.Context, q *pb.GetRequest) (*pb.GetResponse, error) {
	return nil, status.Errorf(codes.NotFound, "container_id: %s is not known", q.GetContainerId())
}

func (r *recorder) List(context.Context, *pb.ListRequest) (*pb.ListResponse, error) {
	return &pb.ListResponse{Containers: []*pb.Container{ctr, ctr}}, nil
}

func (r *recorder) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{Version: "v9", HostIp: "198.18.0.1"}, nil
}

// TestCallsAgainstGRPCServer: every call of the light client reaches a
// grpc-go server, which decodes what the plugin sends with the generated
// code; replies and errors come back.
func TestCallsAgainstGRPCServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := grpc.NewServer()
	pbgrpc.RegisterIsolatorServer(srv, rec)
	go srv.Serve(lis)
	defer srv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := liteclient.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	labels := map[string]string{"cni.network": "n", "cni.ifname": "eth0"}
	att, err := c.Attach(ctx, &liteclient.AttachRequest{
		Prepare:   &liteclient.PrepareRequest{ContainerID: "c1", Ports: []liteclient.PortRange{{Begin: 31001, End: 31002, Shared: true}}, Labels: labels},
		NetnsPath: "/proc/1/ns/net", RequireLabels: labels,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.AttachRequest{Prepare: &pb.PrepareRequest{ContainerId: "c1", Ports: []*pb.PortRange{{Begin: 31001, End: 31002, Shared: true}}, Labels: labels},
		Target: &pb.AttachRequest_NetnsPath{NetnsPath: "/proc/1/ns/net"}, RequireLabels: labels}
	if !proto.Equal(rec.attach, want) {
		t.Errorf("the server got %v, want %v", rec.attach, want)
	}
	wantCtr := &liteclient.Container{ContainerID: "c1", State: liteclient.StateIsolated, Veth: "iso0", NetnsSource: "/proc/1/ns/net",
		Ports: []liteclient.PortRange{{Begin: 31001, End: 31001, Shared: true}}, Labels: map[string]string{"cni.network": "n"}}
	if !att.WasIsolated || att.LabelsDiffer || !reflect.DeepEqual(att.Container, wantCtr) {
		t.Errorf("Attach = %+v %+v", att, att.Container)
	}

	cl, err := c.Cleanup(ctx, &liteclient.CleanupRequest{ContainerID: "c1", RequireLabels: labels})
	if err != nil || !cl.Kept {
		t.Errorf("Cleanup = %+v, %v", cl, err)
	}
	if !proto.Equal(rec.cleanup, &pb.CleanupRequest{ContainerId: "c1", RequireLabels: labels}) {
		t.Errorf("the server got %v", rec.cleanup)
	}
	l, err := c.List(ctx)
	if err != nil || len(l.Containers) != 2 || !reflect.DeepEqual(l.Containers[1], wantCtr) {
		t.Errorf("List = %+v, %v", l, err)
	}
	st, err := c.Status(ctx)
	if err != nil || st.Version != "v9" || st.HostIP != "198.18.0.1" {
		t.Errorf("Status = %+v, %v", st, err)
	}
	_, err = c.Get(ctx, &liteclient.GetRequest{ContainerID: "c7"})
	var e *unarygrpc.Error
	if !errors.As(err, &e) || e.Code != unarygrpc.NotFound || e.Message != "container_id: c7 is not known" {
		t.Errorf("Get(c7) = %v, want NotFound", err)
	}
}

// TestDialErrorsNameTheSocket: a missing socket fails Dial at once; a
// socket whose server never greets fails the first call at Dial's
// deadline with an error naming the socket.
func TestDialErrorsNameTheSocket(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.sock")
	if _, err := liteclient.Dial(context.Background(), missing); !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), missing) {
		t.Errorf("Dial(missing) = %v", err)
	}
	mute := filepath.Join(dir, "mute.sock")
	lis, err := net.Listen("unix", mute)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	c, err := liteclient.Dial(ctx, mute)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Status(context.Background())
	var he *unarygrpc.HandshakeError
	if !errors.As(err, &he) || !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "cannot connect to isolatord at "+mute+": ") {
		t.Errorf("Status on a mute socket = %v", err)
	}
}
