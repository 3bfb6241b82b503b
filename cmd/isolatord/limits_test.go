package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isolatord/isolatord/api"
	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/isolatortest"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/metrics"
)

func TestLimitFlags(t *testing.T) {
	for _, c := range []struct {
		rate, burst, ceil string
		want              rate.Limit
	}{
		{"0", "0", "0", rate.Limit{}},
		{"none", "0", "0", rate.Limit{}},
		{"10MB/s", "0", "0", rate.Limit{Rate: 10_000_000}},
		{"100Mbit", "256KiB", "200mbps", rate.Limit{Rate: 12_500_000, Burst: 256 << 10, Ceil: 25_000_000}},
		{"2000000", "100000", "0", rate.Limit{Rate: 2_000_000, Burst: 100_000}},
	} {
		got, err := limitFlags("egress", c.rate, c.burst, c.ceil)
		if err != nil || got != c.want {
			t.Errorf("limitFlags(%q, %q, %q) = %+v, %v; want %+v", c.rate, c.burst, c.ceil, got, err, c.want)
		}
	}
	for _, c := range []struct {
		rate, burst, ceil string
		want              []string
	}{
		{"fast", "0", "0", []string{"--egress-rate-limit", `"fast"`, "10MB/s"}},
		{"-5MB/s", "0", "0", []string{"--egress-rate-limit", `"-5MB/s"`, "negative"}},
		{"10MB/s", "lots", "0", []string{"--egress-burst", `"lots"`}},
		{"10MB/s", "10Mbit", "0", []string{"--egress-burst", "unknown unit"}},
		{"10MB/s", "0", "1MB/s", []string{"--egress-ceil 1MB/s", "below the rate"}},
		{"0", "1MB", "0", []string{"--egress-burst and --egress-ceil need --egress-rate-limit"}},
		{"10", "0", "0", []string{"below the minimum"}},
	} {
		_, err := limitFlags("egress", c.rate, c.burst, c.ceil)
		if err == nil {
			t.Errorf("limitFlags(%q, %q, %q) succeeded", c.rate, c.burst, c.ceil)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("limitFlags(%q, %q, %q): %q does not say %q", c.rate, c.burst, c.ceil, err, w)
			}
		}
	}
	// parseFlags and config carry them into the lifecycle configuration
	o, err := parseFlags([]string{"--ephemeral-ports", "32768-49151", "--egress-rate-limit", "2MB/s", "--ingress-rate-limit", "100Mbit", "--ingress-ceil", "20MB/s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Egress != (rate.Limit{Rate: 2_000_000}) || cfg.Ingress != (rate.Limit{Rate: 12_500_000, Ceil: 20_000_000}) {
		t.Errorf("config limits: %+v %+v", cfg.Egress, cfg.Ingress)
	}
}

// startLimitServer is startServer with default limits and a host with a
// 1000 Mbit/s link and HTB.
func startLimitServer(t *testing.T, egress, ingress rate.Limit) (pbgrpc.IsolatorClient, *isolatortest.DataPlane) {
	t.Helper()
	dp := isolatortest.New()
	dp.Host.LinkSpeed = 1000
	dp.Host.Features = map[string]bool{plane.FeatureHTB: true}
	dp.Host.ShapingQueue = "bfifo"
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	iso, err := isolator.New(isolator.Config{
		ManagedPorts:  ephemeral.MustParseSet("31000-31999"),
		EphemeralPool: ephemeral.MustParseSet("32768-33791"),
		BlockSize:     256,
		StateDir:      filepath.Join(dir, "state"),
		Version:       "test",
		Logger:        log,
		Egress:        egress,
		Ingress:       ingress,
	}, dp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iso.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "run", "isolatord.sock")
	lis, err := listenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	gs, _ := newGRPCServer(iso, newUIDSet([]uint32{uint32(os.Getuid())}), log, metrics.New("test"), nil)
	go gs.Serve(lis)
	conn, err := api.Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		iso.Close()
	})
	return conn, dp
}

