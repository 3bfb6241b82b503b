package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/isolatord/isolatord/api"
	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/test/sandbox"
)

// target is a server the data plane is measured against.
type target struct {
	client sandbox.NS // the client namespace the traffic starts in
	addr   string     // host IP:port
	name   string     // what the server answers with
}

// bench is one run.
type bench struct {
	o     *options
	log   io.Writer
	res   *Results
	began time.Time

	tmp       string
	undo      []func() error // run in reverse order by cleanup
	pool      *nsPool
	isolatord string
	sbNames   []string

	sbA, sb1, sbN *sandbox.Sandbox
	d1, dN        *daemon
	c1, cN        pbgrpc.IsolatorClient
	targets       map[string]*target // case -> its server over IPv4
	targets6      map[string]*target // the same servers over IPv6
}

func newBench(o *options, log io.Writer) *bench {
	now := time.Now()
	var only []string
	if o.only != "" {
		only = []string{o.only}
	}
	return &bench{
		o: o, log: log, began: now,
		targets: map[string]*target{}, targets6: map[string]*target{},
		res: &Results{
			Schema:  1,
			Date:    now.UTC().Format(time.RFC3339),
			Quick:   o.quick,
			Machine: machine(),
			Config: Config{
				Containers: o.n, Cycles: o.cycles, Rounds: o.rounds, DurationSeconds: o.dur.Seconds(),
				BlockSize: blockSize, EphemeralPool: ephemeralPool, StaticPorts: staticPorts,
				HostPortRange: sandbox.HostPortRange, Only: only,
				Namespaces: "bind-mounted namespace files, isolated by path (the server containers: processes, isolated by pid)",
			},
			DataPlane:  newDataPlane(ipv4),
			DataPlane6: ptr(newDataPlane(ipv6)),
			Phases:     map[string]float64{},
			Errors:     []string{},
			Micro:      []MicroBenchmark{},
		},
	}
}

func (b *bench) logf(format string, a ...any) {
	fmt.Fprintf(b.log, "[%6.1fs] %s\n", time.Since(b.began).Seconds(), fmt.Sprintf(format, a...))
}

// fail records an error: the figures it prevented stay n/a.
func (b *bench) fail(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	b.res.Errors = append(b.res.Errors, msg)
	b.logf("ERROR: %s", msg)
}

// run runs the phases in order; a phase whose prerequisites failed is
// skipped (its figures stay n/a).
func (b *bench) run(ctx context.Context) {
	if b.o.micro != "" {
		f, err := os.Open(b.o.micro)
		if err != nil {
			b.fail("micro-benchmarks: %v", err)
		} else {
			b.res.Micro = append(b.res.Micro, parseGoBench(f)...)
			f.Close()
		}
	}
	phases := []benchPhase{
		{"prepare", b.prepare},
		{"daemons", b.phaseDaemons},
		{"n_containers", b.phaseN},
		{"cycles", b.phaseCycles},
		{"one_container", b.phaseOne},
		{"data_plane", b.phaseData},
		{"saddr6", b.phaseSaddr6},
		{"shared_ports", b.phaseShared},
		{"handoff", b.phaseHandoff},
		{"amplification", b.phaseAmplification},
		{"restart", b.phaseRestart},
		{"rebuild", b.phaseRebuild},
		{"teardown", b.phaseTeardown},
		{"control", b.phaseControl},
	}
	if b.o.only == "cni" { // in a full run the control phase measures CNI
		phases = append(phases, benchPhase{"cni", b.phaseCNI})
	}
	for i, p := range phases {
		if !b.o.runs(p.name) {
			continue
		}
		if ctx.Err() != nil {
			b.fail("%s: not run: %v", p.name, context.Cause(ctx))
			continue
		}
		t0 := time.Now()
		err := p.fn(ctx)
		b.res.Phases[p.name] = time.Since(t0).Seconds()
		if err != nil {
			b.fail("%s: %v", p.name, err)
			if i == 0 {
				return // nothing can run without the sandboxes
			}
		}
	}
}

// benchPhase is one measurement phase and its name (--only).
type benchPhase struct {
	name string
	fn   func(context.Context) error
}

