package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/isolatord/isolatord/test/sandbox"
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
