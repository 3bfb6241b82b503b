package main

import (
	"context"

	"google.golang.org/grpc/status"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane"
)

// Attach is Prepare then Isolate in one call. A container that existed
// without require_labels is returned unchanged; one this call could not
// isolate is cleaned up again unless it was isolated before.
func (s *server) Attach(ctx context.Context, req *pb.AttachRequest) (*pb.AttachResponse, error) {
	p := req.GetPrepare()
	id := p.GetContainerId()
	t, err := isolateTarget(id, req.GetTarget())
	if err != nil {
		return nil, err
	}
	r, err := s.iso.PrepareWith(ctx, id, isolator.PrepareOptions{
		Ports: portSpecs(p.GetPorts()), Labels: p.GetLabels(),
		Egress: limitSpec(p.GetEgressLimit()), Ingress: limitSpec(p.GetIngressLimit()),
		HandoffFrom: p.GetHandoffFrom(), HandoffPorts: handoffPorts(p.GetHandoffPorts()),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	if !r.HasLabels(req.GetRequireLabels()) {
		return &pb.AttachResponse{Container: toProto(r), LabelsDiffer: true}, nil
	}
	if attachPrepared != nil {
		attachPrepared(id)
	}
	// The labels again under the container's lock: one replaced since
	// (another caller's Cleanup and Prepare) is not this call's to isolate.
	r, differ, wasIsolated, err := s.iso.IsolateIfLabeled(ctx, id, req.GetRequireLabels(), t)
	if differ {
		return &pb.AttachResponse{Container: toProto(r), LabelsDiffer: true}, nil
	}
	if err != nil {
		if wasIsolated {
			return nil, toStatus(err)
		}
		// Clean up even if the caller has gone: a prepared container
		// nobody attached would hold its ports. The labels are checked
		// again under the container's lock: one replaced meanwhile is not
		// this call's to remove.
		if _, cerr := s.iso.CleanupIfLabeled(context.WithoutCancel(ctx), id, req.GetRequireLabels()); cerr != nil {
			st := status.Convert(toStatus(err))
			return nil, status.Error(st.Code(), st.Message()+"; rollback (Cleanup) also failed: "+cerr.Error())
		}
		return nil, toStatus(err)
	}
	resp := &pb.AttachResponse{Container: toProto(r), WasIsolated: wasIsolated}
	// Only a container this call isolated has the eth0 the host's facts
	// describe: one isolated before may have been by an earlier run on a
	// host whose address, MTU or IPv6 have changed since (recovery keeps
	// its eth0 as it is), and its caller reads the namespace instead.
	if !wasIsolated {
		resp.Eth0 = containerEth0(s.iso.Host())
	}
	return resp, nil
}

// containerEth0 is an isolated container's eth0 as the data plane
// configures it from the host's: its MAC and MTU, its address and the
// default route via the host's gateway, and, with IPv6, the host's global
// addresses and IPv6 default route. The kernel lists IPv6 addresses of one
// scope newest first, and the data plane adds them in the host's order, so
// they are reported in reverse.
func containerEth0(h plane.HostInfo) *pb.AttachResponse_Interface {
	e := &pb.AttachResponse_Interface{Mtu: uint32(h.MTU)}
	if len(h.MAC) > 0 {
		e.Mac = h.MAC.String()
	}
	if h.IP.IP != nil {
		e.Ipv4Addresses = []string{h.IP.String()}
	}
	if h.Gateway != nil {
		e.Ipv4Gateway = h.Gateway.String()
	}
	for i := len(h.IPv6) - 1; i >= 0; i-- {
		e.Ipv6Addresses = append(e.Ipv6Addresses, h.IPv6[i].String())
	}
	if h.Gateway6 != nil && len(h.IPv6) > 0 {
		e.Ipv6Gateway = h.Gateway6.String()
	}
	return e
}

// attachPrepared, if set (by tests), is called between Attach's Prepare
// and its Isolate.
var attachPrepared func(id string)

// cleanupUnlessLabelsDiffer is Cleanup with require_labels: a container
// lacking one of them is kept (checked under the container's lock).
func (s *server) cleanupUnlessLabelsDiffer(ctx context.Context, req *pb.CleanupRequest) (*pb.CleanupResponse, error) {
	kept, err := s.iso.CleanupIfLabeled(ctx, req.GetContainerId(), req.GetRequireLabels())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.CleanupResponse{Kept: kept}, nil
}
