// Command isobench is the system benchmark of `make bench`: one run that
// measures isolatord's control plane through its real gRPC API and its data
// plane with real TCP traffic, all inside sandboxes of network namespaces
// (test/sandbox; the machine's real eth0 is never touched), prints markdown
// tables with every figure marked PASS or MISS against its target, and
// writes the figures as JSON (bench/results/<time>.json and latest.json).
//
// Layout. Three sandboxes of identical topology (client namespace <-veth->
// host namespace), so that every data-plane case can be measured in the
// same run, interleaved round by round:
//
//	A   no isolatord at all: a server in its host namespace is case (a),
//	    the physical limit;
//	S1  an isolatord with one container running a server: case (b);
//	SN  an isolatord with N (1,000) containers, the last of which runs a
//	    server: case (c); a server in SN's host namespace is case (d).
//
// Every server is `isotraffic serve` and every client loop is the traffic
// package's RequestResponse, ConnectRate and Bulk, run from the client
// namespace of the sandbox. The sandboxes are dual-stack (IPv6 from
// 2001:db8::/32, so the daemons give their containers IPv6 too) and every
// case is measured over IPv4 and over IPv6 (family.go), to the same server.
// Each case of each family is measured in `--rounds` rounds whose case
// order rotates (a,b,c,d,a6,b6,c6,d6 then b,c,...), and the median is kept.
//
// Control plane. The N containers are set up in SN one by one (the total
// time is reported); then `--cycles` setups (Prepare + Isolate) and
// teardowns (Cleanup) of a lone container in S1 (still empty) and of one
// more container in SN (N present) alternate cycle by cycle, so that both
// latencies see the same machine; each cycle uses a fresh namespace made
// beforehand. The N containers' namespaces are bind-mounted namespace files
// (no process), isolated by path; the servers' containers are processes
// (sandbox.Spawn) isolated by pid. With N present the daemon's RSS is read
// from /proc; after the data plane is measured it is killed with SIGKILL
// and restarted: the time until it logs "serving", and the recovery time it
// logs itself, are the restart figures.
//
// The control phase (control.go; --only control runs it alone) measures the
// control plane as runtimes drive it: namespaces held by processes, the
// latency curve against containers present (drawn as an SVG next to the
// JSON), bursts, a drain, reads during them, and CNI through libcni.
//
// Figures that cannot be measured (a feature missing, an error) are
// reported as n/a with the reason; the exit status is 1 then. Missing a
// target is a result, not an error: the exit status stays 0.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Port plan. The ephemeral pool holds 1024 blocks of 32; the static ports lie
// below it; the sandbox hosts' own ip_local_port_range (61000-61999) lies
// above it; the host servers listen on a port nobody manages.
const (
	ephemeralPool  = "20480-53247"
	blockSize      = 32
	staticPorts    = "10000-11023"
	firstStatic    = 10000 // container i of SN holds firstStatic+i
	cyclePort      = 11000 // the static port of the cycle containers
	hostServerPort = 9000
	maxContainers  = 1000
	metricsAddr    = "127.0.0.1:9617" // inside each sandbox host
)

type options struct {
	quick      bool
	n          int
	cycles     int
	rounds     int
	dur        time.Duration
	bin        string
	isotraffic string
	out        string
	micro      string
	timeout    time.Duration
	from       string
	only       string // run only this measurement phase (and what it needs)
	// cniBefore is a directory holding an earlier build's isolator-cni
	// (and isolatorctl) to measure beside the current one; cniBeforeRev
	// names it in the report.
	cniBefore, cniBeforeRev string
}

