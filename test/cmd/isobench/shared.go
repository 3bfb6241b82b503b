package main

// Shared ports. In S1, after the data-plane phase: 2 containers share one
// static port and 16 share another (each runs `isotraffic serve
// --reuseport`), and the TCP request/response rate to each shared port is
// measured against the exclusive port of case (b) in the same sandbox, in
// interleaved rounds like the data-plane cases. One request/response
// connection lands on one holder; what differs from (b) is the spread
// table on the host (one hash lookup and the bucket's node), so the ratio
// should be ~1 and not depend on the number of holders. The time of the
// Isolate call of each holder joining the 16-holder port is recorded too
// (it reads the current holders' sockets and moves ~1/(n+1) of the spread
// buckets, on eth0 and lo).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sort"
	"strconv"
	"time"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
)

// Ports of the shared-port cases (managed static ports no other phase uses).
const (
	sharedPort2  = 11010
	sharedPort16 = 11011
)

// Case names of the shared-port measurements.
const (
	sharedExclusive = "exclusive"
	shared2         = "shared2"
	shared16        = "shared16"
)

var sharedCases = []string{sharedExclusive, shared2, shared16}

// SharedPorts are the shared-port figures (see shared.go).
type SharedPorts struct {
	Holders map[string]int      `json:"holders"` // case -> containers holding its port
	Rates   map[string]*Rate    `json:"rates"`   // case -> TCP request/response, transactions/s
	Ratios  map[string]*float64 `json:"ratios"`  // "shared2/exclusive", "shared16/exclusive" (medians)
	// Isolate of a container joining a port that 1..15 containers hold.
	JoinIsolate *Latency `json:"join_isolate"`
	// Isolate of the first holder of the 16-holder port (makes the spread
	// tables on eth0 and lo).
	FirstIsolateMs *float64 `json:"first_isolate_ms"`
}

func newSharedPorts() *SharedPorts {
	s := &SharedPorts{Holders: map[string]int{sharedExclusive: 1, shared2: 2, shared16: 16}, Rates: map[string]*Rate{}, Ratios: map[string]*float64{}}
	for _, c := range sharedCases {
		s.Rates[c] = &Rate{Samples: []float64{}}
	}
	return s
}