// cleanup undoes everything in reverse order and checks that nothing of the
// run is left (namespaces, mounts).
func (b *bench) cleanup() error {
	var errs []error
	for i := len(b.undo) - 1; i >= 0; i-- {
		if err := b.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	b.undo = nil
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			for _, n := range b.sbNames {
				if len(f) > 0 && strings.HasPrefix(f[0], n) {
					errs = append(errs, fmt.Errorf("namespace %s left behind", f[0]))
				}
			}
		}
	}
	if b.tmp != "" {
		if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
			if n := strings.Count(string(mi), b.tmp); n > 0 {
				errs = append(errs, fmt.Errorf("%d mount(s) under %s left behind", n, b.tmp))
			}
		}
	}
	return errors.Join(errs...)
}

// ---- phases ----

// prepare checks the tools, makes the temp dir, the namespace pool, the
// three sandboxes and the two host servers (cases a and d).
func (b *bench) prepare(ctx context.Context) error {
	for _, p := range []string{"nsenter", "ip"} {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s not found (make deps installs it)", p)
		}
	}
	bin, err := filepath.Abs(b.o.bin)
	if err != nil {
		return err
	}
	b.isolatord = filepath.Join(bin, "isolatord")
	if _, err := os.Stat(b.isolatord); err != nil {
		return fmt.Errorf("isolatord not built (make build): %w", err)
	}
	if _, err := os.Stat(b.o.isotraffic); err != nil {
		return fmt.Errorf("isotraffic binary (--isotraffic): %w", err)
	}
	// What killed runs left (settle.go) would slow this one.
	swept, mounts, err := sweepStale(os.TempDir())
	if len(swept) > 0 {
		b.logf("removed %d mount(s) and the temp dirs of %d killed run(s): %s", mounts, len(swept), strings.Join(swept, ", "))
	}
	if err != nil {
		b.fail("removing what killed runs left: %v", err)
	}
	if b.tmp, err = os.MkdirTemp("", "isobench-"); err != nil {
		return err
	}
	tmp := b.tmp
	b.undo = append(b.undo, func() error { return os.RemoveAll(tmp) })
	if err := writeOwner(tmp); err != nil {
		return err
	}
	if b.pool, err = newNSPool(filepath.Join(tmp, "ns")); err != nil {
		return err
	}
	pool := b.pool
	b.undo = append(b.undo, pool.close)

	sbOpts := []sandbox.Option{sandbox.WithIPv6()} // dual-stack: family.go
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		b.fail("IPv6 rows: the kernel has no IPv6 (%v); the sandboxes are IPv4 only", err)
		sbOpts = nil
	}
	mk := func(prefix string) (*sandbox.Sandbox, error) {
		sb, err := sandbox.NewNamed(prefix, sbOpts...)
		if err != nil {
			return nil, err
		}
		b.sbNames = append(b.sbNames, sb.Name)
		b.undo = append(b.undo, sb.Close)
		return sb, nil
	}
	if b.sbA, err = mk("isobench-a"); err != nil {
		return err
	}
	if b.sb1, err = mk("isobench-1"); err != nil {
		return err
	}
	if b.sbN, err = mk("isobench-n"); err != nil {
		return err
	}
	b.logf("sandboxes %s, %s, %s", b.sbA.Name, b.sb1.Name, b.sbN.Name)

	for _, h := range []struct {
		c    string
		sb   *sandbox.Sandbox
		name string
	}{{caseA, b.sbA, "host-a"}, {caseD, b.sbN, "host-d"}} {
		srv := &daemon{
			Bin: b.o.isotraffic, HostNS: h.sb.Host.Path, Ready: "ready",
			Args: []string{"serve", "--tcp", ":" + strconv.Itoa(hostServerPort), "--udp", ":" + strconv.Itoa(hostServerPort), "--name", h.name},
		}
		if _, err := srv.Start(10 * time.Second); err != nil {
			b.fail("host server %s: %v", h.name, err)
			continue
		}
		b.undo = append(b.undo, func() error { return srv.Stop(syscall.SIGTERM) })
		b.setTarget(h.c, h.sb, hostServerPort, h.name)
	}
	return nil
}

