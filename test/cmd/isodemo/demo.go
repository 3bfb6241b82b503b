package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// The demo's port plan. The sandbox host's own ip_local_port_range is
// sandbox.HostPortRange (61000-61999), outside both pools.
const (
	managedPorts   = "31000-31999" // static ports containers may ask for
	ephemeralPool  = "32768-40959" // 8 blocks of 1024
	blockSize      = 1024
	sharedPort     = 31100
	metricsAddr    = "127.0.0.1:9617" // the sandbox host's own loopback
	netnsDir       = "/var/run/netns" // the default: `ip netns exec <id>` finds the containers
	spreadConns    = 20               // connections sent to the shared port
	daemonStartMax = 20 * time.Second
)

// ctr is one demo container.
type ctr struct {
	name   string // short name, what its server answers with
	id     string // container ID given to isolatord: <sandbox name>-<name>
	port   int    // the static port its server listens on
	shared bool   // the port is shared (SO_REUSEPORT)
	c      *sandbox.Container
}

// demo is one run.
type demo struct {
	ui   *ui
	opts *options

	tmp      string // state dir, socket
	socket   string
	ctl      string // isolatorctl
	sb       *sandbox.Sandbox
	d        *daemon
	ctrs     []*ctr
	baseline hostState
	hasBase  bool
}

// step is one numbered step of the demo.
type step struct {
	title, explain string
	// critical steps are needed by every later step: if one fails the
	// rest is skipped (the cleanup still runs).
	critical bool
	run      func(ctx context.Context) error
}

type outcome struct {
	title   string
	err     error
	skipped string
	dur     time.Duration
}

