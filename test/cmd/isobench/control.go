package main

// The "control" phase: the control plane the way runtimes drive it. Every
// container's network namespace is held by a real process (a `sleep` cloned
// into a fresh network namespace, isolated by pid, killed by pid at the end),
// every call goes through the real gRPC API of an isolatord running in its
// own sandbox (SC), and the figures are:
//
//   - setup (Prepare+Isolate) and teardown (Cleanup) latency of one more
//     container with P containers present, P from 0 to N (the curve drawn
//     in the SVG; P=0 and P=N are the "N=1" and "N present" figures);
//   - N containers set up one by one (the sum of the API calls);
//   - bursts: 100 setups at once, 100 teardowns at once, then the N
//     teardowns at once (a node drain), each timed from the first call to
//     the last answer, with Usage and Get of a probe container polled all
//     along (their p99 is the "reads never wait" figure);
//   - CNI ADD and DEL through libcni executing the isolator-cni binary
//     exactly as a runtime does, process start to result, with the N
//     containers present (before the drain).

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/test/sandbox"
)

// ControlScale are the figures of the control phase (nil: not measured).
type ControlScale struct {
	Namespaces string `json:"namespaces"`
	// Curve: one point per number of containers present.
	Curve []CurvePoint `json:"curve"`
	// One more container with none / N present.
	SetupN1    *Latency `json:"setup_n1"`
	TeardownN1 *Latency `json:"teardown_n1"`
	SetupNN    *Latency `json:"setup_nn"`
	TeardownNN *Latency `json:"teardown_nn"`
	SetupRatio *float64 `json:"setup_ratio"` // p50 at N over p50 at 1
	// N set up one by one: the sum of the API calls.
	SetupAllSeconds *float64 `json:"setup_all_seconds"`
	// Bursts: wall time from the first call to the last answer.
	BurstSetupSeconds    *float64 `json:"burst_setup_seconds"`    // BurstSize at once
	BurstTeardownSeconds *float64 `json:"burst_teardown_seconds"` // BurstSize at once
	DrainSeconds         *float64 `json:"drain_seconds"`          // N at once
	// From the drain's last answer until the kernel deleted its links
	// (background deletion, not a target).
	DrainDeletedSeconds *float64 `json:"drain_deleted_seconds"`
	// Time waited before the phase for the kernel to finish what the
	// earlier phases left it (links being deleted, namespaces being freed)
	// and whether the machine became quiet within the limit.
	SettleSeconds *float64 `json:"settle_seconds,omitempty"`
	Settled       bool     `json:"settled"`
	// Containers present while the CNI figures were taken.
	CNIPresent int `json:"cni_present"`
	BurstSize  int `json:"burst_size"`
	// Usage and Get of a probe container while the bursts ran.
	ReadsDuringBursts *Latency `json:"reads_during_bursts"`
	// The same, Usage and Get apart.
	UsageDuringBursts *Latency `json:"usage_during_bursts"`
	GetDuringBursts   *Latency `json:"get_during_bursts"`
	// Usage and Get of the probe container read meanwhile by a process of
	// its own, on its own connection (readprobe.go), together and apart.
	ReadsSeparate *Latency `json:"reads_separate,omitempty"`
	UsageSeparate *Latency `json:"usage_separate,omitempty"`
	GetSeparate   *Latency `json:"get_separate,omitempty"`
	// CNI through libcni (plugin process exec to result).
	CNIAdd *Latency `json:"cni_add"`
	CNIDel *Latency `json:"cni_del"`
	// Where the CNI time goes (cni.go): the plugin's process exec to a
	// VERSION result, and the daemon's share of ADD (Attach) and
	// DEL (Cleanup) called directly on an open connection.
	CNIExec   *Latency `json:"cni_exec,omitempty"`
	CNIAddRPC *Latency `json:"cni_add_rpc,omitempty"`
	CNIDelRPC *Latency `json:"cni_del_rpc,omitempty"`
	// `isolatorctl list` exec to answer (the CLI's start).
	CtlList *Latency `json:"ctl_list,omitempty"`
	// The same figures of an earlier build (--cni-before), in this run.
	CNIBefore *CNIBefore `json:"cni_before,omitempty"`
	// Where the SVG was written.
	SVG string `json:"svg,omitempty"`
}

