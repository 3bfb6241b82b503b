package e2e

import (
	"context"
	"errors"
	"net"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// Drain and handoff end to end, through the built daemon, isolatorctl and
// the gRPC client (docs/handoff.md).

const (
	handoffPort = 31700
	drainPort   = 31710
)

// newConns makes n new TCP connections to port from client source ports
// first, first+1, ... and counts who answered; errors (resets, refusals,
// timeouts) are counted under "error".
func newConns(sb *sandbox.Sandbox, port, first, n int) map[string]int {
	got := map[string]int{}
	addr := net.JoinHostPort(sb.HostIP.String(), strconv.Itoa(port))
	for i := range n {
		var reply string
		err := sb.Client.Do(func() (err error) {
			reply, err = traffic.Echo(context.Background(), "tcp", addr, "new",
				traffic.WithSource(clientHost+":"+strconv.Itoa(first+i)), traffic.WithTimeout(2*time.Second))
			return err
		})
		if err != nil {
			got["error"]++
			continue
		}
		got[traffic.ReplyName(reply)]++
	}
	return got
}

// drainMarkers counts the drain marker nodes (node ids 900-90f of spread
// tables) on the sandbox host's eth0.
var markerRE = regexp.MustCompile(`fh [2-7][0-9a-f]{2}:[0-9a-f]+:90[0-9a-f] `)

func drainMarkers(t *testing.T, sb *sandbox.Sandbox) int {
	return len(markerRE.FindAllString(sb.Host.Run(t, "tc", "filter", "show", "dev", "eth0", "ingress"), -1))
}

// spreadSlots lists the slots (flowid 1:X) of the nodes of spread tables
// on the sandbox host's eth0.
var spreadFlowRE = regexp.MustCompile(`fh [2-7][0-9a-f]{2}:[0-9a-f]+:[0-9a-f]+ .*flowid 1:([0-9a-f]+)`)

func spreadSlots(t *testing.T, sb *sandbox.Sandbox) map[string]bool {
	out := map[string]bool{}
	for _, m := range spreadFlowRE.FindAllStringSubmatch(sb.Host.Run(t, "tc", "filter", "show", "dev", "eth0", "ingress"), -1) {
		out[m[1]] = true
	}
	return out
}

func liveFlowsOf(t *testing.T, d *Daemon, id string, port int) (int, bool) {
	t.Helper()
	resp, err := d.Client.Get(context.Background(), &pb.GetRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, dp := range resp.GetContainer().GetDraining() {
		if int(dp.GetPort()) == port {
			return int(dp.GetLiveFlows()), true
		}
	}
	return 0, false
}

// TestHandoff: A serves port P exclusively with 40 long-lived TCP
// connections and a UDP flow. Bad handoffs and drains are refused and
// change nothing. B is prepared as A's successor: nothing moves until B is
// isolated, and an isolate of B that fails leaves A serving everything.
// Once B is isolated, every old flow stays with A and every new
// connection reaches B (0 at A, 0 errors), through a kill -9 of the
// daemon and its restart (the kernel's markers say who drains). A's flows
// end, A is cleaned up: B holds the port alone, nothing of A is left.
func TestHandoff(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	ctx := context.Background()
	id := func(n string) string { return sb.Name + "-" + n }
	P := strconv.Itoa(handoffPort)
	pa := startSharedServer(t, sb, "A", handoffPort)
	pb2 := startSharedServer(t, sb, "B", handoffPort)
	d.Ctl(t, "prepare", id("A"), "--ports", P)
	d.Ctl(t, "isolate", id("A"), "--pid", strconv.Itoa(pa.Pid))

	var flows []*traffic.Flow
	for i := range 40 {
		f := openFlow(t, sb, handoffPort, 20000+7*i)
		if f.Name != "A" {
			t.Fatalf("connection %d answered by %q", i, f.Name)
		}
		flows = append(flows, f)
	}
	udp := traffic.OpenUDPFlow(t, pa.Do, sb.Client.Do, "A", sb.HostIP, net.ParseIP(clientHost), handoffPort, 23456)
	if got, err := udp.Ask(); err != nil || got != "A" {
		t.Fatalf("UDP flow answered by %q (%v)", got, err)
	}
	checkA := func(when string) {
		t.Helper()
		for _, f := range flows {
			if got, err := f.Ask("still"); err != nil || got != "A" {
				t.Fatalf("%s: connection from port %d answered by %q (%v), want A", when, f.Src, got, err)
			}
		}
		if got, err := udp.Ask(); err != nil || got != "A" {
			t.Fatalf("%s: UDP flow answered by %q (%v), want A", when, got, err)
		}
	}

	t.Run("bad input", func(t *testing.T) {
		before, _ := d.Client.Get(ctx, &pb.GetRequest{ContainerId: id("A")})
		// successor of a port nobody holds
		_, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id("X"), Ports: []*pb.PortRange{{Begin: 31701, End: 31701}},
			HandoffFrom: id("A"), HandoffPorts: []uint32{31701}})
		grpcErr(t, err, codes.FailedPrecondition, "handoff_ports", "31701", "nobody")
		// a port the successor did not ask for
		_, err = d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id("X"), Ports: []*pb.PortRange{{Begin: 31702, End: 31702}},
			HandoffFrom: id("A"), HandoffPorts: []uint32{handoffPort}})
		grpcErr(t, err, codes.InvalidArgument, "handoff_ports", P)
		// an unknown predecessor
		_, err = d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id("X"), Ports: []*pb.PortRange{{Begin: handoffPort, End: handoffPort}},
			HandoffFrom: id("nobody"), HandoffPorts: []uint32{handoffPort}})
		grpcErr(t, err, codes.InvalidArgument, "handoff_from", id("nobody"))
		// a drain of a port the container does not hold
		_, err = d.Client.Drain(ctx, &pb.DrainRequest{ContainerId: id("A"), Ports: []uint32{31703}})
		grpcErr(t, err, codes.InvalidArgument, "ports", "31703", "nobody")
		_, errOut, cerr := d.CtlResult("drain", id("A"), "--port", "31703")
		if cerr == nil || !strings.Contains(errOut, "InvalidArgument") {
			t.Errorf("isolatorctl drain of a port not held: %v %s", cerr, errOut)
		}
		after, _ := d.Client.Get(ctx, &pb.GetRequest{ContainerId: id("A")})
		if before.String() != after.String() {
			t.Errorf("bad input changed A:\n%v\n%v", before, after)
		}
		if _, err := d.Client.Get(ctx, &pb.GetRequest{ContainerId: id("X")}); err == nil {
			t.Error("a refused prepare left container X")
		}
	})

	// B, A's successor: the port is reserved for both, nothing moves yet.
	_, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id("B"), Ports: []*pb.PortRange{{Begin: handoffPort, End: handoffPort}},
		HandoffFrom: id("A"), HandoffPorts: []uint32{handoffPort}})
	if err != nil {
		t.Fatal(err)
	}
	if got := newConns(sb, handoffPort, 40000, 20); got["A"] != 20 {
		t.Fatalf("new connections with B prepared, not isolated: %v, want all at A", got)
	}
	// An isolate of B that fails (the host's own namespace) leaves A serving.
	_, errOut, cerr := d.CtlResult("isolate", id("B"), "--pid", strconv.Itoa(d.Pid()))
	if cerr == nil || !strings.Contains(errOut, "FailedPrecondition") {
		t.Fatalf("isolate of B into the host namespace: %v %s", cerr, errOut)
	}
	if got := newConns(sb, handoffPort, 40100, 20); got["A"] != 20 {
		t.Fatalf("new connections after B's failed isolate: %v, want all at A", got)
	}
	if _, draining := liveFlowsOf(t, d, id("A"), handoffPort); draining {
		t.Fatal("A drains after B's failed isolate")
	}
	checkA("after B's failed isolate")

	// The handoff: B is isolated, A drains.
	start := time.Now()
	d.Ctl(t, "isolate", id("B"), "--pid", strconv.Itoa(pb2.Pid))
	var firstAtB time.Duration
	for i := range 100 {
		if got := newConns(sb, handoffPort, 41000+i, 1); got["B"] == 1 {
			firstAtB = time.Since(start)
			break
		}
	}
	t.Logf("handoff: first new connection at B %v after the isolate call", firstAtB)
	got := newConns(sb, handoffPort, 42000, 100)
	if got["B"] != 100 {
		t.Fatalf("new connections after the handoff: %v, want 100 at B, 0 at A, 0 errors", got)
	}
	checkA("after the handoff")
	if n, ok := liveFlowsOf(t, d, id("A"), handoffPort); !ok || n < 41 {
		t.Fatalf("A: draining %v with %d live flows, want >= 41", ok, n)
	}
	if out := d.Ctl(t, "list"); !strings.Contains(out, "(draining "+P+":") {
		t.Errorf("list does not show A draining:\n%s", out)
	}
	if drainMarkers(t, sb) != 1 {
		t.Errorf("%d drain markers on eth0, want 1", drainMarkers(t, sb))
	}
	if n := len(spreadSlots(t, sb)); n != 2 {
		t.Errorf("the spread table steers to %d slots, want A's pins and B's buckets", n)
	}

	// kill -9 mid-drain: traffic keeps its course while the daemon is down
	// and after its restart, which reads who drains from the kernel.
	d.Kill()
	if got := newConns(sb, handoffPort, 43000, 20); got["B"] != 20 {
		t.Fatalf("new connections with the daemon down: %v", got)
	}
	d.Start()
	checkA("after a restart mid-drain")
	if got := newConns(sb, handoffPort, 43100, 50); got["B"] != 50 {
		t.Fatalf("new connections after the restart: %v, want all at B", got)
	}
	if n, ok := liveFlowsOf(t, d, id("A"), handoffPort); !ok || n < 41 {
		t.Fatalf("after the restart: A draining %v with %d live flows", ok, n)
	}

	// A's flows end; `drain --wait` returns once the reconciler has
	// dropped their pins.
	for _, f := range flows {
		f.Close()
	}
	udp.Close()
	d.Ctl(t, "--timeout", "90s", "drain", id("A"), "--port", P, "--wait")
	if n, ok := liveFlowsOf(t, d, id("A"), handoffPort); !ok || n != 0 {
		t.Fatalf("after drain --wait: draining %v, %d flows", ok, n)
	}
	d.Ctl(t, "cleanup", id("A"))
	if drainMarkers(t, sb) != 0 || pinNodes(t, sb) != 0 {
		t.Errorf("after A's cleanup: %d markers, %d pins on eth0", drainMarkers(t, sb), pinNodes(t, sb))
	}
	if got := newConns(sb, handoffPort, 44000, 30); got["B"] != 30 {
		t.Fatalf("new connections after A's cleanup: %v", got)
	}
	resp, err := d.Client.Get(ctx, &pb.GetRequest{ContainerId: id("B")})
	if err != nil || resp.GetContainer().GetHandoffFrom() != "" {
		t.Fatalf("B after the handoff: %v %v", resp, err)
	}
	// B asked for the port exclusively: it holds it so again, and a third
	// container cannot join it.
	if ps := resp.GetContainer().GetPorts(); len(ps) != 1 || ps[0].GetShared() || ps[0].GetBegin() != handoffPort {
		t.Errorf("B's ports after A's cleanup: %v, want %d exclusive", ps, handoffPort)
	}
	_, err = d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id("Y"), Ports: []*pb.PortRange{{Begin: handoffPort, End: handoffPort, Shared: true}}})
	grpcErr(t, err, codes.FailedPrecondition, id("B"))
	if got := newConns(sb, handoffPort, 44100, 20); got["B"] != 20 {
		t.Fatalf("new connections with B holding the port exclusively again: %v", got)
	}
	if len(spreadSlots(t, sb)) != 0 {
		t.Errorf("a spread table is left for the port: %v", spreadSlots(t, sb))
	}
}

