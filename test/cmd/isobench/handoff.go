package main

// Handoff. In S1, after the shared-port phase: container A holds port
// handoffPortB exclusively with handoffFlows live TCP connections open
// from the client; B is prepared as A's successor and isolated. Figures:
// the time from B's Isolate call to the first new connection answered by
// B, the flows A keeps (its pins), and the TCP connect rate (a new
// connection per request: SYNs are new flows) to the handed-over port,
// steered by its spread table with the pins of A's live flows in it,
// against the exclusive port of case (b), in interleaved rounds (ratio
// target >= 0.9: new-flow steering does not walk the pins).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

const (
	handoffPortB = 11012
	handoffFlows = 1000
)

// Handoff are the handoff figures (see handoff.go).
type Handoff struct {
	LiveFlows   int              `json:"live_flows"`   // connections open to A
	PinnedFlows *int             `json:"pinned_flows"` // A's live flows on the port after the handoff (its pins)
	FirstAtBMs  *float64         `json:"first_new_flow_at_b_ms"`
	IsolateMs   *float64         `json:"successor_isolate_ms"`
	Rates       map[string]*Rate `json:"rates"`    // "exclusive", "handoff": TCP connections/s
	Ratio       *float64         `json:"ratio"`    // handoff / exclusive (medians)
	NewAtA      int              `json:"new_at_a"` // of the rate measurement's check connections
}