// startDaemon starts an isolatord for sb, its files under tmp/<label>, and
// dials it.
func (b *bench) startDaemon(ctx context.Context, sb *sandbox.Sandbox, label string) (*daemon, pbgrpc.IsolatorClient, error) {
	dir := filepath.Join(b.tmp, label)
	netnsDir := filepath.Join(dir, "netns")
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return nil, nil, err
	}
	d := &daemon{
		Bin: b.isolatord, HostNS: sb.Host.Path,
		Args: []string{
			"--socket", filepath.Join(dir, "isolatord.sock"),
			"--state-dir", filepath.Join(dir, "state"),
			"--lock-dir", filepath.Join(dir, "lock"),
			"--netns-dir", netnsDir,
			"--ports", staticPorts,
			"--ephemeral-ports", ephemeralPool,
			"--ephemeral-ports-per-container", strconv.Itoa(blockSize),
			"--metrics-addr", metricsAddr,
		},
	}
	// Registered before the start so that a half-started daemon is stopped
	// and its mounts removed too.
	b.undo = append(b.undo, func() error {
		err := d.Stop(syscall.SIGTERM)
		return errors.Join(err, unmountDir(netnsDir))
	})
	took, err := d.Start(30 * time.Second)
	if err != nil {
		return nil, nil, err
	}
	b.logf("isolatord for %s serving after %s (pid %d)", sb.Name, took.Round(time.Millisecond), d.Pid())
	conn, err := b.dial(ctx, filepath.Join(dir, "isolatord.sock"))
	if err != nil {
		return nil, nil, err
	}
	return d, conn, nil
}

func (b *bench) dial(ctx context.Context, socket string) (*api.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := api.Dial(dctx, socket)
	if err != nil {
		return nil, err
	}
	b.undo = append(b.undo, conn.Close)
	return conn, nil
}