// CurvePoint is setup/teardown latency with Present containers present.
type CurvePoint struct {
	Present  int      `json:"present"`
	Setup    *Latency `json:"setup"`
	Teardown *Latency `json:"teardown"`
}

// holders are processes each holding a fresh network namespace.
type holders struct {
	mu    sync.Mutex
	procs map[int]*exec.Cmd
}

// spawn starts `sleep` cloned into a new network namespace: the namespace
// exists when Start returns (it is made by clone, before exec).
func (h *holders) spawn() (int, error) {
	cmd := exec.Command("sleep", "100000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("holder process: %w", err)
	}
	h.mu.Lock()
	if h.procs == nil {
		h.procs = map[int]*exec.Cmd{}
	}
	h.procs[cmd.Process.Pid] = cmd
	h.mu.Unlock()
	return cmd.Process.Pid, nil
}

// spawnN starts n holders, two at a time (namespace creation is kernel work).
func (h *holders) spawnN(n int) ([]int, error) {
	pids := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				pids[i], errs[i] = h.spawn()
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return pids, errors.Join(errs...)
}

// kill ends one holder (by pid) and reaps it.
func (h *holders) kill(pid int) {
	h.mu.Lock()
	cmd := h.procs[pid]
	delete(h.procs, pid)
	h.mu.Unlock()
	if cmd != nil {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// close kills every holder left.
func (h *holders) close() error {
	h.mu.Lock()
	var pids []int
	for pid := range h.procs {
		pids = append(pids, pid)
	}
	h.mu.Unlock()
	for _, pid := range pids {
		h.kill(pid)
	}
	return nil
}

// ctlPort is the static port of the curve's extra containers; the N present
// hold firstStatic+i; burst containers hold only their ephemeral block.
const ctlPort = cyclePort

// processSandbox makes sandbox name with a daemon of its own (its files
// under label) and the holders of the namespaces its containers get.
func (b *bench) processSandbox(ctx context.Context, name, label string) (*sandbox.Sandbox, *holders, pbgrpc.IsolatorClient, error) {
	sb, err := sandbox.NewNamed(name)
	if err != nil {
		return nil, nil, nil, err
	}
	b.sbNames = append(b.sbNames, sb.Name)
	b.undo = append(b.undo, sb.Close)
	hs := &holders{}
	b.undo = append(b.undo, hs.close)
	_, cl, err := b.startDaemon(ctx, sb, label)
	return sb, hs, cl, err
}

// phaseControl runs the control figures in their own sandbox and daemon.
func (b *bench) phaseControl(ctx context.Context) error {
	n := b.o.n
	cs := &ControlScale{Namespaces: "each held by a process (sleep cloned into a fresh network namespace), isolated by pid", BurstSize: 100}
	b.res.Control = cs
	if n < cs.BurstSize {
		cs.BurstSize = n
	}
	b.settle(cs)
	sb, hs, cl, err := b.processSandbox(ctx, "isobench-c", "sc")
	if err != nil {
		return err
	}

	samples := b.o.cycles
	// The curve's points: containers present when the samples are taken.
	var points []int
	for _, p := range []int{0, 10, 50, 100, 250, 500, 1000} {
		if p < n {
			points = append(points, p)
		}
	}
	points = append(points, n)

	// A probe container for the reads during the bursts (not counted in P).
	probePid, err := hs.spawn()
	if err != nil {
		return err
	}
	if _, err := b.setup(ctx, cl, "probe", 0, "", probePid); err != nil {
		return err
	}

	// Bursts of BurstSize setups and teardowns at once (few present), with
	// the probe read all along.
	reads := &readProbe{}
	sock := filepath.Join(b.tmp, "sc", "isolatord.sock")
	var sepUsage, sepGet []time.Duration
	sep, err := startSeparateReader(ctx, sock, "probe")
	if err != nil {
		return err
	}
	stopReads := reads.start(ctx, cl, "probe")
	burstPids, err := hs.spawnN(cs.BurstSize)
	if err != nil {
		stopReads()
		sep.stop(&sepUsage, &sepGet)
		return err
	}
	var ids []string
	for i := range burstPids {
		ids = append(ids, fmt.Sprintf("burst%03d", i))
	}
	took, err := burst(len(ids), func(i int) error {
		_, err := b.setup(ctx, cl, ids[i], 0, "", burstPids[i])
		return err
	})
	if err != nil {
		stopReads()
		sep.stop(&sepUsage, &sepGet)
		return fmt.Errorf("burst of setups: %w", err)
	}
	cs.BurstSetupSeconds = ptr(took.Seconds())
	took, err = burst(len(ids), func(i int) error {
		_, err := b.teardown(ctx, cl, ids[i])
		return err
	})
	stopReads()
	if serr := sep.stop(&sepUsage, &sepGet); serr != nil {
		b.fail("control: reads by a separate process during the bursts: %v", serr)
	}
	if err != nil {
		return fmt.Errorf("burst of teardowns: %w", err)
	}
	cs.BurstTeardownSeconds = ptr(took.Seconds())
	for _, pid := range burstPids {
		hs.kill(pid)
	}
	b.logf("control: burst of %d setups %.3fs, of %d teardowns %.3fs", cs.BurstSize, *cs.BurstSetupSeconds, cs.BurstSize, *cs.BurstTeardownSeconds)

	// The curve, filling up to N one by one.
	present := 0
	var setupAll time.Duration
	pids, err := hs.spawnN(n)
	if err != nil {
		return err
	}
	b.logf("control: %d holder processes started", n)
	for pi, p := range points {
		for present < p {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			d, err := b.setup(ctx, cl, fmt.Sprintf("p%04d", present), firstStatic+present, "", pids[present])
			if err != nil {
				return fmt.Errorf("setting up container %d of %d: %w", present+1, n, err)
			}
			setupAll += d
			present++
		}
		pt, err := b.curvePoint(ctx, cl, hs, p, samples, pi)
		if err != nil {
			return err
		}
		cs.Curve = append(cs.Curve, pt)
		b.logf("control: %d present: setup %s, teardown %s", p, fmtMs(pt.Setup), fmtMs(pt.Teardown))
	}
	cs.SetupAllSeconds = ptr(setupAll.Seconds())
	cs.SetupN1, cs.TeardownN1 = cs.Curve[0].Setup, cs.Curve[0].Teardown
	last := cs.Curve[len(cs.Curve)-1]
	cs.SetupNN, cs.TeardownNN = last.Setup, last.Teardown
	if cs.SetupN1 != nil && cs.SetupNN != nil && cs.SetupN1.P50Ms > 0 {
		cs.SetupRatio = ptr(cs.SetupNN.P50Ms / cs.SetupN1.P50Ms)
	}
	b.logf("control: %d set up one by one in %.2fs of API calls", n, setupAll.Seconds())

	// CNI ADD and DEL on the node as it is now, N containers present.
	cs.CNIPresent = n
	if err := b.cniFigures(ctx, cl, hs, sock, samples); err != nil {
		b.fail("control: CNI: %v", err)
	}

	// The drain: N teardowns at once.
	if sep, err = startSeparateReader(ctx, sock, "probe"); err != nil {
		return err
	}
	stopReads = reads.start(ctx, cl, "probe")
	took, err = burst(n, func(i int) error {
		_, err := b.teardown(ctx, cl, fmt.Sprintf("p%04d", i))
		return err
	})
	cs.ReadsDuringBursts = stopReads()
	cs.UsageDuringBursts, cs.GetDuringBursts = summarize(reads.usage), summarize(reads.get)
	if serr := sep.stop(&sepUsage, &sepGet); serr != nil {
		b.fail("control: reads by a separate process during the bursts: %v", serr)
	}
	cs.ReadsSeparate = summarize(append(append([]time.Duration(nil), sepUsage...), sepGet...))
	cs.UsageSeparate, cs.GetSeparate = summarize(sepUsage), summarize(sepGet)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	cs.DrainSeconds = ptr(took.Seconds())
	drained := time.Now()
	b.logf("control: drain of %d at once %.3fs; reads during the bursts %s (Usage %s, Get %s); by a separate process %s (Usage %s, Get %s)", n, *cs.DrainSeconds,
		fmtMs(cs.ReadsDuringBursts), fmtMs(cs.UsageDuringBursts), fmtMs(cs.GetDuringBursts),
		fmtMs(cs.ReadsSeparate), fmtMs(cs.UsageSeparate), fmtMs(cs.GetSeparate))
	if reads.err != nil {
		b.fail("control: reads during the bursts: %v", reads.err)
	}
	for _, pid := range pids {
		hs.kill(pid)
	}
	if _, err := b.teardown(ctx, cl, "probe"); err != nil {
		return err
	}
	hs.kill(probePid)
	// The drained veth pairs are deleted in the background after the last
	// answer: time until the kernel has none left.
	if err := waitNoRetired(sb, 60*time.Second); err != nil {
		b.fail("control: drain: %v", err)
	} else {
		cs.DrainDeletedSeconds = ptr(time.Since(drained).Seconds())
		b.logf("control: the drained links were deleted %.3fs after the drain's last answer", *cs.DrainDeletedSeconds)
	}

	return nil
}

// curvePoint times k setups and teardowns of one more container.
func (b *bench) curvePoint(ctx context.Context, cl pbgrpc.IsolatorClient, hs *holders, present, k, point int) (CurvePoint, error) {
	warm := 2
	pids, err := hs.spawnN(warm + k)
	if err != nil {
		return CurvePoint{}, err
	}
	var su, td []time.Duration
	for i, pid := range pids {
		id := fmt.Sprintf("x%d-%d", point, i)
		s, err := b.setup(ctx, cl, id, ctlPort, "", pid)
		if err != nil {
			return CurvePoint{}, err
		}
		t, err := b.teardown(ctx, cl, id)
		if err != nil {
			return CurvePoint{}, err
		}
		hs.kill(pid)
		if i >= warm {
			su, td = append(su, s), append(td, t)
		}
	}
	return CurvePoint{Present: present, Setup: summarize(su), Teardown: summarize(td)}, nil
}

// burst runs fn(0..n-1) all at once and returns the wall time until the last
// one returned.
func burst(n int, fn func(i int) error) (time.Duration, error) {
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = fn(i)
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// readProbe polls Usage and Get of one container and keeps their latencies.
type readProbe struct {
	lat        []time.Duration
	usage, get []time.Duration // lat split by call
	err        error
}

func (r *readProbe) start(ctx context.Context, cl pbgrpc.IsolatorClient, id string) (stop func() *Latency) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for i := 0; i < 1_000_000; i++ {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			t0 := time.Now()
			var err error
			if i%2 == 0 {
				_, err = cl.Usage(cctx, &pb.UsageRequest{ContainerId: id})
			} else {
				_, err = cl.Get(cctx, &pb.GetRequest{ContainerId: id})
			}
			cancel()
			if err != nil {
				r.err = err
				return
			}
			took := time.Since(t0)
			r.lat = append(r.lat, took)
			if i%2 == 0 {
				r.usage = append(r.usage, took)
			} else {
				r.get = append(r.get, took)
			}
			time.Sleep(time.Millisecond) // a poll, not a load generator
		}
	}()
	return func() *Latency {
		close(done)
		<-finished
		return summarize(r.lat)
	}
}

// curveSorted returns the curve by number present.
func (c *ControlScale) curveSorted() []CurvePoint {
	out := append([]CurvePoint(nil), c.Curve...)
	sort.Slice(out, func(i, j int) bool { return out[i].Present < out[j].Present })
	return out
}

// settle waits, before the control phase, until the veth pairs the earlier
// phases deleted in the background are gone and the machine is quiet (the
// kernel frees their namespaces in a work queue for seconds after), so that
// the phase measures its own containers, not the leftovers of others.
func (b *bench) settle(cs *ControlScale) {
	t0 := time.Now()
	for _, sb := range []*sandbox.Sandbox{b.sb1, b.sbN} {
		if sb == nil {
			continue
		}
		if err := waitNoRetired(sb, 60*time.Second); err != nil {
			b.logf("control: %s: %v", sb.Name, err)
		}
	}
	limit := 30 * time.Second
	if b.o.quick { // the test suite's run: other packages' tests keep the machine busy
		limit = 2 * time.Second
	}
	_, quiet, err := waitQuiet(settleBusy, time.Second, limit)
	if err != nil {
		b.fail("control: waiting for a quiet machine: %v", err)
		return
	}
	cs.SettleSeconds, cs.Settled = ptr(time.Since(t0).Seconds()), quiet
	if quiet {
		b.logf("control: the kernel was done with the earlier phases after %.1fs (machine below %.2g CPUs busy for 1s)", *cs.SettleSeconds, settleBusy)
	} else {
		b.logf("control: the machine stayed above %.2g CPUs busy for %.0fs; measuring anyway", settleBusy, *cs.SettleSeconds)
	}
}

// settleBusy is the CPU use (in CPUs) below which the machine counts as
// quiet before the control phase.
const settleBusy = 0.3