// phaseHandoff runs the handoff measurement in S1 and cleans up.
func (b *bench) phaseHandoff(ctx context.Context) error {
	h := &Handoff{Rates: map[string]*Rate{"exclusive": {Samples: []float64{}}, "handoff": {Samples: []float64{}}}}
	b.res.Handoff = h
	if b.c1 == nil || b.targets[caseB] == nil {
		return errors.New("no isolatord or no case (b) container in S1")
	}
	var ids []string
	defer func() {
		for i := len(ids) - 1; i >= 0; i-- {
			if _, err := b.teardown(ctx, b.c1, ids[i]); err != nil {
				b.fail("handoff: %v", err)
			}
		}
	}()
	start := func(id string, req *pb.PrepareRequest) (*sandbox.Container, error) {
		ctr, err := b.sb1.Spawn(id, b.o.isotraffic, "serve", "--reuseport", "--tcp", ":"+strconv.Itoa(handoffPortB), "--name", id)
		if err != nil {
			return nil, err
		}
		if err := ctr.WaitOutput("ready", 10*time.Second); err != nil {
			return nil, err
		}
		req.ContainerId = id
		req.Ports = []*pb.PortRange{{Begin: handoffPortB, End: handoffPortB}}
		if _, err := b.c1.Prepare(ctx, req); err != nil {
			return nil, fmt.Errorf("prepare %s: %w", id, err)
		}
		ids = append(ids, id)
		return ctr, nil
	}
	a, err := start("handoff-a", &pb.PrepareRequest{})
	if err != nil {
		return err
	}
	if _, err := b.c1.Isolate(ctx, &pb.IsolateRequest{ContainerId: "handoff-a", Target: &pb.IsolateRequest_Pid{Pid: int32(a.Pid)}}); err != nil {
		return err
	}
	addr := net.JoinHostPort(sandbox.HostIP.String(), strconv.Itoa(handoffPortB))
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	err = b.sb1.Client.Do(func() error {
		for range handoffFlows {
			c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	})
	h.LiveFlows = len(conns)
	if err != nil {
		return fmt.Errorf("%d live flows to A: %w", len(conns), err)
	}
	bc, err := start("handoff-b", &pb.PrepareRequest{HandoffFrom: "handoff-a", HandoffPorts: []uint32{handoffPortB}})
	if err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := b.c1.Isolate(ctx, &pb.IsolateRequest{ContainerId: "handoff-b", Target: &pb.IsolateRequest_Pid{Pid: int32(bc.Pid)}}); err != nil {
		return err
	}
	h.IsolateMs = ptr(float64(time.Since(t0)) / 1e6)
	for i := 0; i < 200 && h.FirstAtBMs == nil; i++ {
		var reply string
		if err := b.sb1.Client.Do(func() (err error) {
			reply, err = traffic.Echo(ctx, "tcp", addr, "hi", traffic.WithTimeout(2*time.Second))
			return err
		}); err == nil && traffic.ReplyName(reply) == "handoff-b" {
			h.FirstAtBMs = ptr(float64(time.Since(t0)) / 1e6)
		}
	}
	if g, err := b.c1.Get(ctx, &pb.GetRequest{ContainerId: "handoff-a"}); err == nil {
		for _, d := range g.GetContainer().GetDraining() {
			h.PinnedFlows = ptr(int(d.GetLiveFlows()))
		}
	}
	targets := map[string]*target{"exclusive": b.targets[caseB], "handoff": {client: b.sb1.Client, addr: addr, name: "handoff-b"}}
	order := []string{"exclusive", "handoff"}
	for _, c := range order {
		if _, err := b.measure(ctx, metricCRR, targets[c], 50*time.Millisecond); err != nil {
			return fmt.Errorf("%s: warm-up: %w", c, err)
		}
	}
	for r := 0; r < b.o.rounds; r++ {
		for k := range order {
			c := order[(k+r)%len(order)]
			v, err := b.measure(ctx, metricCRR, targets[c], b.o.dur)
			if err != nil {
				return fmt.Errorf("%s round %d: %w", c, r+1, err)
			}
			h.Rates[c].Samples = append(h.Rates[c].Samples, v)
		}
	}
	for _, rt := range h.Rates {
		rt.Median = median(rt.Samples)
	}
	h.Ratio = ratio(h.Rates["handoff"].Median, h.Rates["exclusive"].Median)
	for range 20 {
		var reply string
		if err := b.sb1.Client.Do(func() (err error) {
			reply, err = traffic.Echo(ctx, "tcp", addr, "hi", traffic.WithTimeout(2*time.Second))
			return err
		}); err == nil && traffic.ReplyName(reply) == "handoff-a" {
			h.NewAtA++
		}
	}
	b.logf("handoff: first new flow at B %s ms after the isolate call, connect rate %s vs exclusive %s",
		fmtNumPtr(h.FirstAtBMs), fmtRate(metricCRR, h.Rates["handoff"].Median), fmtRate(metricCRR, h.Rates["exclusive"].Median))
	return nil
}

func fmtNumPtr(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmtNum(*v)
}

// writeMarkdown prints the handoff table (nothing if not measured).
func (h *Handoff) writeMarkdown(w io.Writer, rounds int, dur float64) {
	if h == nil {
		return
	}
	pinned := "n/a"
	if h.PinnedFlows != nil {
		pinned = strconv.Itoa(*h.PinnedFlows)
	}
	fmt.Fprintf(w, "\n**Port handoff** (in S1: A holds a port with %d live TCP connections, B is isolated as its successor; TCP connect rate to the port, A's flows pinned, vs the exclusive port of (b); median of %d interleaved rounds of %gs)\n\n", h.LiveFlows, rounds, dur)
	fmt.Fprintln(w, "| Port | Connections/s | Ratio (target >= 0.9) |")
	fmt.Fprintln(w, "|---|---|---|")
	fmt.Fprintf(w, "| exclusive (b) | %s | |\n", fmtRate(metricCRR, h.Rates["exclusive"].Median))
	verdict := "n/a"
	if h.Ratio != nil {
		verdict = fmt.Sprintf("%.2f %s", *h.Ratio, passMiss(*h.Ratio >= 0.9))
	}
	fmt.Fprintf(w, "| handed over (%s of A's flows pinned) | %s | %s |\n", pinned, fmtRate(metricCRR, h.Rates["handoff"].Median), verdict)
	fmt.Fprintf(w, "\nFrom B's Isolate call to the first new connection answered by B: %s ms (the Isolate call itself: %s ms); new connections at A afterwards: %d of 20.\n",
		fmtNumPtr(h.FirstAtBMs), fmtNumPtr(h.IsolateMs), h.NewAtA)
}

func passMiss(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}
