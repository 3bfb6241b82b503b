package e2e

import (
	"context"
	"fmt"
	"testing"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
)

// TestDaemonKilledAfterPrepare kills the daemon with SIGKILL the moment a
// Prepare has answered (its record in the intent journal, its commit
// possibly not landed), over and over: after each restart the container
// is prepared with the ports it was given, and is isolated and cleaned up
// as usual; nothing leaks and nothing is held twice.
func TestDaemonKilledAfterPrepare(t *testing.T) {
	cycles := 20
	if testing.Short() {
		cycles = 5
	}
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	base := readHostState(t, sb, d.NetNSDir)
	holder := sb.StartContainer(t, "holder")
	ctx := context.Background()
	for i := 0; i < cycles; i++ {
		id := fmt.Sprintf("%s-p%d", sb.Name, i)
		port := uint32(31000 + i)
		prep, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id, Ports: []*pb.PortRange{{Begin: port, End: port}}})
		if err != nil {
			t.Fatalf("cycle %d prepare: %v", i, err)
		}
		d.Kill()
		d.Start()
		got, err := d.Client.Get(ctx, &pb.GetRequest{ContainerId: id})
		if err != nil {
			t.Fatalf("cycle %d: container prepared before a kill is lost: %v\n%s", i, err, d.Log())
		}
		if fmt.Sprint(got.GetContainer().GetEphemeralPorts()) != fmt.Sprint(prep.GetContainer().GetEphemeralPorts()) ||
			fmt.Sprint(got.GetContainer().GetPorts()) != fmt.Sprint(prep.GetContainer().GetPorts()) {
			t.Fatalf("cycle %d: after the restart %v, prepared as %v", i, got.GetContainer(), prep.GetContainer())
		}
		if _, err := d.Client.Isolate(ctx, &pb.IsolateRequest{ContainerId: id, Target: &pb.IsolateRequest_Pid{Pid: int32(holder.Pid)}}); err != nil {
			t.Fatalf("cycle %d isolate after the restart: %v", i, err)
		}
		if _, err := d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id}); err != nil {
			t.Fatalf("cycle %d cleanup: %v", i, err)
		}
		st, err := d.Client.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.EphemeralBlocksUsed != 0 || st.StaticPortsExclusive != "" || st.Containers != 0 {
			t.Fatalf("cycle %d: leak in bookkeeping: %+v", i, st)
		}
	}
	// A last restart: nothing comes back that was cleaned up.
	d.Kill()
	d.Start()
	st, err := d.Client.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Containers != 0 {
		t.Fatalf("containers after the last restart: %+v", st)
	}
	if hs := readHostState(t, sb, d.NetNSDir); fmt.Sprint(hs) != fmt.Sprint(base) {
		t.Fatalf("kernel leak:\nbase %+v\nnow  %+v\n%s", base, hs, d.Log())
	}
}
