package main

import (
	"context"
	"os"
	"testing"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/isolator/isolatortest"
)

// BenchmarkRPC is the cost of calls through the real gRPC server and
// client on a unix socket (peer credentials, the interceptors), over the
// lifecycle with a fake data plane: a Get (the round trip alone), and a
// container's Prepare, Isolate (by pid) and Cleanup.
func BenchmarkRPC(b *testing.B) {
	cl, _, _ := startServerWith(b, []uint32{uint32(os.Getuid())}, isolatortest.New())
	ctx := context.Background()
	if _, err := cl.Prepare(ctx, &pb.PrepareRequest{ContainerId: "probe"}); err != nil {
		b.Fatal(err)
	}
	b.Run("Get", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := cl.Get(ctx, &pb.GetRequest{ContainerId: "probe"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("SetupTeardown", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := cl.Prepare(ctx, &pb.PrepareRequest{ContainerId: "x", Ports: []*pb.PortRange{pr(31000, 31000, false)}}); err != nil {
				b.Fatal(err)
			}
			if _, err := cl.Isolate(ctx, &pb.IsolateRequest{ContainerId: "x", Target: &pb.IsolateRequest_Pid{Pid: int32(os.Getpid())}}); err != nil {
				b.Fatal(err)
			}
			if _, err := cl.Cleanup(ctx, &pb.CleanupRequest{ContainerId: "x"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