// TestDrainSharedThreeHolders: three holders share a port; one drains.
// Its connections survive, no new connection reaches it, the other two
// share the new ones; undo brings it back.
func TestDrainSharedThreeHolders(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	id := func(n string) string { return sb.Name + "-" + n }
	P := strconv.Itoa(drainPort)
	for _, n := range []string{"s1", "s2", "s3"} {
		p := startSharedServer(t, sb, n, drainPort)
		d.Ctl(t, "prepare", id(n), "--shared-ports", P)
		d.Ctl(t, "isolate", id(n), "--pid", strconv.Itoa(p.Pid))
	}
	var flows []*traffic.Flow
	count := map[string]int{}
	for i := range 60 {
		f := openFlow(t, sb, drainPort, 20000+7*i)
		flows = append(flows, f)
		count[f.Name]++
	}
	if count["s2"] == 0 {
		t.Fatalf("no connection reached s2: %v", count)
	}
	out := d.Ctl(t, "drain", id("s2"), "--port", P)
	if !strings.Contains(out, "Draining:") {
		t.Errorf("drain output does not show the drain:\n%s", out)
	}
	for _, f := range flows {
		if got, err := f.Ask("still"); err != nil || got != f.Name {
			t.Errorf("connection from %d answered by %q (%v), was %q", f.Src, got, err, f.Name)
		}
	}
	got := newConns(sb, drainPort, 40000, 120)
	if got["s2"] != 0 || got["error"] != 0 || got["s1"] < 20 || got["s3"] < 20 {
		t.Fatalf("new connections with s2 draining: %v", got)
	}
	if n, ok := liveFlowsOf(t, d, id("s2"), drainPort); !ok || n < count["s2"] {
		t.Errorf("s2 draining %v with %d live flows, want >= %d", ok, n, count["s2"])
	}
	d.Ctl(t, "drain", id("s2"), "--port", P, "--undo")
	if got := newConns(sb, drainPort, 41000, 120); got["s2"] == 0 || got["error"] != 0 {
		t.Errorf("new connections after undo: %v", got)
	}
	for _, f := range flows {
		if got, err := f.Ask("still"); err != nil || got != f.Name {
			t.Errorf("after undo: connection from %d answered by %q (%v), was %q", f.Src, got, err, f.Name)
		}
	}
}

