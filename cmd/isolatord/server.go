package main

import (
	"context"
	"log/slog"
	"sort"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
)

// server maps the gRPC API onto the lifecycle. Validation lives in the
// lifecycle (so every front end gets the same messages); this layer only
// converts messages and errors.
type server struct {
	pbgrpc.UnimplementedIsolatorServer
	iso *isolator.Isolator
	log *slog.Logger
	// loopback, when set, says which host loopback ports are open to every
	// container (--host-loopback-ports, as last reloaded).
	loopback func() string
	// fragments, when set, reads the fragment steering's counters.
	fragments []fragmentsFn
}

func portSpecs(ps []*pb.PortRange) []isolator.PortSpec {
	out := make([]isolator.PortSpec, 0, len(ps))
	for _, p := range ps {
		if p == nil {
			continue
		}
		out = append(out, isolator.PortSpec{Begin: p.GetBegin(), End: p.GetEnd(), Shared: p.GetShared()})
	}
	return out
}

func toProto(r isolator.Record) *pb.Container {
	c := &pb.Container{
		ContainerId:    r.ID,
		EphemeralPorts: &pb.EphemeralRange{Begin: uint32(r.Ephemeral.Begin), End: uint32(r.Ephemeral.End)},
		Veth:           r.Veth,
		Netns:          r.Mount,
		Pid:            int32(r.Pid),
		CreatedAt:      timestamppb.New(r.Created),
		Labels:         r.Labels,
		NotRecovered:   r.Lost,
		PinOwned:       r.PinOwned,
	}
	switch r.State {
	case isolator.StatePrepared:
		c.State = pb.ContainerState_CONTAINER_STATE_PREPARED
	case isolator.StateIsolated:
		c.State = pb.ContainerState_CONTAINER_STATE_ISOLATED
	}
	if r.State != isolator.StateIsolated {
		c.Veth, c.Netns = "", ""
	}
	if r.Pid > 0 {
		c.NetnsSource = "pid:" + strconv.Itoa(r.Pid)
	} else {
		c.NetnsSource = r.NetNSPath
	}
	if !r.Isolated.IsZero() {
		c.IsolatedAt = timestamppb.New(r.Isolated)
	}
	for _, rg := range r.Ports.Ranges() {
		c.Ports = append(c.Ports, &pb.PortRange{Begin: uint32(rg.Begin), End: uint32(rg.End)})
	}
	for _, rg := range r.Shared.Ranges() {
		c.Ports = append(c.Ports, &pb.PortRange{Begin: uint32(rg.Begin), End: uint32(rg.End), Shared: true})
	}
	sort.Slice(c.Ports, func(i, j int) bool { return c.Ports[i].Begin < c.Ports[j].Begin })
	c.EgressLimit, c.IngressLimit = limitToProto(r.Egress), limitToProto(r.Ingress)
	return c
}

// limitToProto is nil for no limit.
func limitToProto(l rate.Limit) *pb.BandwidthLimit {
	if l.IsZero() {
		return nil
	}
	return &pb.BandwidthLimit{Rate: int64(l.Rate), Burst: int64(l.Burst), Ceil: int64(l.Ceil)}
}

// limitSpec is nil when the request does not set the limit.
func limitSpec(b *pb.BandwidthLimit) *isolator.LimitSpec {
	if b == nil {
		return nil
	}
	return &isolator.LimitSpec{Rate: b.GetRate(), Burst: b.GetBurst(), Ceil: b.GetCeil()}
}

// shapingToProto is nil when the direction has no limit.
func shapingToProto(c plane.ShapeCounters) *pb.ShapingStats {
	if c.Limit.IsZero() {
		return nil
	}
	return &pb.ShapingStats{
		Limit: limitToProto(c.Limit), Enforced: c.Enforced, Queue: c.Queue,
		Bytes: c.Bytes, Packets: c.Packets, Drops: c.Drops, Overlimits: c.Overlimits,
		BacklogBytes: c.Backlog, BacklogPackets: c.QueueLen,
	}
}

