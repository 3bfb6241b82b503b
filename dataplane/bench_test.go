package dataplane

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/test/traffic"
)

// BenchmarkDataPlane measures, in one sandbox, with 1 and then with 1,000
// containers plumbed:
//
//   - SetupTeardown: Setup and Teardown of one more container (in a fresh
//     namespace made outside the timer), reported as setup-ms/op and
//     teardown-ms/op, plus the mean time of each Setup step (step-*-ms);
//   - SetupTeardownSerial: the same with Setup's host and container chains
//     run one after the other (what running them concurrently gains, and
//     the CPU time of each of their steps);
//   - TCP_RR_container: one-byte TCP request/response round trips from the
//     client to a server in the last-added container (through the host eth0
//     demux and the veth), reported as rr/s;
//   - TCP_RR_host: the same against a server in the host namespace itself
//     (its port belongs to no container: the demux misses).
//
// Fleet containers are anonymous namespaces without processes, plumbed
// like any other (veth, mount, filters, configuration).
func BenchmarkDataPlane(b *testing.B) {
	e := newEnv(b)
	serveIn(b, e.sb.Host, "0.0.0.0:8000", "host")

	phase := func(n int, server plane.Container) {
		b.Run(fmt.Sprintf("containers=%d/SetupTeardown", n), func(b *testing.B) { e.benchSetupTeardown(b) })
		b.Run(fmt.Sprintf("containers=%d/SetupTeardownSerial", n), func(b *testing.B) {
			e.d.serialSetup = true
			defer func() { e.d.serialSetup = false }()
			e.benchSetupTeardown(b)
		})
		b.Run(fmt.Sprintf("containers=%d/TCP_RR_container", n), func(b *testing.B) {
			benchRR(b, e, hostAddr(int(server.Ports.Ranges()[0].Begin)))
		})
		b.Run(fmt.Sprintf("containers=%d/TCP_RR_host", n), func(b *testing.B) { benchRR(b, e, hostAddr(8000)) })
	}

	first := e.serverContainer(0)
	phase(1, first)
	e.addFleet(1, 998)
	last := e.serverContainer(999)
	phase(1000, last)
}

// serverContainer plumbs fleet container i with a TCP/UDP echo server on
// its static port, run by this process inside the namespace.
func (e *env) serverContainer(i int) plane.Container {
	e.t.Helper()
	ns, err := nshandle.New()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { ns.Close() })
	c := fleetSpec(e.uniqueID(fmt.Sprintf("srv%d", i)), ns, uint16(i+1), i)
	port := int(c.Ports.Ranges()[0].Begin)
	serveIn(e.t, ns, fmt.Sprintf("0.0.0.0:%d", port), "srv")
	e.setup(c)
	// warm up the path (ARP, neighbour entries)
	if got, err := echo(e.sb.Client, "tcp", hostAddr(port)); err != nil || got != "srv" {
		e.t.Fatalf("server container %d: %q %v", i, got, err)
	}
	return c
}

func (e *env) benchSetupTeardown(b *testing.B) {
	ctx := context.Background()
	var setup, teardown, setupCPU, teardownCPU time.Duration
	// Each step's time is counted from the end of the step before it in
	// its chain; Setup's concurrent chains ("host", "container") start at
	// the end of the last step outside them. Their steps' CPU time is the
	// whole process's, so it is reported only when they run one after the
	// other (serialSetup); "chains" is the whole of both, wall and CPU.
	steps, stepsCPU := map[string]time.Duration{}, map[string]time.Duration{}
	var mu sync.Mutex
	last, lastCPU := map[string]time.Duration{}, map[string]time.Duration{}
	mark := func(chain, s string) {
		if e.d.serialSetup {
			chain = "" // one step after the other
		}
		mu.Lock()
		defer mu.Unlock()
		now, cpu := time.Duration(time.Now().UnixNano()), processCPU(b)
		steps[s] += now - last[chain]
		stepsCPU[s] += cpu - lastCPU[chain]
		last[chain], lastCPU[chain] = now, cpu
		if chain == "" {
			for _, c := range []string{"host", "container"} {
				last[c], lastCPU[c] = now, cpu
			}
		}
	}
	chainStep := map[string]bool{}
	e.d.trace = func(chain, s string) {
		if chain != "" {
			mu.Lock()
			chainStep[s] = true
			mu.Unlock()
		}
		mark(chain, s)
	}
	defer func() { e.d.trace = nil }()
	// Namespaces are closed after the loop: destroying one is asynchronous
	// kernel work (cleanup_net) that would otherwise overlap the next Setup.
	var nss []*nshandle.NS
	defer func() {
		for _, ns := range nss {
			ns.Close()
		}
	}()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ns, err := nshandle.New()
		if err != nil {
			b.Fatal(err)
		}
		nss = append(nss, ns)
		k := 1000 + i%500 // fleet indexes kept free for this
		c := fleetSpec(e.uniqueID("bench"), ns, uint16(k+1), k)
		b.StartTimer()

		mark("", "start")
		t0, c0 := last[""], lastCPU[""]
		if _, err := e.d.Setup(ctx, c); err != nil {
			b.Fatal(err)
		}
		mark("", "index")
		t1, c1 := last[""], lastCPU[""]
		if _, err := e.d.Teardown(ctx, c); err != nil {
			b.Fatal(err)
		}
		mark("", "teardown mount")
		setup += t1 - t0
		teardown += last[""] - t1
		setupCPU += c1 - c0
		teardownCPU += lastCPU[""] - c1
	}
	b.StopTimer()
	delete(steps, "start")
	delete(stepsCPU, "start")
	ms := func(d time.Duration) float64 { return float64(d) / float64(b.N) / 1e6 }
	b.ReportMetric(ms(setup), "setup-ms/op")
	b.ReportMetric(ms(teardown), "teardown-ms/op")
	// CPU time of the whole process (user and system, every thread: the
	// kernel work of each step and the background deletions) tells the
	// work apart from waiting for a CPU on a loaded machine.
	b.ReportMetric(ms(setupCPU), "setup-cpu-ms/op")
	b.ReportMetric(ms(teardownCPU), "teardown-cpu-ms/op")
	for s, d := range steps {
		b.ReportMetric(ms(d), "step-"+strings.ReplaceAll(s, " ", "_")+"-ms/op")
		if !chainStep[s] || e.d.serialSetup {
			b.ReportMetric(ms(stepsCPU[s]), "cpu-"+strings.ReplaceAll(s, " ", "_")+"-ms/op")
		}
	}
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// benchRR runs 300 ms request/response windows from the client to addr and
// reports the mean rate.
func benchRR(b *testing.B, e *env, addr string) {
	var sum float64
	n := 0
	for b.Loop() {
		var rate float64
		err := e.sb.Client.Do(func() (err error) {
			rate, err = traffic.RequestResponse(context.Background(), "tcp", addr, 300*time.Millisecond)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		sum += rate
		n++
	}
	b.ReportMetric(sum/float64(n), "rr/s")
}