// TestDrainAloneRefuses: the one holder of a port drains with no
// successor: new connections are refused (a reset from the host, as at a
// closed port) while its own connection keeps working; the drain survives
// a kill -9 of the daemon (the container stays isolated, still draining);
// undo serves new connections again.
func TestDrainAloneRefuses(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	const port = 31730
	P := strconv.Itoa(port)
	id := sb.Name + "-solo"
	p := startSharedServer(t, sb, "solo", port)
	d.Ctl(t, "prepare", id, "--ports", P)
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(p.Pid))
	f := openFlow(t, sb, port, 20001)
	d.Ctl(t, "drain", id, "--port", P)
	refused := func(when string) {
		t.Helper()
		addr := net.JoinHostPort(sb.HostIP.String(), P)
		err := sb.Client.Do(func() error {
			_, err := traffic.Echo(context.Background(), "tcp", addr, "new", traffic.WithTimeout(2*time.Second))
			return err
		})
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: a new connection to a port whose one holder drains: %v, want connection refused", when, err)
		}
	}
	refused("draining")
	if got, err := f.Ask("still"); err != nil || got != "solo" {
		t.Fatalf("the drainer's own connection: %q, %v", got, err)
	}
	f.Close()
	d.Ctl(t, "--timeout", "90s", "drain", id, "--port", P, "--wait")
	d.Kill()
	d.Start()
	var got ctlContainer
	d.CtlJSON(t, &got, "get", id)
	if got.State != "isolated" {
		t.Fatalf("after kill -9 and restart: %+v\n%s", got, d.Log())
	}
	if n, ok := liveFlowsOf(t, d, id, port); !ok || n != 0 {
		t.Fatalf("after the restart: draining %v, %d flows", ok, n)
	}
	refused("after the restart")
	d.Ctl(t, "drain", id, "--port", P, "--undo")
	mustEcho(t, sb, "tcp", port, "solo")
}