// run runs every step, then the cleanup, prints the verdict and reports
// whether everything worked.
func (d *demo) run(ctx context.Context) bool {
	began := time.Now()
	steps := []step{
		{"Build a sandbox",
			"A sandbox is two network namespaces joined by a virtual cable: 'host' plays the machine isolatord runs on (198.18.0.1), 'client' plays the outside world (198.18.0.2). Your real eth0 is never touched.",
			true, d.stepSandbox},
		{"Start isolatord",
			"isolatord is the daemon that hands out ports and wires containers to the host. It runs with its network view inside the sandbox host (nsenter --net), keeps its state in a temp dir and takes commands on a unix socket.",
			true, d.stepDaemon},
		{"Start three containers",
			"A 'container' here is a process in a fresh network namespace running a tiny server that answers with its own name. beta and gamma both listen on port 31100 with SO_REUSEPORT: they will share it.",
			true, d.stepContainers},
		{"Isolate them with isolatorctl",
			"'prepare' reserves a container's ports (an aligned block of ephemeral ports plus the static ports it asks for); 'isolate' wires its namespace to the host: a veth, the host's IP inside, and tc filters that send its ports to it.",
			true, d.stepIsolate},
		{"The assignments",
			"Every container shares the host's IP address; what tells them apart is the ports each one owns. `isolatorctl list` shows who owns what.",
			false, d.stepList},
		{"Reach each container from the outside",
			"The client connects to the host's IP. tc filters on the host's eth0 send each packet to the container that owns its port, and the server answers with its name.",
			false, d.stepReach},
		{"A shared port spreads connections",
			fmt.Sprintf("beta and gamma share port %d. The host spreads new connections between them by a hash of each flow, so both get a share: here are %d connections from the client.", sharedPort, spreadConns),
			false, d.stepSpread},
		{"Look inside a container with ip netns exec",
			"isolatord bind-mounts each container's namespace under /var/run/netns/<id>, so the usual tools work: ss lists the sockets listening inside each container.",
			false, d.stepNetnsExec},
		{"Read the metrics",
			"isolatord exports Prometheus metrics (tc filter errors, per-container traffic, call latencies) over HTTP. A real scrape of the endpoint inside the sandbox host:",
			false, d.stepMetrics},
		{"Restart the daemon while traffic flows",
			"The filters live in the kernel, not in the daemon. The client keeps talking to the containers while isolatord is killed with kill -9 and restarted; it recovers every container from its state.",
			false, d.stepRestart},
	}
	cleanup := step{"Clean up and check that nothing is left",
		"Cleanup removes each container's veth, filters and namespace mount and releases its ports; then the demo stops everything it started and checks that nothing is left on the machine.",
		false, nil}
	total := len(steps) + 1

	var outs []outcome
	blocked := ""
	for i, s := range steps {
		d.ui.heading(i+1, total, s.title, s.explain)
		o := outcome{title: s.title}
		switch {
		case blocked != "":
			o.skipped = blocked
		case ctx.Err() != nil:
			o.skipped = "interrupted (" + context.Cause(ctx).Error() + ")"
		}
		if o.skipped != "" {
			d.ui.skipped(o.skipped)
			outs = append(outs, o)
			continue
		}
		t0 := time.Now()
		o.err = safely(func() error { return s.run(ctx) })
		o.dur = time.Since(t0)
		if o.err == nil && ctx.Err() != nil {
			o.err = fmt.Errorf("interrupted: %w", ctx.Err())
		}
		if o.err != nil {
			d.ui.result(false, o.err.Error())
			if s.critical {
				blocked = fmt.Sprintf("needs step %d (%s), which failed", i+1, s.title)
			}
		} else {
			d.ui.result(true, fmt.Sprintf("(%s)", round(o.dur)))
		}
		outs = append(outs, o)
	}

	// The cleanup runs whatever happened, with its own time bound.
	d.ui.heading(total, total, cleanup.title, cleanup.explain)
	cctx, ccancel := context.WithTimeout(context.Background(), 45*time.Second)
	t0 := time.Now()
	cerr := safely(func() error { return d.cleanup(cctx) })
	ccancel()
	co := outcome{title: cleanup.title, err: cerr, dur: time.Since(t0)}
	if cerr != nil {
		d.ui.result(false, cerr.Error())
	} else {
		d.ui.result(true, fmt.Sprintf("(%s)", round(co.dur)))
	}
	outs = append(outs, co)

	elapsed := time.Since(began)
	d.summary(outs, elapsed)
	var failed []string
	for i, o := range outs {
		switch {
		case o.err != nil:
			failed = append(failed, fmt.Sprintf("step %d (%s) failed: %s", i+1, o.title, firstLine(o.err.Error())))
		case o.skipped != "":
			failed = append(failed, fmt.Sprintf("step %d (%s) skipped", i+1, o.title))
		}
	}
	timing := fmt.Sprintf("%d steps in %s", total, round(elapsed))
	if elapsed > 60*time.Second {
		timing += " (over the 60 s target)"
	}
	if len(failed) == 0 {
		d.ui.verdict(true, "every step worked: "+timing)
		return true
	}
	msg := failed[0]
	if len(failed) > 1 {
		msg += fmt.Sprintf("; %d more step(s) did not work", len(failed)-1)
	}
	if ctx.Err() != nil {
		msg = fmt.Sprintf("interrupted (%v), cleanup %s; %s", context.Cause(ctx), map[bool]string{true: "done", false: "incomplete"}[co.err == nil], msg)
	}
	d.ui.verdict(false, msg+"; "+timing)
	return false
}

// summary prints one line per step.
func (d *demo) summary(outs []outcome, elapsed time.Duration) {
	fmt.Fprintln(d.ui.w)
	d.ui.linef("%s", d.ui.paint("1", "== Summary"))
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tRESULT\tTIME")
	for i, o := range outs {
		res := "ok"
		switch {
		case o.err != nil:
			res = "FAILED"
		case o.skipped != "":
			res = "skipped"
		}
		fmt.Fprintf(tw, "%2d %s\t%s\t%s\n", i+1, o.title, res, round(o.dur))
	}
	fmt.Fprintf(tw, "   total\t\t%s\n", round(elapsed))
	tw.Flush()
	d.ui.block(b.String())
}

