package main

import (
	"context"

	"google.golang.org/grpc/status"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/isolator"
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
	return &pb.AttachResponse{Container: toProto(r), WasIsolated: wasIsolated}, nil
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