// unmountDir detaches every mount in dir, then dir itself if it is one.
func unmountDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		for i := 0; i < 8; i++ {
			if syscall.Unmount(p, syscall.MNT_DETACH) != nil {
				break
			}
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for i := 0; i < 8; i++ {
		if syscall.Unmount(dir, syscall.MNT_DETACH) != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// phaseDaemons starts isolatord in S1 and in SN.
func (b *bench) phaseDaemons(ctx context.Context) error {
	var err error
	if b.d1, b.c1, err = b.startDaemon(ctx, b.sb1, "s1"); err != nil {
		b.d1, b.c1 = nil, nil
		b.fail("isolatord in %s: %v", b.sb1.Name, err)
	}
	if b.dN, b.cN, err = b.startDaemon(ctx, b.sbN, "sn"); err != nil {
		b.dN, b.cN = nil, nil
		b.fail("isolatord in %s: %v", b.sbN.Name, err)
	}
	return nil
}

// phaseCycles measures setup and teardown of a lone container (in S1, empty
// so far) and of one more container with N present (in SN), alternating
// between the two daemons cycle by cycle so that both see the same machine.
func (b *bench) phaseCycles(ctx context.Context) error {
	type side struct {
		cl    pbgrpc.IsolatorClient
		label string
		ct    *cycleTimes
		err   error
		paths []string
	}
	var sides []*side
	if b.c1 != nil {
		sides = append(sides, &side{cl: b.c1, label: "one"})
	}
	if b.cN != nil && b.res.ControlPlane.SetupAllSeconds != nil {
		sides = append(sides, &side{cl: b.cN, label: "many"})
	}
	if len(sides) == 0 {
		return errors.New("no daemon to measure")
	}
	warm := 3
	if b.o.quick {
		warm = 1
	}
	n := warm + b.o.cycles
	for _, sd := range sides {
		sd.ct = &cycleTimes{}
		for i := 0; i < n; i++ {
			p, err := b.pool.create(fmt.Sprintf("%s-cycle-%d", sd.label, i))
			if err != nil {
				return err
			}
			sd.paths = append(sd.paths, p)
		}
	}
	for i := 0; i < n; i++ {
		for k := range sides {
			sd := sides[(k+i)%len(sides)]
			if sd.err != nil {
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			id := fmt.Sprintf("%s-cycle-%d", sd.label, i)
			prep, iso, err := b.setupSplit(ctx, sd.cl, id, cyclePort, sd.paths[i], 0)
			if err != nil {
				sd.err = err
				continue
			}
			t, err := b.teardown(ctx, sd.cl, id)
			if err != nil {
				sd.err = err
				continue
			}
			if i >= warm {
				sd.ct.setup = append(sd.ct.setup, prep+iso)
				sd.ct.prepare = append(sd.ct.prepare, prep)
				sd.ct.isolate = append(sd.ct.isolate, iso)
				sd.ct.teardown = append(sd.ct.teardown, t)
			}
		}
	}
	cp := &b.res.ControlPlane
	for _, sd := range sides {
		if sd.err != nil {
			b.fail("setup/teardown cycles (%s): %v", sd.label, sd.err)
			continue
		}
		if sd.label == "one" {
			cp.SetupN1, cp.TeardownN1 = summarize(sd.ct.setup), summarize(sd.ct.teardown)
			cp.PrepareN1, cp.IsolateN1 = summarize(sd.ct.prepare), summarize(sd.ct.isolate)
			b.logf("N=1: setup %s (prepare %s, isolate %s), teardown %s", fmtMs(cp.SetupN1), fmtMs(cp.PrepareN1), fmtMs(cp.IsolateN1), fmtMs(cp.TeardownN1))
		} else {
			cp.SetupNN, cp.TeardownNN = summarize(sd.ct.setup), summarize(sd.ct.teardown)
			cp.PrepareNN, cp.IsolateNN = summarize(sd.ct.prepare), summarize(sd.ct.isolate)
			b.logf("N=%d: setup %s (prepare %s, isolate %s), teardown %s", b.o.n, fmtMs(cp.SetupNN), fmtMs(cp.PrepareNN), fmtMs(cp.IsolateNN), fmtMs(cp.TeardownNN))
		}
	}
	if b.dN != nil && b.dN.Pid() != 0 {
		if rss, hwm, err := rssBytes(b.dN); err != nil {
			b.fail("RSS: %v", err)
		} else {
			cp.RSSMiB = ptr(float64(rss) / (1 << 20))
			cp.RSSPeakMiB = ptr(float64(hwm) / (1 << 20))
			b.logf("daemon RSS with %d containers: %.1f MiB (peak %.1f MiB)", b.o.n, *cp.RSSMiB, *cp.RSSPeakMiB)
		}
	}
	return nil
}

// phaseOne sets up the container of case (b) in S1, after the cycles.
func (b *bench) phaseOne(ctx context.Context) error {
	if b.c1 == nil {
		return errors.New("no isolatord in S1")
	}
	if err := b.serverContainer(ctx, b.sb1, b.c1, caseB, "ctr-b", firstStatic); err != nil {
		return fmt.Errorf("container of case (b): %w", err)
	}
	return nil
}

// serverContainer starts a container running isotraffic serve on port,
// isolates it by pid and registers it as the target of case c (over both
// families).
func (b *bench) serverContainer(ctx context.Context, sb *sandbox.Sandbox, cl pbgrpc.IsolatorClient, c, name string, port int) error {
	ctr, err := sb.Spawn(name, b.o.isotraffic, "serve", "--tcp", ":"+strconv.Itoa(port), "--udp", ":"+strconv.Itoa(port), "--name", name)
	if err != nil {
		return err
	}
	if err := ctr.WaitOutput("ready", 10*time.Second); err != nil {
		return err
	}
	if _, err := b.setup(ctx, cl, name, port, "", ctr.Pid); err != nil {
		return err
	}
	b.setTarget(c, sb, port, name)
	return nil
}

// setTarget registers the server name answering on port of sb's host
// address as case c, over each family sb has.
func (b *bench) setTarget(c string, sb *sandbox.Sandbox, port int, name string) {
	for _, f := range families {
		if f.hostIP(sb) == nil {
			continue
		}
		addr := net.JoinHostPort(f.hostIP(sb).String(), strconv.Itoa(port))
		b.targetsOf(f)[c] = &target{client: sb.Client, addr: addr, name: name}
	}
}

// targetsOf is the servers of the cases over family f.
func (b *bench) targetsOf(f family) map[string]*target {
	if f == ipv6 {
		return b.targets6
	}
	return b.targets
}

// setup prepares and isolates one container (by netns path, or by pid when
// pid > 0) and returns the time the two calls took together. On failure it
// cleans the container up again.
func (b *bench) setup(ctx context.Context, cl pbgrpc.IsolatorClient, id string, port int, nsPath string, pid int) (time.Duration, error) {
	p, i, err := b.setupSplit(ctx, cl, id, port, nsPath, pid)
	return p + i, err
}

// setupSplit is setup returning the time of Prepare and of Isolate.
func (b *bench) setupSplit(ctx context.Context, cl pbgrpc.IsolatorClient, id string, port int, nsPath string, pid int) (prep, iso time.Duration, err error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := &pb.IsolateRequest{ContainerId: id}
	if pid > 0 {
		req.Target = &pb.IsolateRequest_Pid{Pid: int32(pid)}
	} else {
		req.Target = &pb.IsolateRequest_NetnsPath{NetnsPath: nsPath}
	}
	prepReq := &pb.PrepareRequest{ContainerId: id}
	if port > 0 { // 0: the ephemeral block only
		prepReq.Ports = []*pb.PortRange{{Begin: uint32(port), End: uint32(port)}}
	}
	t0 := time.Now()
	if _, err := cl.Prepare(cctx, prepReq); err != nil {
		return 0, 0, fmt.Errorf("prepare %s: %w", id, err)
	}
	t1 := time.Now()
	if _, err := cl.Isolate(cctx, req); err != nil {
		cl.Cleanup(cctx, &pb.CleanupRequest{ContainerId: id})
		return 0, 0, fmt.Errorf("isolate %s: %w", id, err)
	}
	return t1.Sub(t0), time.Since(t1), nil
}

func (b *bench) teardown(ctx context.Context, cl pbgrpc.IsolatorClient, id string) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if _, err := cl.Cleanup(cctx, &pb.CleanupRequest{ContainerId: id}); err != nil {
		return 0, fmt.Errorf("cleanup %s: %w", id, err)
	}
	return time.Since(t0), nil
}

// cycleTimes are the samples of the setup/teardown cycles.
type cycleTimes struct {
	setup, prepare, isolate, teardown []time.Duration
}

// phaseN sets up N containers in SN, one by one (the last one runs the
// server of case c).
func (b *bench) phaseN(ctx context.Context) error {
	n := b.o.n
	if b.cN == nil {
		return errors.New("no isolatord in SN")
	}
	var err error
	t0 := time.Now()
	paths := make([]string, n-1)
	for i := range paths {
		if paths[i], err = b.pool.create(fmt.Sprintf("c%04d", i)); err != nil {
			return err
		}
	}
	b.res.ControlPlane.NamespacesSeconds = ptr(time.Since(t0).Seconds())
	b.logf("%d namespaces made in %.2fs", n-1, time.Since(t0).Seconds())

	// The server container is made first but set up last, so that its
	// filters are the last ones added.
	ctr, err := b.sbN.Spawn("ctr-c", b.o.isotraffic, "serve", "--tcp", ":"+strconv.Itoa(firstStatic+n-1), "--udp", ":"+strconv.Itoa(firstStatic+n-1), "--name", "ctr-c")
	if err != nil {
		return err
	}
	if err := ctr.WaitOutput("ready", 10*time.Second); err != nil {
		return err
	}
	var each []time.Duration
	var total time.Duration
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var d time.Duration
		if i < n-1 {
			d, err = b.setup(ctx, b.cN, fmt.Sprintf("c%04d", i), firstStatic+i, paths[i], 0)
		} else {
			d, err = b.setup(ctx, b.cN, "ctr-c", firstStatic+i, "", ctr.Pid)
		}
		if err != nil {
			return fmt.Errorf("setting up container %d of %d: %w", i+1, n, err)
		}
		each = append(each, d)
		total += d
		if (i+1)%maxInt(n/4, 1) == 0 {
			b.logf("set up %d/%d containers", i+1, n)
		}
	}
	b.setTarget(caseC, b.sbN, firstStatic+n-1, "ctr-c")
	cp := &b.res.ControlPlane
	cp.SetupAllSeconds = ptr(total.Seconds())
	tenth := maxInt(n/10, 1)
	cp.SetupAllFirst = summarize(each[:tenth])
	cp.SetupAllLast = summarize(each[n-tenth:])
	b.logf("%d containers set up in %.2fs of API calls", n, total.Seconds())
	return nil
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}