// safely runs fn, turning a panic into an error so the cleanup still runs.
func safely(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return fn()
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	default:
		return d.Round(100 * time.Microsecond)
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// ---- steps ----

func (d *demo) stepSandbox(ctx context.Context) error {
	for _, p := range []string{"nsenter", "ip", "ss", "tc"} {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s not found (make deps installs it): %w", p, err)
		}
	}
	bin, err := filepath.Abs(d.opts.bin)
	if err != nil {
		return err
	}
	for _, b := range []string{"isolatord", "isolatorctl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Errorf("%s not built (run make build): %w", b, err)
		}
	}
	if _, err := os.Stat(d.opts.isotraffic); err != nil {
		return fmt.Errorf("isotraffic binary (--isotraffic): %w", err)
	}
	d.ctl = filepath.Join(bin, "isolatorctl")
	if d.tmp, err = os.MkdirTemp("", "isodemo-"); err != nil {
		return err
	}
	d.socket = filepath.Join(d.tmp, "isolatord.sock")
	if d.sb, err = sandbox.NewNamed("isodemo"); err != nil {
		return err
	}
	// NewNamed deleted the namespaces of sandboxes whose owner died; remove
	// the container handles such a demo left too.
	if n := sweepStaleDemoMounts(); n > 0 {
		d.ui.linef("   (removed %d namespace handle(s) left by an earlier demo that was killed)", n)
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPLAYS\tADDRESS ON ITS eth0")
	fmt.Fprintf(tw, "%s\tthe machine isolatord runs on\t%s/24\n", d.sb.Host.Name, d.sb.HostIP)
	fmt.Fprintf(tw, "%s\tthe outside world (a client)\t%s/24\n", d.sb.Client.Name, d.sb.ClientIP)
	tw.Flush()
	d.ui.block(b.String())
	return nil
}

func (d *demo) stepDaemon(ctx context.Context) error {
	bin, _ := filepath.Abs(d.opts.bin)
	d.d = &daemon{
		Bin:    filepath.Join(bin, "isolatord"),
		HostNS: d.sb.Host.Path,
		Args: []string{
			"--socket", d.socket,
			"--state-dir", filepath.Join(d.tmp, "state"),
			"--lock-dir", filepath.Join(d.tmp, "lock"),
			"--netns-dir", netnsDir,
			"--ports", managedPorts,
			"--ephemeral-ports", ephemeralPool,
			"--ephemeral-ports-per-container", strconv.Itoa(blockSize),
			"--metrics-addr", metricsAddr,
		},
	}
	d.ui.command(append([]string{"nsenter", "--net=" + d.sb.Host.Path, "isolatord"}, d.d.Args...)...)
	took, err := d.d.Start(daemonStartMax)
	if err != nil {
		return err
	}
	d.ui.linef("   serving after %s (pid %d); the isolatorctl commands below pass --socket %s (left out here)", round(took), d.d.Pid(), d.socket)
	if hs, err := readHostState(d.sb); err == nil {
		d.baseline, d.hasBase = hs, true
	}
	d.ui.command("isolatorctl", "status")
	out, err := d.isolatorctl(ctx, "status")
	if err != nil {
		return err
	}
	d.ui.block(out)
	return nil
}

func (d *demo) stepContainers(ctx context.Context) error {
	d.ctrs = []*ctr{
		{name: "alpha", port: 31001},
		{name: "beta", port: sharedPort, shared: true},
		{name: "gamma", port: sharedPort, shared: true},
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTAINER\tPID\tSERVES (TCP and UDP)\tNOTE")
	for _, c := range d.ctrs {
		c.id = d.sb.Name + "-" + c.name
		addr := ":" + strconv.Itoa(c.port)
		argv := []string{d.opts.isotraffic, "serve", "--tcp", addr, "--udp", addr, "--name", c.name}
		note := "port of its own"
		if c.shared {
			argv = append(argv, "--reuseport")
			note = "shared port (SO_REUSEPORT)"
		}
		sc, err := d.sb.Spawn(c.name, argv...)
		if err != nil {
			return fmt.Errorf("start %s: %w", c.name, err)
		}
		c.c = sc
		if err := sc.WaitOutput("ready", 10*time.Second); err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", c.name, sc.Pid, c.port, note)
	}
	tw.Flush()
	d.ui.block(b.String())
	return nil
}

func (d *demo) stepIsolate(ctx context.Context) error {
	for _, c := range d.ctrs {
		flag := "--ports"
		if c.shared {
			flag = "--shared-ports"
		}
		t0 := time.Now()
		for _, argv := range [][]string{
			{"prepare", c.id, flag, strconv.Itoa(c.port)},
			{"isolate", c.id, "--pid", strconv.Itoa(c.c.Pid)},
		} {
			d.ui.command(append([]string{"isolatorctl"}, argv...)...)
			if _, err := d.isolatorctl(ctx, argv...); err != nil {
				return err
			}
		}
		d.ui.linef("     -> %s prepared and isolated in %s", c.name, round(time.Since(t0)))
	}
	return nil
}

// ctlContainer is isolatorctl's JSON for a container (the fields we use).
type ctlContainer struct {
	ContainerID    string `json:"container_id"`
	State          string `json:"state"`
	EphemeralPorts *struct {
		Begin int `json:"begin"`
		End   int `json:"end"`
	} `json:"ephemeral_ports"`
	Ports []struct {
		Begin  int  `json:"begin"`
		End    int  `json:"end"`
		Shared bool `json:"shared"`
	} `json:"ports"`
	Veth  string `json:"veth"`
	Netns string `json:"netns"`
}

// listContainers returns the daemon's containers keyed by ID.
func (d *demo) listContainers(ctx context.Context) (map[string]ctlContainer, error) {
	out, err := d.isolatorctl(ctx, "-o", "json", "list")
	if err != nil {
		return nil, err
	}
	var list []ctlContainer
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		// Accept an object wrapping the list too.
		var wrapped struct {
			Containers []ctlContainer `json:"containers"`
		}
		if err2 := json.Unmarshal([]byte(out), &wrapped); err2 != nil {
			return nil, fmt.Errorf("isolatorctl -o json list: %v; output:\n%s", err, out)
		}
		list = wrapped.Containers
	}
	m := map[string]ctlContainer{}
	for _, c := range list {
		m[c.ContainerID] = c
	}
	return m, nil
}