// phaseNeeds are the phases a phase selected with --only needs first.
var phaseNeeds = map[string][]string{
	"data_plane":    {"prepare", "daemons", "n_containers", "one_container", "teardown"},
	"saddr6":        {"prepare", "daemons", "n_containers", "one_container", "teardown"},
	"shared_ports":  {"prepare", "daemons", "one_container", "teardown"},
	"handoff":       {"prepare", "daemons", "one_container", "teardown"},
	"amplification": {"prepare", "daemons", "n_containers", "one_container", "teardown"},
	"cycles":        {"prepare", "daemons", "n_containers", "teardown"},
	"control":       {"prepare"}, // its own sandbox and daemon (control.go)
	"cni":           {"prepare"}, // the control phase's CNI figures alone (cni.go)
	"restart":       {"prepare", "daemons", "n_containers", "teardown"},
	"rebuild":       {"prepare", "daemons", "n_containers", "restart", "teardown"}, // both recoveries, one set-up
}

// runs reports whether phase runs in this run (--only).
func (o *options) runs(phase string) bool {
	if o.only == "" || phase == o.only {
		return true
	}
	for _, p := range phaseNeeds[o.only] {
		if p == phase {
			return true
		}
	}
	return false
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("isobench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.quick, "quick", false, "small and short run (N=100, short measurements) to check the tool itself")
	fs.IntVar(&o.n, "n", 0, "containers present for the N figures (default 1000, 100 with --quick; at most 1000)")
	fs.IntVar(&o.cycles, "cycles", 0, "setup/teardown samples at N=1 and at N (default 100, 20 with --quick)")
	fs.IntVar(&o.rounds, "rounds", 0, "interleaved data-plane rounds (default 15, 2 with --quick)")
	fs.DurationVar(&o.dur, "dur", 0, "length of one data-plane measurement (default 400ms, 200ms with --quick)")
	fs.StringVar(&o.bin, "bin", "bin", "directory holding the built isolatord (make build)")
	fs.StringVar(&o.isotraffic, "isotraffic", "", "isotraffic binary (default: next to isobench)")
	fs.StringVar(&o.out, "out", "bench/results", "directory for the JSON results (empty: do not write)")
	fs.StringVar(&o.micro, "micro", "", "file with `go test -bench` output to include")
	fs.StringVar(&o.from, "from", "", "print the tables of an earlier run's JSON `file` (e.g. bench/results/latest.json) and exit")
	fs.StringVar(&o.only, "only", "", "run only this phase and the phases it needs: data_plane, saddr6, shared_ports, handoff, amplification, cycles, restart, rebuild (after restart), control or cni (the CNI figures alone)")
	fs.StringVar(&o.cniBefore, "cni-before", "", "directory with an earlier build's isolator-cni and isolatorctl to measure beside the current ones (scripts/bench.sh builds it when CNI_BEFORE=<rev>)")
	fs.StringVar(&o.cniBeforeRev, "cni-before-rev", "", "the commit --cni-before was built from, for the report")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long (default 20m, 3m with --quick); the cleanup still runs")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	def := func(v *int, full, quick int) {
		if *v == 0 {
			*v = full
			if o.quick {
				*v = quick
			}
		}
	}
	def(&o.n, 1000, 100)
	def(&o.cycles, 100, 20)
	def(&o.rounds, 15, 2)
	if o.dur == 0 {
		o.dur = 400 * time.Millisecond
		if o.quick {
			o.dur = 200 * time.Millisecond
		}
	}
	if o.timeout == 0 {
		o.timeout = 20 * time.Minute
		if o.quick {
			o.timeout = 3 * time.Minute
		}
	}
	switch {
	case o.n < 2 || o.n > maxContainers:
		return nil, fmt.Errorf("--n %d: must be 2..%d (the static ports %s give one to each)", o.n, maxContainers, staticPorts)
	case o.cycles < 1 || o.cycles > 10000:
		return nil, fmt.Errorf("--cycles %d: must be 1..10000", o.cycles)
	case o.rounds < 1 || o.rounds > 100:
		return nil, fmt.Errorf("--rounds %d: must be 1..100", o.rounds)
	case o.dur < 10*time.Millisecond || o.dur > time.Minute:
		return nil, fmt.Errorf("--dur %v: must be 10ms..1m", o.dur)
	}
	if _, ok := phaseNeeds[o.only]; o.only != "" && !ok {
		return nil, fmt.Errorf("--only %q: not a selectable phase (data_plane, saddr6, shared_ports, handoff, amplification, cycles, restart, rebuild, control, cni)", o.only)
	}
	if o.isotraffic == "" {
		if exe, err := os.Executable(); err == nil {
			o.isotraffic = filepath.Join(filepath.Dir(exe), "isotraffic")
		}
	}
	return o, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == readProbeCmd {
		os.Exit(readProbeMain(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "isobench:", err)
		return 2
	}
	if o.from != "" {
		data, err := os.ReadFile(o.from)
		if err != nil {
			fmt.Fprintln(stderr, "isobench:", err)
			return 1
		}
		var r Results
		if err := json.Unmarshal(data, &r); err != nil {
			fmt.Fprintf(stderr, "isobench: %s: %v\n", o.from, err)
			return 1
		}
		r.writeMarkdown(stdout)
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "isobench: must run as root: it creates network namespaces and starts isolatord inside them (never touching the real eth0)")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	b := newBench(o, stderr)
	b.res.LoadAverage.Start = loadAverage()
	b.run(ctx)
	cleanupErr := b.cleanup()
	if cleanupErr != nil {
		b.fail("cleanup: %v", cleanupErr)
	}
	b.res.TotalSeconds = time.Since(b.began).Seconds()
	b.res.LoadAverage.End = loadAverage()
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		fmt.Fprintln(stderr, "isobench: interrupted; nothing written")
		return 130
	}
	b.res.Busy = b.res.isBusy()
	b.res.computeRatios()
	b.res.evaluate()
	b.res.writeMarkdown(stdout)
	if o.out != "" {
		paths, err := writeJSON(o.out, b.res)
		if err != nil {
			fmt.Fprintf(stderr, "isobench: write results: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "\nJSON: %s\n", strings.Join(paths, ", "))
		if b.res.Control != nil && b.res.Control.SVG != "" {
			fmt.Fprintf(stdout, "SVG: %s\n", b.res.Control.SVG)
		}
	}
	if len(b.res.Errors) > 0 {
		return 1
	}
	return 0
}

// writeJSON writes r to dir/<time>.json and dir/latest.json (with -quick in
// both names in quick mode, and the phases of --only, so a quick or partial
// run never replaces the full figures).
func writeJSON(dir string, r *Results) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	data = append(data, '\n')
	t, _ := time.Parse(time.RFC3339, r.Date)
	suffix := ""
	if r.Quick {
		suffix = "-quick"
	}
	if len(r.Config.Only) > 0 { // a partial run never replaces the full figures either
		suffix += "-" + strings.Join(r.Config.Only, "+")
	}
	stamp := filepath.Join(dir, t.UTC().Format("2006-01-02T150405Z")+suffix+".json")
	latest := filepath.Join(dir, "latest"+suffix+".json")
	if r.Control != nil && len(r.Control.Curve) > 0 {
		r.Control.SVG = strings.TrimSuffix(stamp, ".json") + "-latency.svg"
		data, err = json.MarshalIndent(r, "", "  ")
		if err != nil {
			return nil, err
		}
		data = append(data, '\n')
		if err := r.Control.writeSVG(r.Control.SVG); err != nil {
			return nil, err
		}
		if err := r.Control.writeSVG(strings.TrimSuffix(latest, ".json") + "-latency.svg"); err != nil {
			return nil, err
		}
	}
	for _, p := range []string{stamp, latest} {
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, p); err != nil {
			return nil, err
		}
	}
	return []string{stamp, latest}, nil
}

// loadAverage is the 1-minute load average (0 if unknown).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// machine describes this machine.
func machine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version()}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if m.CPU == "" {
		m.CPU = runtime.GOARCH
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				m.MemoryMiB = kb >> 10
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return m
}