// TestDrainDeadline: a drain with a deadline cuts the drainer's flows
// left once it passes (their packets then go to the other holder, which
// resets them), and not before.
func TestDrainDeadline(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	const port = 31740
	P := strconv.Itoa(port)
	id := func(n string) string { return sb.Name + "-" + n }
	for _, n := range []string{"d1", "d2"} {
		p := startSharedServer(t, sb, n, port)
		d.Ctl(t, "prepare", id(n), "--shared-ports", P)
		d.Ctl(t, "isolate", id(n), "--pid", strconv.Itoa(p.Pid))
	}
	var mine []*traffic.Flow
	for i := 0; i < 64 && len(mine) < 3; i++ {
		if f := openFlow(t, sb, port, 20000+7*i); f.Name == "d1" {
			mine = append(mine, f)
		}
	}
	if len(mine) == 0 {
		t.Fatal("no connection reached d1")
	}
	start := time.Now()
	d.Ctl(t, "drain", id("d1"), "--port", P, "--deadline", "3s")
	for _, f := range mine {
		if got, err := f.Ask("still"); err != nil || got != "d1" {
			if time.Since(start) < 3*time.Second {
				t.Fatalf("before the deadline: d1's connection from %d answered by %q (%v)", f.Src, got, err)
			}
		}
	}
	// Well within the 30 s an idle flow keeps its pin (SharedIdle): only
	// the deadline's cut can empty them this soon.
	wait.For(t, 15*time.Second, "d1's flows to be cut after the deadline", func() bool {
		n, ok := liveFlowsOf(t, d, id("d1"), port)
		return ok && n == 0
	})
	if since := time.Since(start); since < 3*time.Second {
		t.Fatalf("flows cut %v after the drain, before the 3 s deadline", since)
	}
	for _, f := range mine {
		if got, err := f.Ask("after"); err == nil {
			t.Errorf("d1's connection from %d still answered (by %q) after the deadline", f.Src, got)
		}
	}
	var got struct {
		Draining []struct {
			Port     int    `json:"port"`
			Deadline string `json:"deadline"`
		} `json:"draining"`
	}
	d.CtlJSON(t, &got, "get", id("d1"))
	if len(got.Draining) != 1 || got.Draining[0].Deadline == "" {
		t.Errorf("get does not show the drain's deadline: %+v", got)
	}
}