// checkAllIsolated checks that the daemon lists every demo container as
// isolated, owning its port.
func (d *demo) checkAllIsolated(ctx context.Context) error {
	m, err := d.listContainers(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range d.ctrs {
		got, ok := m[c.id]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s is not listed", c.id))
		case got.State != "isolated":
			errs = append(errs, fmt.Errorf("%s is %q, want isolated", c.id, got.State))
		case len(got.Ports) != 1 || got.Ports[0].Begin != c.port || got.Ports[0].Shared != c.shared:
			errs = append(errs, fmt.Errorf("%s has ports %+v, want %d (shared=%v)", c.id, got.Ports, c.port, c.shared))
		case got.EphemeralPorts == nil || got.EphemeralPorts.End-got.EphemeralPorts.Begin+1 != blockSize:
			errs = append(errs, fmt.Errorf("%s has ephemeral ports %+v, want a block of %d", c.id, got.EphemeralPorts, blockSize))
		}
	}
	return errors.Join(errs...)
}

func (d *demo) stepList(ctx context.Context) error {
	d.ui.command("isolatorctl", "list")
	out, err := d.isolatorctl(ctx, "list")
	if err != nil {
		return err
	}
	d.ui.block(out)
	return d.checkAllIsolated(ctx)
}

// echo sends one request from the client namespace to the host's IP and
// returns the name of the server that answered.
func (d *demo) echo(ctx context.Context, network string, port int, msg string) (string, error) {
	var reply string
	addr := net.JoinHostPort(d.sb.HostIP.String(), strconv.Itoa(port))
	err := d.sb.Client.Do(func() (err error) {
		reply, err = traffic.Echo(ctx, network, addr, msg, traffic.WithTimeout(2*time.Second))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("%s %s from the client: %w", network, addr, err)
	}
	return traffic.ReplyName(reply), nil
}

func (d *demo) stepReach(ctx context.Context) error {
	type probe struct {
		network string
		port    int
		want    []string
	}
	probes := []probe{
		{"tcp", 31001, []string{"alpha"}},
		{"udp", 31001, []string{"alpha"}},
		{"tcp", sharedPort, []string{"beta", "gamma"}},
		{"udp", sharedPort, []string{"beta", "gamma"}},
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIENT SENDS TO\tPROTO\tANSWERED BY\tEXPECTED\t")
	var errs []error
	for _, p := range probes {
		got, err := d.echo(ctx, p.network, p.port, "hello")
		mark := "ok"
		ans := got
		if err != nil {
			ans, mark = "(no answer)", "FAIL"
			errs = append(errs, err)
		} else if !contains(p.want, got) {
			mark = "FAIL"
			errs = append(errs, fmt.Errorf("%s to port %d answered by %q, want %s", p.network, p.port, got, strings.Join(p.want, " or ")))
		}
		fmt.Fprintf(tw, "%s:%d\t%s\t%s\t%s\t%s\n", d.sb.HostIP, p.port, p.network, ans, strings.Join(p.want, " or "), mark)
	}
	tw.Flush()
	d.ui.block(b.String())
	return errors.Join(errs...)
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

func (d *demo) stepSpread(ctx context.Context) error {
	counts := map[string]int{}
	var errs []error
	for i := 0; i < spreadConns && ctx.Err() == nil; i++ {
		got, err := d.echo(ctx, "tcp", sharedPort, "conn-"+strconv.Itoa(i))
		if err != nil {
			errs = append(errs, err)
			counts["(no answer)"]++
			continue
		}
		counts[got]++
	}
	labels := []string{"beta", "gamma"}
	for k := range counts {
		if !contains(labels, k) {
			labels = append(labels, k)
		}
	}
	d.ui.linef("     %d TCP connections to %s:%d, by the container that answered:", spreadConns, d.sb.HostIP, sharedPort)
	d.ui.block(histogram(labels, counts, 30))
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d connections failed; first: %w", len(errs), spreadConns, errs[0])
	}
	for _, l := range labels {
		if l != "beta" && l != "gamma" {
			return fmt.Errorf("%d connection(s) answered by %q, which does not hold port %d", counts[l], l, sharedPort)
		}
	}
	if counts["beta"] == 0 || counts["gamma"] == 0 {
		return fmt.Errorf("the shared port did not spread: beta got %d, gamma %d of %d connections", counts["beta"], counts["gamma"], spreadConns)
	}
	return nil
}

func (d *demo) stepNetnsExec(ctx context.Context) error {
	var errs []error
	for _, c := range d.ctrs {
		argv := []string{"ip", "netns", "exec", c.id, "ss", "-ltn"}
		d.ui.command(argv...)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := exec.CommandContext(cctx, argv[0], argv[1:]...).CombinedOutput()
		cancel()
		d.ui.block(string(out))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", strings.Join(argv, " "), err))
			continue
		}
		if !strings.Contains(string(out), ":"+strconv.Itoa(c.port)) {
			errs = append(errs, fmt.Errorf("ss in %s does not list port %d", c.id, c.port))
		}
	}
	return errors.Join(errs...)
}

// scrapeMetrics fetches /metrics from the daemon's endpoint in the sandbox
// host namespace. The socket is opened on a thread inside that namespace
// (an http.Client would dial from another thread, in the wrong namespace);
// the request then runs over it from here.
func (d *demo) scrapeMetrics(ctx context.Context) (string, error) {
	var conn net.Conn
	err := d.sb.Host.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", metricsAddr, 2*time.Second)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("connect to the metrics endpoint %s in %s: %w (is --metrics-addr served?)", metricsAddr, d.sb.Host.Name, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return "", fmt.Errorf("GET /metrics: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return "", fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(resp.Body); err != nil {
		return "", fmt.Errorf("GET /metrics: reading the body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %s: %s", resp.Status, firstLine(body.String()))
	}
	return body.String(), nil
}

func (d *demo) stepMetrics(ctx context.Context) error {
	d.ui.command("curl", "-s", "http://"+metricsAddr+"/metrics", "  # from inside the sandbox host")
	body, err := d.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	// Show one sample from each of a few isolatord_ families, preferring
	// lines about our containers.
	families := map[string]bool{}
	var picked []string
	lines := strings.Split(body, "\n")
	for pass := 0; pass < 2 && len(picked) < 8; pass++ {
		for _, l := range lines {
			if !strings.HasPrefix(l, "isolatord_") {
				continue
			}
			fam := l
			if i := strings.IndexAny(l, "{ "); i > 0 {
				fam = l[:i]
			}
			fam = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(fam, "_bucket"), "_sum"), "_count")
			if families[fam] || (pass == 0 && !strings.Contains(l, d.sb.Name)) {
				continue
			}
			families[fam] = true
			picked = append(picked, l)
			if len(picked) == 8 {
				break
			}
		}
	}
	all := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "isolatord_") {
			all++
		}
	}
	if len(picked) == 0 {
		return fmt.Errorf("the endpoint answered (%d bytes) but exports no isolatord_ metric", len(body))
	}
	d.ui.block(strings.Join(picked, "\n"))
	d.ui.linef("     ... %d isolatord_ samples in all", all)
	return nil
}

