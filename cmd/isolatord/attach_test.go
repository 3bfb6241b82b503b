package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isolatord/isolatord/api"
	pb "github.com/isolatord/isolatord/api/isolatord/v1"
)

func attachReq(id string, labels, require map[string]string, ports ...*pb.PortRange) *pb.AttachRequest {
	return &pb.AttachRequest{
		Prepare:       &pb.PrepareRequest{ContainerId: id, Ports: ports, Labels: labels},
		Target:        &pb.AttachRequest_Pid{Pid: int32(os.Getpid())},
		RequireLabels: require,
	}
}

// TestAttach: Prepare and Isolate in one call, repeated idempotently; an
// existing container without the required labels is left alone.
func TestAttach(t *testing.T) {
	c, _, _ := startServer(t, []uint32{uint32(os.Getuid())})
	ctx := context.Background()
	mine := map[string]string{"cni.network": "n1", "cni.ifname": "eth0"}

	r, err := c.Attach(ctx, attachReq("a1", mine, mine, pr(31001, 31001, false)))
	if err != nil {
		t.Fatal(err)
	}
	if r.GetContainer().GetState() != pb.ContainerState_CONTAINER_STATE_ISOLATED || r.GetWasIsolated() || r.GetLabelsDiffer() {
		t.Fatalf("first Attach = %v", r)
	}
	r2, err := c.Attach(ctx, attachReq("a1", mine, mine, pr(31001, 31001, false)))
	if err != nil {
		t.Fatal(err)
	}
	if !r2.GetWasIsolated() || r2.GetContainer().GetVeth() != r.GetContainer().GetVeth() {
		t.Fatalf("retried Attach = %v, want the same container, was_isolated", r2)
	}

	// Prepared for another network: Attach for n2 changes nothing.
	if _, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "a2", Labels: mine}); err != nil {
		t.Fatal(err)
	}
	other := map[string]string{"cni.network": "n2", "cni.ifname": "eth0"}
	r3, err := c.Attach(ctx, attachReq("a2", other, other))
	if err != nil {
		t.Fatal(err)
	}
	if !r3.GetLabelsDiffer() || r3.GetContainer().GetLabels()["cni.network"] != "n1" {
		t.Fatalf("Attach of n1's container for n2 = %v, want labels_differ", r3)
	}
	if g, _ := c.Get(ctx, &pb.GetRequest{ContainerId: "a2"}); g.GetContainer().GetState() != pb.ContainerState_CONTAINER_STATE_PREPARED {
		t.Fatalf("a2 after a refused Attach: %v", g)
	}

	// Bad requests name the field and change nothing.
	for _, tc := range []struct {
		req *pb.AttachRequest
		msg string
	}{
		{&pb.AttachRequest{Prepare: &pb.PrepareRequest{ContainerId: "a3"}}, "target"},
		{&pb.AttachRequest{Prepare: &pb.PrepareRequest{ContainerId: "a3"}, Target: &pb.AttachRequest_NetnsPath{}}, "netns_path"},
		{&pb.AttachRequest{Prepare: &pb.PrepareRequest{ContainerId: "a3"}, Target: &pb.AttachRequest_Pid{Pid: -1}}, "pid"},
		{&pb.AttachRequest{Target: &pb.AttachRequest_Pid{Pid: 1}}, "container_id"},
		{attachReq("a3", nil, nil, pr(31001, 31001, false)), "a1"},
	} {
		_, err := c.Attach(ctx, tc.req)
		if st, _ := status.FromError(err); st.Code() == codes.OK || !strings.Contains(st.Message(), tc.msg) {
			t.Errorf("Attach(%v) = %v, want an error naming %q", tc.req, err, tc.msg)
		}
	}
	if _, err := c.Get(ctx, &pb.GetRequest{ContainerId: "a3"}); status.Code(err) != codes.NotFound {
		t.Errorf("a3 exists after refused Attach calls: %v", err)
	}
}

// TestAttachRollsBack: when Isolate fails, the container Attach prepared
// is cleaned up (its port is free again) and the error is Isolate's.
func TestAttachRollsBack(t *testing.T) {
	c, dp, _ := startServer(t, []uint32{uint32(os.Getuid())})
	ctx := context.Background()
	dp.FailNext["setup"] = errors.New("veth: file exists")
	_, err := c.Attach(ctx, attachReq("b1", nil, nil, pr(31002, 31002, false)))
	if status.Code(err) == codes.OK || !strings.Contains(status.Convert(err).Message(), "file exists") {
		t.Fatalf("Attach with a failing setup = %v", err)
	}
	if _, err := c.Get(ctx, &pb.GetRequest{ContainerId: "b1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("b1 kept after a failed Attach: %v", err)
	}
	if _, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "b2", Ports: []*pb.PortRange{pr(31002, 31002, false)}}); err != nil {
		t.Fatalf("port 31002 still held after the rollback: %v", err)
	}
}