func (s *server) Prepare(ctx context.Context, req *pb.PrepareRequest) (*pb.PrepareResponse, error) {
	r, err := s.iso.PrepareWith(ctx, req.GetContainerId(), isolator.PrepareOptions{
		Ports: portSpecs(req.GetPorts()), Labels: req.GetLabels(),
		Egress: limitSpec(req.GetEgressLimit()), Ingress: limitSpec(req.GetIngressLimit()),
		HandoffFrom: req.GetHandoffFrom(), HandoffPorts: handoffPorts(req.GetHandoffPorts()),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.PrepareResponse{Container: s.withDrain(r)}, nil
}

func (s *server) Isolate(ctx context.Context, req *pb.IsolateRequest) (*pb.IsolateResponse, error) {
	t, err := isolateTarget(req.GetContainerId(), req.GetTarget())
	if err != nil {
		return nil, err
	}
	r, err := s.iso.Isolate(ctx, req.GetContainerId(), t)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.IsolateResponse{Container: toProto(r)}, nil
}

// isolateTarget checks an Isolate target: IsolateRequest's or
// AttachRequest's oneof, each a pid or a netns_path.
func isolateTarget(id string, target any) (isolator.IsolateTarget, error) {
	var t isolator.IsolateTarget
	path := false
	switch x := target.(type) {
	case *pb.IsolateRequest_Pid:
		t.Pid = int(x.Pid)
	case *pb.AttachRequest_Pid:
		t.Pid = int(x.Pid)
	case *pb.IsolateRequest_NetnsPath:
		t.NetNSPath, path = x.NetnsPath, true
	case *pb.AttachRequest_NetnsPath:
		t.NetNSPath, path = x.NetnsPath, true
	default:
		if id == "" {
			return t, status.Error(codes.InvalidArgument, "container_id: must not be empty")
		}
		return t, status.Error(codes.InvalidArgument, "target: give pid or netns_path")
	}
	switch {
	case path && t.NetNSPath == "":
		return t, status.Error(codes.InvalidArgument, "netns_path: must not be empty")
	case !path && t.Pid <= 0:
		return t, status.Errorf(codes.InvalidArgument, "pid: must be > 0, got %d", t.Pid)
	}
	return t, nil
}

func (s *server) Update(ctx context.Context, req *pb.UpdateRequest) (*pb.UpdateResponse, error) {
	r, err := s.iso.UpdateWith(ctx, req.GetContainerId(), isolator.UpdateOptions{
		Ports: portSpecs(req.GetPorts()), KeepPorts: req.GetKeepPorts(),
		Egress: limitSpec(req.GetEgressLimit()), Ingress: limitSpec(req.GetIngressLimit()),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.UpdateResponse{Container: toProto(r)}, nil
}

func (s *server) Usage(ctx context.Context, req *pb.UsageRequest) (*pb.UsageResponse, error) {
	r, st, ns, err := s.iso.UsageWithSockets(ctx, req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &pb.UsageResponse{
		ContainerId:    r.ID,
		EphemeralPorts: &pb.EphemeralRange{Begin: uint32(r.Ephemeral.Begin), End: uint32(r.Ephemeral.End)},
		CollectedAt:    timestamppb.New(time.Now()),
	}
	if r.State != isolator.StateIsolated {
		return resp, nil
	}
	resp.Traffic = &pb.TrafficStats{
		RxBytes: st.RxBytes, RxPackets: st.RxPackets, RxErrors: st.RxErrors, RxDropped: st.RxDropped,
		TxBytes: st.TxBytes, TxPackets: st.TxPackets, TxErrors: st.TxErrors, TxDropped: st.TxDropped,
	}
	resp.EgressShaping, resp.IngressShaping = shapingToProto(st.Egress), shapingToProto(st.Ingress)
	resp.DroppedPackets = st.Dropped
	if ns == nil {
		return resp, nil
	}
	resp.Tcp = &pb.TcpStats{ActiveConnections: ns.TCPConnections, TimeWaitConnections: ns.TCPTimeWait}
	if x := ns.RTT; x != nil {
		resp.Tcp.Rtt = &pb.RttPercentiles{
			P50Us: uint64(x.P50.Microseconds()), P90Us: uint64(x.P90.Microseconds()),
			P95Us: uint64(x.P95.Microseconds()), P99Us: uint64(x.P99.Microseconds()), Samples: uint64(x.Samples),
		}
	}
	resp.Snmp = &pb.SnmpStats{Ip: ns.SNMP["Ip"], Icmp: ns.SNMP["Icmp"], Tcp: ns.SNMP["Tcp"], Udp: ns.SNMP["Udp"]}
	return resp, nil
}

func (s *server) Cleanup(ctx context.Context, req *pb.CleanupRequest) (*pb.CleanupResponse, error) {
	if len(req.GetRequireLabels()) > 0 {
		return s.cleanupUnlessLabelsDiffer(ctx, req)
	}
	if err := s.iso.Cleanup(ctx, req.GetContainerId()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.CleanupResponse{}, nil
}

func (s *server) Get(ctx context.Context, req *pb.GetRequest) (*pb.GetResponse, error) {
	r, err := s.iso.Get(ctx, req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.GetResponse{Container: s.withDrain(r)}, nil
}

func (s *server) List(ctx context.Context, req *pb.ListRequest) (*pb.ListResponse, error) {
	recs := s.iso.List(ctx)
	resp := &pb.ListResponse{Containers: make([]*pb.Container, 0, len(recs))}
	for _, r := range recs {
		resp.Containers = append(resp.Containers, s.withDrain(r))
	}
	return resp, nil
}

func (s *server) Status(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	st := s.iso.Status(ctx)
	resp := &pb.StatusResponse{
		Version:              st.Version,
		EphemeralPool:        st.EphemeralPool.String(),
		BlockSize:            uint32(st.BlockSize),
		EphemeralBlocksTotal: uint32(st.BlocksTotal),
		EphemeralBlocksUsed:  uint32(st.BlocksUsed),
		EphemeralBlocksFree:  uint32(st.BlocksTotal - st.BlocksUsed),
		ManagedPorts:         st.ManagedPorts.String(),
		StaticPortsExclusive: st.ExclusivePorts.String(),
		StaticPortsShared:    st.SharedPorts.String(),
		Features:             st.Host.Features,
		ContainersByState:    map[string]uint32{},
		HostInterface:        st.Host.Eth0,
		DefaultEgressLimit:   limitToProto(st.DefaultEgress),
		DefaultIngressLimit:  limitToProto(st.DefaultIngress),
		LinkSpeedMbps:        st.Host.LinkSpeed,
		ShapingQueue:         st.Host.ShapingQueue,
		Unattributed:         st.Unattributed,
		Rebuilt:              st.Rebuilt,
		StateMovedAside:      st.StateMovedAside,
		OrphansReclaimed:     st.OrphansReclaimed,
	}
	if st.Host.IP.IP != nil {
		resp.HostIp = st.Host.IP.IP.String()
	}
	if s.loopback != nil {
		resp.HostLoopbackPorts = s.loopback()
	}
	for _, a := range st.Host.IPv6 {
		resp.HostIpv6 = append(resp.HostIpv6, a.String())
	}
	for state, n := range st.Containers {
		resp.ContainersByState[string(state)] = uint32(n)
		resp.Containers += uint32(n)
	}
	resp.HostPorts = hostPortsToProto(st.HostPorts)
	for _, f := range s.fragments {
		resp.Fragments = f()
	}
	return resp, nil
}

func (s *server) RemoveUnattributed(ctx context.Context, req *pb.RemoveUnattributedRequest) (*pb.RemoveUnattributedResponse, error) {
	removed, err := s.iso.RemoveUnattributed(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "remove unattributed kernel objects: %v (removed: %q)", err, removed)
	}
	return &pb.RemoveUnattributedResponse{Removed: removed}, nil
}