// waitSent waits (at most 10 s) until the client has sent n requests.
func waitSent(sent *atomic.Int64, n int64) error {
	if !wait.Until(10*time.Second, func() bool { return sent.Load() >= n }) {
		return fmt.Errorf("the client sent %d requests in 10 s, want %d", sent.Load(), n)
	}
	return nil
}

func (d *demo) stepRestart(ctx context.Context) error {
	// Client traffic: alternate TCP requests to alpha and to the shared
	// port, every 10 ms, until told to stop.
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	tctx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 100000 && tctx.Err() == nil; i++ {
			port := 31001
			if i%2 == 1 {
				port = sharedPort
			}
			sent.Add(1)
			if _, err := d.echo(ctx, "tcp", port, "during-restart"); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			select {
			case <-tctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	defer func() { stopTraffic(); wg.Wait() }()

	// Let the client's requests flow before the kill.
	if err := waitSent(&sent, 20); err != nil {
		return err
	}
	pid := d.d.Pid()
	d.ui.command("kill", "-9", strconv.Itoa(pid))
	killedAt := time.Now()
	if err := d.d.Stop(syscall.SIGKILL); err != nil {
		return err
	}
	d.ui.linef("     isolatord is gone; the client keeps sending requests every 10 ms")
	if err := waitSent(&sent, sent.Load()+20); err != nil {
		return err
	}
	d.ui.command(append([]string{"nsenter", "--net=" + d.sb.Host.Path, "isolatord"}, "...same flags...")...)
	took, err := d.d.Start(daemonStartMax)
	if err != nil {
		return err
	}
	down := time.Since(killedAt)
	d.ui.linef("     serving again after %s (pid %d); down for %s in all", round(took), d.d.Pid(), round(down))
	for _, l := range strings.Split(d.d.Log(), "\n") {
		if strings.Contains(l, `"msg":"recovered"`) || strings.Contains(l, `"msg":"recovery complete"`) {
			d.ui.block("log: " + l)
		}
	}
	if err := waitSent(&sent, sent.Load()+20); err != nil {
		return err
	}
	stopTraffic()
	wg.Wait()
	d.ui.linef("     requests sent during the restart window: %d, failed: %d", sent.Load(), failed.Load())
	var errs []error
	if sent.Load() == 0 {
		errs = append(errs, errors.New("no request was sent during the restart"))
	}
	if n := failed.Load(); n > 0 {
		errs = append(errs, fmt.Errorf("%d of %d requests failed around the restart; first: %v", n, sent.Load(), firstErr.Load()))
	}
	if err := d.checkAllIsolated(ctx); err != nil {
		errs = append(errs, fmt.Errorf("after the restart: %w", err))
	} else {
		d.ui.linef("     after the restart isolatorctl list still shows all %d containers isolated", len(d.ctrs))
	}
	return errors.Join(errs...)
}

// isolatorctl runs isolatorctl against the demo's daemon and returns its
// stdout; the error carries its stderr.
func (d *demo) isolatorctl(ctx context.Context, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, d.ctl, append([]string{"--socket", d.socket, "--timeout", "15s"}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errOut.String())
		if msg == "" {
			msg = err.Error()
		}
		return out.String(), fmt.Errorf("isolatorctl %s: %s", strings.Join(args, " "), msg)
	}
	return out.String(), nil
}

// ---- cleanup ----

// hostState is what isolatord may add to the sandbox host namespace.
type hostState struct {
	veths   []string // links whose name starts with plane.VethPrefix
	filters int      // tc filter lines on eth0 and lo ingress
	lines   []string // those lines, "<dev>: <line>"
}

func readHostState(sb *sandbox.Sandbox) (hostState, error) {
	var hs hostState
	out, err := sb.Host.Command("ip", "-o", "link", "show").CombinedOutput()
	if err != nil {
		return hs, fmt.Errorf("ip link show in %s: %v: %s", sb.Host.Name, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 {
			name := strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
			if strings.HasPrefix(name, plane.VethPrefix) {
				hs.veths = append(hs.veths, name)
			}
		}
	}
	for _, dev := range []string{"eth0", "lo"} {
		out, err := sb.Host.Command("tc", "filter", "show", "dev", dev, "ingress").CombinedOutput()
		if err != nil {
			// No ingress qdisc: no filters.
			continue
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "filter ") {
				hs.filters++
				hs.lines = append(hs.lines, dev+": "+l)
			}
		}
	}
	sort.Strings(hs.veths)
	return hs, nil
}

// cleanup undoes everything the demo did and checks that nothing is left. It
// reports every problem it met; it never stops half-way.
func (d *demo) cleanup(ctx context.Context) error {
	var problems []string
	note := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT")
	row := func(check string, ok bool, detail string) {
		res := "ok"
		if !ok {
			res = "LEFT OVER"
		}
		if detail != "" {
			res += " (" + detail + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\n", check, res)
	}

	// 1. Each container through the API.
	if d.d != nil && d.d.Pid() != 0 {
		for _, c := range d.ctrs {
			if c.id == "" {
				continue
			}
			d.ui.command("isolatorctl", "cleanup", c.id)
			if _, err := d.isolatorctl(ctx, "cleanup", c.id); err != nil && !strings.Contains(err.Error(), "NotFound") {
				note("%v", err)
			}
		}
	} else if d.d != nil {
		note("isolatord was not running, so the containers could not be cleaned up through it")
	}

	// 2. The sandbox host has no veth and no filter rule of ours left. The
	// data plane deletes a hash table that became empty a little later
	// (the kernel keeps it busy for some milliseconds after its last
	// link goes): such tables hold no rule, route nothing, and must be
	// gone once isolatord has stopped.
	pendingTables := false
	if d.sb != nil && d.d != nil {
		hs, err := d.settledHostState(time.Second)
		if err != nil {
			note("%v", err)
		} else {
			row("veths in the sandbox host", len(hs.veths) == 0, strings.Join(hs.veths, ", "))
			if len(hs.veths) > 0 {
				note("veths left in %s: %s", d.sb.Host.Name, strings.Join(hs.veths, ", "))
			}
			if d.hasBase {
				rules, tables := splitTables(newLines(d.baseline.lines, hs.lines, 1000))
				row("tc filter rules on the host's eth0/lo", len(rules) == 0, fmt.Sprintf("%d beyond the %d from before the containers", len(rules), d.baseline.filters))
				if len(rules) > 0 {
					note("%d tc filter rules left on the sandbox host's eth0/lo ingress after cleanup, e.g.:\n%s", len(rules), strings.Join(first(rules, 8), "\n"))
				}
				if len(tables) > 0 {
					pendingTables = true
					row("empty hash tables", true, fmt.Sprintf("%d awaiting deferred deletion", len(tables)))
				}
			}
		}
	}

	// 3. Stop the daemon, the containers and the sandbox.
	if d.d != nil {
		if pid := d.d.Pid(); pid != 0 {
			d.ui.command("kill", "-TERM", strconv.Itoa(pid))
			if err := d.d.Stop(syscall.SIGTERM); err != nil {
				note("%v", err)
			}
		}
	}
	if pendingTables {
		if hs, err := readHostState(d.sb); err != nil {
			note("%v", err)
		} else {
			extra := newLines(d.baseline.lines, hs.lines, 1000)
			row("tc filters after isolatord stopped", len(extra) == 0, fmt.Sprintf("%d beyond the %d from before the containers", len(extra), d.baseline.filters))
			if len(extra) > 0 {
				note("%d tc filter lines left on the sandbox host's eth0/lo ingress after isolatord stopped, e.g.:\n%s", len(extra), strings.Join(first(extra, 8), "\n"))
			}
		}
	}
	var pids []int
	for _, c := range d.ctrs {
		if c.c != nil {
			pids = append(pids, c.c.Pid)
		}
	}
	if d.d != nil && d.d.LastPid() != 0 {
		pids = append(pids, d.d.LastPid())
	}
	// Namespace mounts of our containers that the cleanup did not remove
	// are removed here (so nothing stays behind) but reported.
	for _, c := range d.ctrs {
		if c.id == "" {
			continue
		}
		p := filepath.Join(netnsDir, c.id)
		if _, err := os.Lstat(p); err == nil {
			note("%s was still there after cleanup (removed now)", p)
			removeNetnsMount(p)
		}
	}
	if d.sb != nil {
		if err := d.sb.Close(); err != nil {
			note("sandbox teardown: %v", err)
		}
	}

	// 4. Nothing of the demo is left on the machine.
	if d.sb != nil {
		out, err := exec.CommandContext(ctx, "ip", "netns", "list").CombinedOutput()
		var ours []string
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], d.sb.Name) {
				ours = append(ours, f[0])
			}
		}
		if err != nil {
			note("ip netns list: %v", err)
		}
		row("ip netns list", len(ours) == 0 && err == nil, strings.Join(ours, ", "))
		if len(ours) > 0 {
			note("namespaces left: %s", strings.Join(ours, ", "))
		}
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		n := strings.Count(string(mi), d.sb.Name)
		row("mounts naming "+d.sb.Name, n == 0, "")
		if n > 0 {
			note("%d mount(s) still name %s", n, d.sb.Name)
		}
	}
	alive := 0
	for _, p := range pids {
		if syscall.Kill(p, 0) == nil {
			if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil && !strings.Contains(string(st), ") Z ") {
				alive++
			}
		}
	}
	row("processes started by the demo", alive == 0, fmt.Sprintf("%d started, %d alive", len(pids), alive))
	if alive > 0 {
		note("%d process(es) of the demo still alive", alive)
	}
	if d.tmp != "" {
		if err := os.RemoveAll(d.tmp); err != nil {
			note("remove %s: %v", d.tmp, err)
		}
		_, err := os.Stat(d.tmp)
		row("temp dir "+d.tmp, os.IsNotExist(err), "")
	}
	tw.Flush()
	d.ui.block(b.String())
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// settledHostState reads the sandbox host's state until its filters are
// back to the baseline or wait has passed (deferred kernel work).
func (d *demo) settledHostState(wait time.Duration) (hostState, error) {
	deadline := time.Now().Add(wait)
	for {
		hs, err := readHostState(d.sb)
		if err != nil || !d.hasBase || hs.filters <= d.baseline.filters || time.Now().After(deadline) {
			return hs, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// splitTables separates tc filter lines that only declare a u32 hash table
// ("... fh 200: ht divisor 64") from the rules.
func splitTables(lines []string) (rules, tables []string) {
	for _, l := range lines {
		if strings.Contains(l, " ht divisor ") {
			tables = append(tables, l)
		} else {
			rules = append(rules, l)
		}
	}
	return rules, tables
}

func first(l []string, n int) []string {
	if len(l) > n {
		return l[:n]
	}
	return l
}

// newLines returns up to max lines of after that are not in before (as a
// multiset).
func newLines(before, after []string, max int) []string {
	seen := map[string]int{}
	for _, l := range before {
		seen[l]++
	}
	var out []string
	for _, l := range after {
		if seen[l] > 0 {
			seen[l]--
			continue
		}
		if len(out) < max {
			out = append(out, l)
		}
	}
	return out
}

// removeNetnsMount unmounts (all stacked mounts, bounded) and removes a
// namespace handle file.
func removeNetnsMount(p string) {
	for i := 0; i < 8; i++ {
		if syscall.Unmount(p, syscall.MNT_DETACH) != nil {
			break
		}
	}
	os.Remove(p)
}

// sweepStaleDemoMounts removes /var/run/netns/isodemo-XXXXXX-<name> handles
// left by a demo that was killed before its cleanup (its daemon died with it,
// so nothing else would ever remove them). Only names of this demo whose
// sandbox is no longer registered as alive are touched.
func sweepStaleDemoMounts() int {
	ents, err := os.ReadDir(netnsDir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		name := e.Name()
		var sbName, ctrName string
		for _, suffix := range []string{"-alpha", "-beta", "-gamma"} {
			if strings.HasPrefix(name, "isodemo-") && strings.HasSuffix(name, suffix) && len(name) == len("isodemo-XXXXXX")+len(suffix) {
				sbName, ctrName = strings.TrimSuffix(name, suffix), suffix
			}
		}
		if ctrName == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(sandbox.RegistryDir, sbName)); err == nil {
			continue // its demo may still be running
		}
		if _, err := os.Stat(filepath.Join(netnsDir, sbName+"-host")); err == nil {
			continue
		}
		removeNetnsMount(filepath.Join(netnsDir, name))
		n++
	}
	return n
}
