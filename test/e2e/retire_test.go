package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/dataplane"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// retiredLinks lists the sandbox host's links awaiting deletion.
func retiredLinks(t *testing.T, sb *sandbox.Sandbox) []string {
	t.Helper()
	h, err := sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ls, err := h.LinkList()
	for i := 0; errors.Is(err, netlink.ErrDumpInterrupted) && i < 100; i++ {
		// links changed during the dump (the daemon deleting them): read again
		ls, err = h.LinkList()
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		if l.Attrs().Group == dataplane.RetiredGroup {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// TestDaemonFinishesRetiredAfterKill: a daemon killed with SIGKILL right
// after a cleanup (its veth possibly not deleted yet), with one more retired
// pair left in the kernel as a killed daemon leaves it, deletes them all
// after its restart; the container's namespace takes a new container.
func TestDaemonFinishesRetiredAfterKill(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	holder := sb.StartContainer(t, "holder")
	ctx := context.Background()
	id := sb.Name + "-r"
	setup := func() {
		t.Helper()
		if _, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id, Ports: []*pb.PortRange{{Begin: 31005, End: 31005}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Client.Isolate(ctx, &pb.IsolateRequest{ContainerId: id, Target: &pb.IsolateRequest_Pid{Pid: int32(holder.Pid)}}); err != nil {
			t.Fatalf("isolate: %v\n%s", err, d.Log())
		}
	}
	setup()
	if _, err := d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	d.Kill()

	// What a daemon killed between retiring and deleting leaves: a pair
	// whose host end is in the deletion group with its name and alias.
	h, err := sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	gone := sb.Name + "-gone"
	for i, name := range []string{plane.VethName(gone)} {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		attrs.Group = dataplane.RetiredGroup
		if err = h.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: fmt.Sprintf("retpeer%d", i)}); err != nil {
			break
		}
	}
	if err == nil {
		err = h.LinkSetAlias(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: plane.VethName(gone)}}, fmt.Sprintf(`{"id":%q}`, gone))
	}
	h.Close()
	if err != nil {
		t.Fatal(err)
	}

	d.Start()
	if !wait.Until(15*time.Second, func() bool { return len(retiredLinks(t, sb)) == 0 }) {
		t.Fatalf("retired links still there 15s after the restart: %v\n%s", retiredLinks(t, sb), d.Log())
	}
	// The namespace takes a container again.
	setup()
	if _, err := d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
}