// phaseShared runs the shared-port measurements in S1 and cleans its
// containers up again.
func (b *bench) phaseShared(ctx context.Context) error {
	s := newSharedPorts()
	b.res.Shared = s
	if b.c1 == nil || b.targets[caseB] == nil {
		return errors.New("no isolatord or no case (b) container in S1")
	}
	targets := map[string]*target{sharedExclusive: b.targets[caseB]}
	var ids []string
	defer func() {
		for _, id := range ids {
			if _, err := b.teardown(ctx, b.c1, id); err != nil {
				b.fail("shared ports: %v", err)
			}
		}
	}()
	var joins []time.Duration
	for _, c := range []struct {
		name    string
		port, n int
	}{{shared2, sharedPort2, 2}, {shared16, sharedPort16, 16}} {
		for i := 0; i < c.n; i++ {
			id := fmt.Sprintf("%s-h%d", c.name, i)
			ctr, err := b.sb1.Spawn(id, b.o.isotraffic, "serve", "--reuseport", "--tcp", ":"+strconv.Itoa(c.port), "--name", id)
			if err != nil {
				return err
			}
			if err := ctr.WaitOutput("ready", 10*time.Second); err != nil {
				return err
			}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err = b.c1.Prepare(cctx, &pb.PrepareRequest{ContainerId: id, Ports: []*pb.PortRange{{Begin: uint32(c.port), End: uint32(c.port), Shared: true}}})
			if err == nil {
				ids = append(ids, id)
				t0 := time.Now()
				_, err = b.c1.Isolate(cctx, &pb.IsolateRequest{ContainerId: id, Target: &pb.IsolateRequest_Pid{Pid: int32(ctr.Pid)}})
				took := time.Since(t0)
				switch {
				case c.name != shared16:
				case i == 0:
					s.FirstIsolateMs = ptr(float64(took) / 1e6)
				default:
					joins = append(joins, took)
				}
			}
			cancel()
			if err != nil {
				return fmt.Errorf("holder %s: %w", id, err)
			}
		}
		targets[c.name] = &target{client: b.sb1.Client, addr: net.JoinHostPort(sandbox.HostIP.String(), strconv.Itoa(c.port))}
	}
	s.JoinIsolate = summarize(joins)
	b.logf("shared ports: %d and %d holders set up; joining isolate %s", 2, 16, fmtMs(s.JoinIsolate))

	// Warm up, then interleaved rounds.
	for _, c := range sharedCases {
		if _, err := b.measure(ctx, metricRR, targets[c], 50*time.Millisecond); err != nil {
			return fmt.Errorf("%s: warm-up: %w", c, err)
		}
	}
	for r := 0; r < b.o.rounds; r++ {
		for k := range sharedCases {
			c := sharedCases[(k+r)%len(sharedCases)]
			if ctx.Err() != nil {
				return ctx.Err()
			}
			v, err := b.measure(ctx, metricRR, targets[c], b.o.dur)
			if err != nil {
				return fmt.Errorf("%s round %d: %w", c, r+1, err)
			}
			s.Rates[c].Samples = append(s.Rates[c].Samples, v)
		}
	}
	for _, c := range sharedCases {
		rt := s.Rates[c]
		rt.Median = median(rt.Samples)
		if len(rt.Samples) > 0 && rt.Median != nil && *rt.Median > 0 {
			xs := append([]float64(nil), rt.Samples...)
			sort.Float64s(xs)
			rt.Best = ptr(xs[len(xs)-1])
			q := func(p float64) float64 { return xs[int(math.Round(p*float64(len(xs)-1)))] }
			rt.Spread = ptr((q(0.75) - q(0.25)) / *rt.Median)
		}
	}
	for _, c := range []string{shared2, shared16} {
		s.Ratios[c+"/"+sharedExclusive] = ratio(s.Rates[c].Median, s.Rates[sharedExclusive].Median)
	}
	b.logf("shared ports: r/r exclusive %s, 2 holders %s, 16 holders %s", fmtRate(metricRR, s.Rates[sharedExclusive].Median),
		fmtRate(metricRR, s.Rates[shared2].Median), fmtRate(metricRR, s.Rates[shared16].Median))
	return nil
}

// writeMarkdown prints the shared-port table (nothing if not measured).
func (s *SharedPorts) writeMarkdown(w io.Writer, rounds int, dur float64) {
	if s == nil {
		return
	}
	fmt.Fprintf(w, "\n**Shared ports** (SO_REUSEPORT across containers, in S1: TCP request/response to a port shared by 2 and by 16 containers vs the exclusive port of (b); median of %d interleaved rounds of %gs; in brackets the ratio to the exclusive port)\n\n", rounds, dur)
	fmt.Fprintln(w, "| Port | Holders | Request/response |")
	fmt.Fprintln(w, "|---|---|---|")
	label := map[string]string{sharedExclusive: "exclusive (b)", shared2: "shared", shared16: "shared"}
	for _, c := range sharedCases {
		rt := s.Rates[c]
		cell := fmtRate(metricRR, rt.Median)
		if rt.Spread != nil {
			cell += fmt.Sprintf(" ±%.0f%%", *rt.Spread*50)
		}
		if v := s.Ratios[c+"/"+sharedExclusive]; v != nil {
			cell += fmt.Sprintf(" (%.2f)", *v)
		}
		fmt.Fprintf(w, "| %s | %d | %s |\n", label[c], s.Holders[c], cell)
	}
	join := "n/a"
	if s.JoinIsolate != nil {
		join = fmtMs(s.JoinIsolate)
	}
	first := "n/a"
	if s.FirstIsolateMs != nil {
		first = fmtNum(*s.FirstIsolateMs) + " ms"
	}
	fmt.Fprintf(w, "\nIsolate of a container joining a shared port held by 1-15 others: %s; of the first holder (creates the port's spread tables): %s.\n", join, first)
}
