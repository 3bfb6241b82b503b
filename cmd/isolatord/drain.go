package main

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/dataplane"
	"github.com/isolatord/isolatord/isolator"
)

// The data plane drains ports (isolator.Drainer).
var _ isolator.Drainer = (*dataplane.DataPlane)(nil)

func (s *server) Drain(ctx context.Context, req *pb.DrainRequest) (*pb.DrainResponse, error) {
	ports := make([]uint16, 0, len(req.GetPorts()))
	for _, p := range req.GetPorts() {
		if p == 0 || p > 65535 {
			return nil, toStatus(invalidPort(p))
		}
		ports = append(ports, uint16(p))
	}
	r, err := s.iso.Drain(ctx, req.GetContainerId(), ports, req.GetUndo(), time.Duration(req.GetDeadlineSeconds())*time.Second)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.DrainResponse{Container: s.withDrain(r)}, nil
}

func invalidPort(p uint32) error {
	return &isolator.Error{Kind: isolator.ErrInvalidArgument, Msg: "ports: " + strconv.FormatUint(uint64(p), 10) + " is not a port (1-65535)"}
}

// withDrain is toProto with the handoff and the drained ports' live flows
// (asked of the data plane only for a container that drains).
func (s *server) withDrain(r isolator.Record) *pb.Container {
	c := toProto(r)
	c.HandoffFrom = r.HandoffFrom
	for _, p := range r.HandoffPorts.Ports() {
		c.HandoffPorts = append(c.HandoffPorts, uint32(p))
	}
	// Only a container whose record says it drains is asked (reads never
	// wait for the data plane otherwise); recovery brings the records in
	// line with the kernel's markers (isolator.syncDrains).
	if r.Draining.Empty() || r.State != isolator.StateIsolated {
		return c
	}
	for _, d := range s.iso.DrainState(r.ID) {
		dp := &pb.DrainingPort{Port: uint32(d.Port), LiveFlows: uint32(d.LiveFlows)}
		if !r.DrainDeadline.IsZero() {
			dp.Deadline = timestamppb.New(r.DrainDeadline)
		}
		c.Draining = append(c.Draining, dp)
	}
	return c
}

// handoffPorts converts a PrepareRequest's handoff_ports; a value that is
// not a port becomes 0, which the lifecycle refuses by name.
func handoffPorts(ps []uint32) []uint16 {
	var out []uint16
	for _, p := range ps {
		if p > 65535 {
			p = 0
		}
		out = append(out, uint16(p))
	}
	return out
}