// TestCleanupRequireLabels: Cleanup with require_labels removes only a
// container carrying them; an unknown container succeeds as always.
func TestCleanupRequireLabels(t *testing.T) {
	c, _, _ := startServer(t, []uint32{uint32(os.Getuid())})
	ctx := context.Background()
	mine := map[string]string{"cni.network": "n1", "cni.ifname": "eth0"}
	if _, err := c.Attach(ctx, attachReq("d1", mine, mine)); err != nil {
		t.Fatal(err)
	}
	r, err := c.Cleanup(ctx, &pb.CleanupRequest{ContainerId: "d1", RequireLabels: map[string]string{"cni.network": "n1", "cni.ifname": "eth1"}})
	if err != nil || !r.GetKept() {
		t.Fatalf("Cleanup with another ifname = %v, %v; want kept", r, err)
	}
	if _, err := c.Get(ctx, &pb.GetRequest{ContainerId: "d1"}); err != nil {
		t.Fatalf("d1 gone after a kept Cleanup: %v", err)
	}
	r, err = c.Cleanup(ctx, &pb.CleanupRequest{ContainerId: "d1", RequireLabels: mine})
	if err != nil || r.GetKept() {
		t.Fatalf("Cleanup with its labels = %v, %v", r, err)
	}
	if _, err := c.Get(ctx, &pb.GetRequest{ContainerId: "d1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("d1 after Cleanup: %v", err)
	}
	if _, err := c.Cleanup(ctx, &pb.CleanupRequest{ContainerId: "d1", RequireLabels: mine}); err != nil {
		t.Fatalf("Cleanup of an unknown container: %v", err)
	}
}

// TestLightClientAgainstServer: api.Client (the CLI's and the CNI
// plugin's transport) against the daemon's own gRPC server: replies, and
// errors with the daemon's code and a message naming the holder.
func TestLightClientAgainstServer(t *testing.T) {
	_, _, gc := startServer(t, []uint32{uint32(os.Getuid())})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := api.Dial(ctx, gc.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Attach(ctx, attachReq("l1", nil, nil, pr(31003, 31003, false))); err != nil {
		t.Fatal(err)
	}
	_, err = c.Attach(ctx, attachReq("l2", nil, nil, pr(31003, 31003, false)))
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "l1") {
		t.Fatalf("Attach of a held port = %v, want FailedPrecondition naming l1", err)
	}
	l, err := c.List(ctx, &pb.ListRequest{})
	if err != nil || len(l.GetContainers()) != 1 || l.GetContainers()[0].GetState() != pb.ContainerState_CONTAINER_STATE_ISOLATED {
		t.Fatalf("List = %v, %v", l, err)
	}
}

// TestAttachReplacedMeanwhile: between Attach's Prepare and its Isolate,
// another caller replaces the container (its Cleanup, then its Prepare of
// the same id for another network). Attach reports labels_differ and
// leaves the replacement prepared: it is not isolated into this caller's
// namespace, nor removed.
func TestAttachReplacedMeanwhile(t *testing.T) {
	c, _, _ := startServer(t, []uint32{uint32(os.Getuid())})
	ctx := context.Background()
	mine := map[string]string{"cni.network": "n1", "cni.ifname": "eth0"}
	other := map[string]string{"cni.network": "n2", "cni.ifname": "eth0"}
	t.Cleanup(func() { attachPrepared = nil })
	replaced := false
	attachPrepared = func(id string) {
		if replaced {
			return
		}
		replaced = true
		if _, err := c.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id}); err != nil {
			t.Error(err)
		}
		if _, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: id, Labels: other, Ports: []*pb.PortRange{pr(31005, 31005, false)}}); err != nil {
			t.Error(err)
		}
	}
	r, err := c.Attach(ctx, attachReq("e1", mine, mine, pr(31004, 31004, false)))
	if err != nil {
		t.Fatal(err)
	}
	if !replaced {
		t.Fatal("the hook between Prepare and Isolate did not run")
	}
	if !r.GetLabelsDiffer() || r.GetContainer().GetLabels()["cni.network"] != "n2" {
		t.Errorf("Attach of a container replaced meanwhile = %v, want labels_differ and the replacement", r)
	}
	g, err := c.Get(ctx, &pb.GetRequest{ContainerId: "e1"})
	if err != nil {
		t.Fatal(err)
	}
	if g.GetContainer().GetState() != pb.ContainerState_CONTAINER_STATE_PREPARED || g.GetContainer().GetLabels()["cni.network"] != "n2" {
		t.Errorf("the replacement after Attach: %v, want it prepared for n2", g.GetContainer())
	}
}