func TestLimitsOverGRPC(t *testing.T) {
	c, dp := startLimitServer(t, rate.Limit{Rate: 2_000_000}, rate.Limit{})
	ctx := context.Background()

	st, err := c.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetDefaultEgressLimit().GetRate() != 2_000_000 || st.GetDefaultIngressLimit() != nil || st.GetLinkSpeedMbps() != 1000 || st.GetShapingQueue() != "bfifo" {
		t.Errorf("status: %v", st)
	}

	// default egress, own ingress
	resp, err := c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "c1", IngressLimit: &pb.BandwidthLimit{Rate: 4_000_000, Ceil: 8_000_000}})
	if err != nil {
		t.Fatal(err)
	}
	ct := resp.GetContainer()
	if ct.GetEgressLimit().GetRate() != 2_000_000 || ct.GetIngressLimit().GetRate() != 4_000_000 || ct.GetIngressLimit().GetCeil() != 8_000_000 {
		t.Errorf("prepared container limits: egress %v ingress %v", ct.GetEgressLimit(), ct.GetIngressLimit())
	}
	// explicit none
	resp, err = c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "c2", EgressLimit: &pb.BandwidthLimit{}})
	if err != nil || resp.GetContainer().GetEgressLimit() != nil {
		t.Errorf("egress_limit {rate: 0}: %v %v", resp.GetContainer().GetEgressLimit(), err)
	}

	if _, err := c.Isolate(ctx, &pb.IsolateRequest{ContainerId: "c1", Target: &pb.IsolateRequest_Pid{Pid: int32(os.Getpid())}}); err != nil {
		t.Fatal(err)
	}
	if got := dp.Limits["c1"]; got[0].Rate != 2_000_000 || got[1].Rate != 4_000_000 {
		t.Errorf("data plane got %v", got)
	}

	// a limits-only Update keeps the ports; then Get and Usage show it
	if _, err := c.Update(ctx, &pb.UpdateRequest{ContainerId: "c1", Ports: []*pb.PortRange{pr(31000, 31000, false)}}); err != nil {
		t.Fatal(err)
	}
	up, err := c.Update(ctx, &pb.UpdateRequest{ContainerId: "c1", KeepPorts: true, EgressLimit: &pb.BandwidthLimit{Rate: 3_000_000, Burst: 300_000}, IngressLimit: &pb.BandwidthLimit{}})
	if err != nil {
		t.Fatal(err)
	}
	if g := up.GetContainer(); len(g.GetPorts()) != 1 || g.GetEgressLimit().GetRate() != 3_000_000 || g.GetEgressLimit().GetBurst() != 300_000 || g.GetIngressLimit() != nil {
		t.Errorf("after update: %v", g)
	}
	u, err := c.Usage(ctx, &pb.UsageRequest{ContainerId: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if e := u.GetEgressShaping(); e.GetLimit().GetRate() != 3_000_000 || !e.GetEnforced() || e.GetDrops() != 1 || e.GetOverlimits() != 5 || u.GetIngressShaping() != nil {
		t.Errorf("usage shaping: egress %v ingress %v", u.GetEgressShaping(), u.GetIngressShaping())
	}

	// bad values are refused naming the field
	for _, bad := range []struct {
		req  *pb.UpdateRequest
		code codes.Code
		msg  string
	}{
		{&pb.UpdateRequest{ContainerId: "c1", KeepPorts: true, EgressLimit: &pb.BandwidthLimit{Rate: -1}}, codes.InvalidArgument, "egress_limit.rate: -1 is negative"},
		{&pb.UpdateRequest{ContainerId: "c1", KeepPorts: true, IngressLimit: &pb.BandwidthLimit{Rate: 200_000_000}}, codes.InvalidArgument, "ingress_limit.rate: 200000000 bytes/s (200MB/s, 1.6Gbit/s) is above eth0's link speed of 1000 Mbit/s"},
		{&pb.UpdateRequest{ContainerId: "c1", KeepPorts: true, EgressLimit: &pb.BandwidthLimit{Rate: 2_000_000, Ceil: 1_000_000}}, codes.InvalidArgument, "egress_limit.ceil"},
		{&pb.UpdateRequest{ContainerId: "c1", KeepPorts: true, Ports: []*pb.PortRange{pr(31001, 31001, false)}}, codes.InvalidArgument, "keep_ports"},
	} {
		_, err := c.Update(ctx, bad.req)
		if status.Code(err) != bad.code || !strings.Contains(status.Convert(err).Message(), bad.msg) {
			t.Errorf("Update(%v): %v, want %v %q", bad.req, err, bad.code, bad.msg)
		}
	}
	_, err = c.Prepare(ctx, &pb.PrepareRequest{ContainerId: "c3", EgressLimit: &pb.BandwidthLimit{Rate: 10}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "egress_limit.rate") {
		t.Errorf("Prepare with 10 B/s: %v", err)
	}
	if g, err := c.Get(ctx, &pb.GetRequest{ContainerId: "c1"}); err != nil || g.GetContainer().GetEgressLimit().GetRate() != 3_000_000 {
		t.Errorf("Get after refused updates: %v %v", g.GetContainer().GetEgressLimit(), err)
	}
}
