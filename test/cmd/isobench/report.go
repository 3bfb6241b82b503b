package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// Results is everything one run measured; it is written as JSON to
// bench/results/<date>.json and bench/results/latest.json. Figures that could
// not be measured are null and the reason is in Errors.
type Results struct {
	Schema       int          `json:"schema"`
	Date         string       `json:"date"` // RFC 3339, UTC
	Quick        bool         `json:"quick"`
	Machine      Machine      `json:"machine"`
	Config       Config       `json:"config"`
	ControlPlane ControlPlane `json:"control_plane"`
	DataPlane    DataPlane    `json:"data_plane"` // over IPv4
	// The same cases over IPv6 (family.go); nil in results of runs made
	// before IPv6 was measured.
	DataPlane6 *DataPlane    `json:"data_plane_ipv6"`
	Shared     *SharedPorts  `json:"shared_ports"`          // see shared.go
	Handoff    *Handoff      `json:"handoff"`               // see handoff.go
	Saddr6     *Saddr6       `json:"ipv6_source_selection"` // see saddr6.go
	Control    *ControlScale `json:"control_scale"`         // see control.go
	// ARP/ICMP copies and softirq CPU at 1 and N (amplify.go)
	Amplification *Amplification     `json:"amplification"`
	Targets       []Target           `json:"targets"`
	Micro         []MicroBenchmark   `json:"micro_benchmarks"`
	Phases        map[string]float64 `json:"phase_seconds"` // wall time of each phase
	TotalSeconds  float64            `json:"total_seconds"`
	// The machine's 1-minute load average when the run started and ended:
	// other work on the machine is the main source of noise.
	LoadAverage LoadAverage `json:"load_average"`
	Errors      []string    `json:"errors"`
	// Busy: the load average says other work shared the machine (see
	// isBusy); the figures are then not conclusive.
	Busy bool `json:"busy"`
}

// LoadAverage is /proc/loadavg's 1-minute figure at two moments.
type LoadAverage struct {
	Start float64 `json:"start"`
	End   float64 `json:"end"`
}

// Machine describes where the run happened.
type Machine struct {
	Hostname  string `json:"hostname"`
	CPU       string `json:"cpu"`
	Cores     int    `json:"cores"`
	MemoryMiB int64  `json:"memory_mib"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
}

// Config is what the run was asked to do.
type Config struct {
	Containers      int      `json:"containers"`       // N
	Cycles          int      `json:"cycles"`           // setup/teardown samples per N
	Rounds          int      `json:"rounds"`           // interleaved data-plane rounds
	DurationSeconds float64  `json:"duration_seconds"` // per data-plane measurement
	BlockSize       int      `json:"block_size"`       // ephemeral ports per container
	EphemeralPool   string   `json:"ephemeral_pool"`   //
	StaticPorts     string   `json:"static_ports"`     // managed static ports
	HostPortRange   string   `json:"host_port_range"`  // the sandbox host's ip_local_port_range
	Namespaces      string   `json:"namespaces"`       // how container namespaces were made
	Only            []string `json:"only,omitempty"`   // the phases run (--only; empty: all)
}

// ranBase reports whether the phases before the control phase ran (not
// with --only control or --only cni, which run in a sandbox of their own).
func (c Config) ranBase() bool {
	return len(c.Only) == 0 || len(c.Only) > 1 || (c.Only[0] != "control" && c.Only[0] != "cni")
}

// Latency summarizes samples in milliseconds.
type Latency struct {
	Samples int     `json:"samples"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MeanMs  float64 `json:"mean_ms"`
	MaxMs   float64 `json:"max_ms"`
}

// ControlPlane are the API figures. Pointers are nil when not measured.
type ControlPlane struct {
	SetupN1    *Latency `json:"setup_n1"`    // prepare+isolate, the only container
	TeardownN1 *Latency `json:"teardown_n1"` // cleanup, the only container
	SetupNN    *Latency `json:"setup_nn"`    // prepare+isolate with N present
	TeardownNN *Latency `json:"teardown_nn"` // cleanup with N present
	// The two calls of a setup, separately.
	PrepareN1 *Latency `json:"prepare_n1"`
	IsolateN1 *Latency `json:"isolate_n1"`
	PrepareNN *Latency `json:"prepare_nn"`
	IsolateNN *Latency `json:"isolate_nn"`
	// Ratios of the p50s, N present over N=1.
	SetupRatio    *float64 `json:"setup_ratio"`
	TeardownRatio *float64 `json:"teardown_ratio"`
	// Setting up N containers one after the other (API calls only; the
	// namespaces exist before).
	SetupAllSeconds *float64 `json:"setup_all_seconds"`
	SetupAllFirst   *Latency `json:"setup_all_first_tenth"` // the first N/10 of them
	SetupAllLast    *Latency `json:"setup_all_last_tenth"`  // the last N/10
	// Cleaning up the N containers at the end, one after the other.
	TeardownAllSeconds *float64 `json:"teardown_all_seconds"`
	// Making the N namespaces (not part of any figure above).
	NamespacesSeconds *float64 `json:"namespaces_seconds"`
	// Restart with N containers: wall time from starting the process to its
	// "serving" log line (the API is down until then), and the recovery time
	// the daemon logged.
	RecoverySeconds         *float64 `json:"recovery_seconds"`
	RecoveryReportedSeconds *float64 `json:"recovery_reported_seconds"`
	RecoveredContainers     *int     `json:"recovered_containers"`
	// Restart with N containers and no state (rebuilt from the kernel
	// alone): the same two times, and how many came back.
	RebuildSeconds         *float64 `json:"rebuild_seconds"`
	RebuildReportedSeconds *float64 `json:"rebuild_reported_seconds"`
	RebuiltContainers      *int     `json:"rebuilt_containers"`
	// Daemon memory with N containers (VmRSS), and after the restart.
	RSSMiB             *float64 `json:"rss_mib"`
	RSSPeakMiB         *float64 `json:"rss_peak_mib"`
	RSSAfterRestartMiB *float64 `json:"rss_after_restart_mib"`
}

// Case names of the data-plane measurements.
const (
	caseA = "a" // host server, no isolator state
	caseB = "b" // container server, 1 container
	caseC = "c" // container server, N containers
	caseD = "d" // host server, N containers present
)

var cases = []string{caseA, caseB, caseC, caseD}

// Metric names of the data-plane measurements.
const (
	metricRR   = "rr"   // TCP request/response, transactions/s
	metricCRR  = "crr"  // TCP connect/request/response, connections/s
	metricBulk = "bulk" // one TCP stream, bytes/s
	// metricFragRR: UDP request/response, a request of fragRequest bytes
	// (fragmented) and a 1-byte reply, transactions/s (fragrr.go)
	metricFragRR = "frag_rr"
)

var metrics = []string{metricRR, metricCRR, metricBulk, metricFragRR}

// Rate is one case of one metric: every round's sample, their median, the
// best round and the spread (interquartile range / median), which says how
// noisy the machine was.
type Rate struct {
	Median  *float64  `json:"median"`
	Best    *float64  `json:"best"`
	Spread  *float64  `json:"spread"`
	Samples []float64 `json:"samples"`
}

// DataPlane holds, per metric, the rate of each case and the ratios.
type DataPlane struct {
	Units map[string]string           `json:"units"`
	Rates map[string]map[string]*Rate `json:"rates"` // metric -> case -> rate
	// Ratios are ratios of the medians (what the targets are checked on):
	// metric -> "b/a", "c/b", "c/a", "d/a".
	Ratios map[string]map[string]*float64 `json:"ratios"`
	// RatiosPaired are medians of the per-round ratios, RatiosBest ratios
	// of the best rounds: two other views of the same samples, for judging
	// how much the noise moves the ratios.
	RatiosPaired map[string]map[string]*float64 `json:"ratios_paired"`
	RatiosBest   map[string]map[string]*float64 `json:"ratios_best"`
	Paths        map[string]string              `json:"paths"` // case -> what it measures
	// CPU time each daemon used while the data plane was measured (it
	// should be idle: the data plane is all in the kernel).
	// Both families' rounds are one measurement: the IPv4 part holds it.
	DaemonCPUSeconds map[string]*float64 `json:"daemon_cpu_seconds,omitempty"` // "s1", "sn"
}

var ratioNames = []string{"b/a", "c/b", "c/a", "d/a"}

// Target is one figure checked against its goal.
type Target struct {
	Name   string   `json:"name"`
	Value  *float64 `json:"value"` // nil: not measured
	Unit   string   `json:"unit"`
	Goal   string   `json:"goal"`   // e.g. "<= 5"
	Status string   `json:"status"` // PASS, MISS, NOT MEASURED
}

// MicroBenchmark is one line of `go test -bench` output.
type MicroBenchmark struct {
	Package    string             `json:"package"`
	Name       string             `json:"name"`
	Iterations int64              `json:"iterations"`
	Metrics    map[string]float64 `json:"metrics"` // unit -> value, e.g. "ns/op"
}

// newDataPlane makes the data-plane figures of family f, all null.
func newDataPlane(f family) DataPlane {
	over := " over " + f.label()
	dp := DataPlane{
		Units:        map[string]string{metricRR: "transactions/s", metricCRR: "connections/s", metricBulk: "bytes/s", metricFragRR: "transactions/s"},
		Rates:        map[string]map[string]*Rate{},
		Ratios:       map[string]map[string]*float64{},
		RatiosPaired: map[string]map[string]*float64{},
		RatiosBest:   map[string]map[string]*float64{},
		Paths: map[string]string{
			caseA: "client -> server in the host namespace, no isolator state (physical limit)" + over,
			caseB: "client -> server in a container through the isolator, 1 container" + over,
			caseC: "client -> server in a container through the isolator, N containers" + over,
			caseD: "client -> server in the host namespace, N containers present" + over,
		},
	}
	if f == ipv4 {
		dp.DaemonCPUSeconds = map[string]*float64{"s1": nil, "sn": nil}
	}
	for _, m := range metrics {
		dp.Rates[m] = map[string]*Rate{}
		dp.Ratios[m] = map[string]*float64{}
		dp.RatiosPaired[m] = map[string]*float64{}
		dp.RatiosBest[m] = map[string]*float64{}
		for _, c := range cases {
			dp.Rates[m][c] = &Rate{Samples: []float64{}}
		}
		for _, r := range ratioNames {
			dp.Ratios[m][r] = nil
			dp.RatiosPaired[m][r] = nil
			dp.RatiosBest[m][r] = nil
		}
	}
	return dp
}

// summarize turns samples into a Latency.
func summarize(ds []time.Duration) *Latency {
	if len(ds) == 0 {
		return nil
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	return &Latency{
		Samples: len(s),
		P50Ms:   ms(percentile(s, 50)),
		P99Ms:   ms(percentile(s, 99)),
		MeanMs:  ms(sum / time.Duration(len(s))),
		MaxMs:   ms(s[len(s)-1]),
	}
}

// percentile is the nearest-rank percentile of sorted samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	if rank > len(sorted) {
		rank = len(sorted)
	}
	return sorted[rank-1]
}

func median(xs []float64) *float64 {
	if len(xs) == 0 {
		return nil
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return &m
}

func ptr[T any](v T) *T { return &v }

func ratio(a, b *float64) *float64 {
	if a == nil || b == nil || *b == 0 {
		return nil
	}
	return ptr(*a / *b)
}

// computeRatios computes the derived figures: those of the data plane of
// each family, and the control plane's ratios.
func (r *Results) computeRatios() {
	r.DataPlane.computeRatios()
	if r.DataPlane6 != nil {
		r.DataPlane6.computeRatios()
	}
	cp := &r.ControlPlane
	if cp.SetupN1 != nil && cp.SetupNN != nil {
		cp.SetupRatio = ratio(&cp.SetupNN.P50Ms, &cp.SetupN1.P50Ms)
	}
	if cp.TeardownN1 != nil && cp.TeardownNN != nil {
		cp.TeardownRatio = ratio(&cp.TeardownNN.P50Ms, &cp.TeardownN1.P50Ms)
	}
}

// computeRatios fills the best round and spread of every rate that has a
// median, and the three kinds of ratios (see DataPlane).
func (dp *DataPlane) computeRatios() {
	for _, m := range metrics {
		rates := dp.Rates[m]
		for _, c := range cases {
			rt := rates[c]
			if rt.Median == nil || len(rt.Samples) == 0 {
				continue
			}
			s := append([]float64(nil), rt.Samples...)
			sort.Float64s(s)
			rt.Best = ptr(s[len(s)-1])
			if *rt.Median > 0 {
				q := func(p float64) float64 { return s[int(math.Round(p*float64(len(s)-1)))] }
				rt.Spread = ptr((q(0.75) - q(0.25)) / *rt.Median)
			}
		}
		paired := func(x, y string) *float64 {
			xs, ys := rates[x].Samples, rates[y].Samples
			if rates[x].Median == nil || rates[y].Median == nil || len(xs) != len(ys) || len(xs) == 0 {
				return nil
			}
			var qs []float64
			for i := range xs {
				if ys[i] > 0 {
					qs = append(qs, xs[i]/ys[i])
				}
			}
			return median(qs)
		}
		for _, rn := range ratioNames {
			x, y := rn[:1], rn[2:]
			dp.Ratios[m][rn] = ratio(rates[x].Median, rates[y].Median)
			dp.RatiosPaired[m][rn] = paired(x, y)
			dp.RatiosBest[m][rn] = ratio(rates[x].Best, rates[y].Best)
		}
	}
}

// evaluate checks every figure against its target.
func (r *Results) evaluate() {
	cp := r.ControlPlane
	p50 := func(l *Latency) *float64 {
		if l == nil {
			return nil
		}
		return ptr(l.P50Ms)
	}
	n := r.Config.Containers
	add := func(name string, v *float64, unit string, atMost bool, goal float64) {
		t := Target{Name: name, Value: v, Unit: unit}
		if atMost {
			t.Goal = fmt.Sprintf("<= %g", goal)
		} else {
			t.Goal = fmt.Sprintf(">= %g", goal)
		}
		switch {
		case v == nil:
			t.Status = "NOT MEASURED"
		case atMost && *v <= goal, !atMost && *v >= goal:
			t.Status = "PASS"
		default:
			t.Status = "MISS"
		}
		r.Targets = append(r.Targets, t)
	}
	r.Control.evaluate(n, add)
	if !r.Config.ranBase() {
		return
	}
	add("setup p50, N=1", p50(cp.SetupN1), "ms", true, 5)
	add(fmt.Sprintf("setup p50, N=%d", n), p50(cp.SetupNN), "ms", true, 5)
	add(fmt.Sprintf("setup p50 N=%d / N=1", n), cp.SetupRatio, "x", true, 1.3)
	add("teardown p50, N=1", p50(cp.TeardownN1), "ms", true, 5)
	add(fmt.Sprintf("teardown p50, N=%d", n), p50(cp.TeardownNN), "ms", true, 5)
	add(fmt.Sprintf("teardown p50 N=%d / N=1", n), cp.TeardownRatio, "x", true, 1.3)
	add(fmt.Sprintf("restart recovery with %d", n), cp.RecoverySeconds, "s", true, 0.5)
	add(fmt.Sprintf("rebuild from the kernel with %d", n), cp.RebuildSeconds, "s", true, 2)
	add(fmt.Sprintf("daemon RSS with %d", n), cp.RSSMiB, "MiB", true, 64)
	for _, f := range families {
		dp := r.dataPlane(f)
		if dp == nil {
			continue
		}
		dr, sfx := dp.Ratios, f.targetSuffix()
		add("request/response (b)/(a)"+sfx, dr[metricRR]["b/a"], "x", false, 0.95)
		add("bulk (b)/(a)"+sfx, dr[metricBulk]["b/a"], "x", false, 0.95)
		add(metricLabel(metricFragRR)+" (b)/(a)"+sfx, dr[metricFragRR]["b/a"], "x", false, 0.9)
		for _, m := range metrics {
			add(metricLabel(m)+" (c)/(b)"+sfx, dr[m]["c/b"], "x", false, 0.9)
		}
		for _, m := range metrics {
			add(metricLabel(m)+" (d)/(a)"+sfx, dr[m]["d/a"], "x", false, 0.95)
		}
	}
}

func metricLabel(m string) string {
	switch m {
	case metricRR:
		return "request/response"
	case metricCRR:
		return "new connections"
	case metricBulk:
		return "bulk"
	case metricFragRR:
		return fragLabel
	}
	return m
}

// isBusy reports whether other work loaded the machine during the run: a
// 1-minute load average above half the cores at the start or the end (the
// benchmark itself keeps about one core busy).
func (r *Results) isBusy() bool {
	return r.LoadAverage.Start > r.busyLimit() || r.LoadAverage.End > r.busyLimit()
}

func (r *Results) busyLimit() float64 { return float64(r.Machine.Cores)/2 + 1 }

// targetStatus returns the status of the named target ("" if none).
func (r *Results) targetStatus(name string) string {
	for _, t := range r.Targets {
		if t.Name == name {
			return t.Status
		}
	}
	return ""
}

// ---- markdown ----

func fmtMs(l *Latency) string {
	if l == nil {
		return "n/a"
	}
	return fmt.Sprintf("%s / %s ms", fmtNum(l.P50Ms), fmtNum(l.P99Ms))
}

// fmtNum prints a figure with about three significant digits.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100000:
		return groupThousands(fmt.Sprintf("%.0f", v))
	case a >= 100:
		return groupThousands(fmt.Sprintf("%.0f", v))
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func groupThousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtOpt(v *float64, unit string) string {
	if v == nil {
		return "n/a"
	}
	return fmtNum(*v) + unit
}

// fmtRate prints a data-plane rate in the metric's display unit.
func fmtRate(m string, v *float64) string {
	if v == nil {
		return "n/a"
	}
	if m == metricBulk {
		return fmt.Sprintf("%.2f Gbit/s", *v*8/1e9)
	}
	return fmtNum(*v) + "/s"
}

func statusCell(s string) string {
	if s == "" {
		return ""
	}
	if s == "PASS" {
		return "PASS"
	}
	return "**" + s + "**"
}

// writeMarkdown prints the tables: control plane, data-plane rates, ratios
// against targets, and the micro-benchmarks.
func (r *Results) writeMarkdown(w io.Writer) {
	m := r.Machine
	mode := ""
	if r.Quick {
		mode = " (quick mode: small N, short runs; not for the README)"
	}
	fmt.Fprintf(w, "Run of %s on %s: %s, %d cores, %s GiB RAM, Linux %s, %s; load average %.1f at the start, %.1f at the end%s.\n\n",
		r.Date[:10], m.Hostname, m.CPU, m.Cores, fmt.Sprintf("%.1f", float64(m.MemoryMiB)/1024), m.Kernel, m.Go,
		r.LoadAverage.Start, r.LoadAverage.End, mode)
	if r.Busy {
		fmt.Fprintf(w, "> **The machine was busy with other work** (load average above %g on %d cores, of which the benchmark itself uses about one): latencies and rates are inflated and noisy, and the data-plane ratios are not conclusive. Run `make bench` on an idle machine for figures to compare against the targets.\n\n", r.busyLimit(), m.Cores)
	}

	r.Control.writeMarkdown(w, r)
	if r.Config.ranBase() {
		r.writeBaseMarkdown(w)
	}
	r.writeTargetsMarkdown(w)
}

// writeBaseMarkdown prints the tables of the phases before the control phase.
func (r *Results) writeBaseMarkdown(w io.Writer) {
	n := r.Config.Containers
	nn := groupThousands(fmt.Sprint(n))
	cp := r.ControlPlane
	fmt.Fprintf(w, "**Control plane** (through the gRPC API; setup = Prepare+Isolate, teardown = Cleanup; p50 / p99 of %d samples)\n\n", r.Config.Cycles)
	fmt.Fprintln(w, "| Figure | Value | Target | |")
	fmt.Fprintln(w, "|---|---|---|---|")
	row := func(fig, val, goal, st string) {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", fig, val, goal, statusCell(st))
	}
	row("Setup, N=1", fmtMs(cp.SetupN1), "p50 <= 5 ms", r.targetStatus("setup p50, N=1"))
	row("Setup, "+nn+" present", fmtMs(cp.SetupNN), "p50 <= 5 ms", r.targetStatus(fmt.Sprintf("setup p50, N=%d", n)))
	row("Setup p50, "+nn+" / 1", fmtOpt(cp.SetupRatio, "x"), "<= 1.3x", r.targetStatus(fmt.Sprintf("setup p50 N=%d / N=1", n)))
	row("Teardown, N=1", fmtMs(cp.TeardownN1), "p50 <= 5 ms", r.targetStatus("teardown p50, N=1"))
	row("Teardown, "+nn+" present", fmtMs(cp.TeardownNN), "p50 <= 5 ms", r.targetStatus(fmt.Sprintf("teardown p50, N=%d", n)))
	row("Teardown p50, "+nn+" / 1", fmtOpt(cp.TeardownRatio, "x"), "<= 1.3x", r.targetStatus(fmt.Sprintf("teardown p50 N=%d / N=1", n)))
	total := "n/a"
	if cp.SetupAllSeconds != nil {
		total = fmt.Sprintf("%.2f s (%s ms each", *cp.SetupAllSeconds, fmtNum(*cp.SetupAllSeconds*1000/float64(n)))
		if cp.SetupAllFirst != nil && cp.SetupAllLast != nil {
			total += fmt.Sprintf("; p50 %s ms for the first tenth, %s ms for the last", fmtNum(cp.SetupAllFirst.P50Ms), fmtNum(cp.SetupAllLast.P50Ms))
		}
		total += ")"
	}
	row("Set up "+nn+" one by one", total, "", "")
	rec := restartString(cp.RecoverySeconds, cp.RecoveryReportedSeconds, cp.RecoveredContainers)
	row("Restart (kill -9) with "+nn, rec, "<= 0.5 s", r.targetStatus(fmt.Sprintf("restart recovery with %d", n)))
	reb := restartString(cp.RebuildSeconds, cp.RebuildReportedSeconds, cp.RebuiltContainers)
	row("Rebuild from the kernel alone (kill -9, no state) with "+nn, reb, "<= 2 s", r.targetStatus(fmt.Sprintf("rebuild from the kernel with %d", n)))
	rss := "n/a"
	if cp.RSSMiB != nil {
		rss = fmt.Sprintf("%.1f MiB", *cp.RSSMiB)
		if cp.RSSAfterRestartMiB != nil {
			rss += fmt.Sprintf(" (%.1f MiB after the restart)", *cp.RSSAfterRestartMiB)
		}
	}
	row("Daemon RSS with "+nn, rss, "<= 64 MiB", r.targetStatus(fmt.Sprintf("daemon RSS with %d", n)))

	fams := []family{ipv4}
	if r.DataPlane6 != nil {
		fams = families
	}
	over, same := "", ""
	if len(fams) > 1 {
		over, same = ", each case over IPv4 and over IPv6", " of the same family"
	}
	fmt.Fprintf(w, "\n**Data plane** (from the client namespace, TCP, and UDP with 4,000-byte requests in fragments%s; median of %d interleaved rounds of %gs; ± half the interquartile range of the rounds; in brackets the ratio to (a)%s)\n\n", over, r.Config.Rounds, r.Config.DurationSeconds, same)
	fmt.Fprintln(w, "| Server | Request/response | New connections | Bulk (1 stream) | Fragmented UDP r/r |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	label := map[string]string{
		caseA: "(a) host, no isolator state",
		caseB: "(b) container, 1 container",
		caseC: "(c) container, " + nn + " containers",
		caseD: "(d) host, " + nn + " containers present",
	}
	famLabel := func(f family) string {
		if len(fams) == 1 {
			return ""
		}
		return ", " + f.label()
	}
	for _, c := range cases {
		for _, f := range fams {
			dp := r.dataPlane(f)
			fmt.Fprintf(w, "| %s%s |", label[c], famLabel(f))
			for _, mt := range metrics {
				rt := dp.Rates[mt][c]
				cell := fmtRate(mt, rt.Median)
				if rt.Spread != nil {
					cell += fmt.Sprintf(" ±%.0f%%", *rt.Spread*50)
				}
				if c != caseA {
					if v := dp.Ratios[mt][c+"/a"]; v != nil {
						cell += fmt.Sprintf(" (%.2f)", *v)
					}
				}
				fmt.Fprintf(w, " %s |", cell)
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintln(w, "\n| Ratio | Request/response | New connections | Bulk | Fragmented UDP r/r | Target |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	goals := map[string]string{"b/a": ">= 0.95 (r/r, bulk), >= 0.9 (fragmented)", "c/b": ">= 0.9", "c/a": "", "d/a": ">= 0.95"}
	for _, rn := range ratioNames {
		for _, f := range fams {
			dp := r.dataPlane(f)
			fmt.Fprintf(w, "| (%s)/(%s)%s |", rn[:1], rn[2:], famLabel(f))
			for _, mt := range metrics {
				v := dp.Ratios[mt][rn]
				cell := fmtOpt(v, "")
				if v != nil {
					cell = fmt.Sprintf("%.3f", *v)
				}
				if st := r.targetStatus(fmt.Sprintf("%s (%s)/(%s)%s", metricLabel(mt), rn[:1], rn[2:], f.targetSuffix())); st != "" && v != nil {
					cell += " " + statusCell(st)
				}
				fmt.Fprintf(w, " %s |", cell)
			}
			fmt.Fprintf(w, " %s |\n", goals[rn])
		}
	}

	var spreads []float64
	for _, f := range fams {
		for _, mt := range metrics {
			for _, c := range cases {
				if sp := r.dataPlane(f).Rates[mt][c].Spread; sp != nil {
					spreads = append(spreads, *sp*50)
				}
			}
		}
	}
	if sm := median(spreads); sm != nil {
		fmt.Fprintf(w, "\nNoise: the rounds of a case typically differ by ±%.0f%% (median of the ± above; load average %.1f-%.1f from other work on the machine), so a ratio within that distance of its target is not conclusive; the JSON also has the medians of the per-round ratios and the ratios of the best rounds.\n", *sm, r.LoadAverage.Start, r.LoadAverage.End)
	}

	if c1, cn := r.DataPlane.DaemonCPUSeconds["s1"], r.DataPlane.DaemonCPUSeconds["sn"]; c1 != nil && cn != nil {
		fmt.Fprintf(w, "CPU time isolatord used while the data plane was measured: %.2f s with 1 container, %.2f s with %s.\n", *c1, *cn, nn)
	}
	r.Shared.writeMarkdown(w, r.Config.Rounds, r.Config.DurationSeconds)
	r.Handoff.writeMarkdown(w, r.Config.Rounds, r.Config.DurationSeconds)
	r.Saddr6.writeMarkdown(w, nn, r.Config.Rounds, r.Config.DurationSeconds)
	r.Amplification.writeMarkdown(w, r.Config.Containers)
}

// writeTargetsMarkdown prints the target summary, the micro-benchmarks and
// the errors.
func (r *Results) writeTargetsMarkdown(w io.Writer) {
	pass, miss, nm := 0, 0, 0
	var missed []string
	for _, t := range r.Targets {
		switch t.Status {
		case "PASS":
			pass++
		case "MISS":
			miss++
			missed = append(missed, t.Name)
		default:
			nm++
			missed = append(missed, t.Name+" (not measured)")
		}
	}
	fmt.Fprintf(w, "\nTargets: %d PASS, %d MISS, %d not measured", pass, miss, nm)
	if len(missed) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(missed, "; "))
	}
	fmt.Fprintf(w, ". Total run time %.0f s.\n", r.TotalSeconds)

	if len(r.Micro) > 0 {
		fmt.Fprint(w, "\n**Micro-benchmarks** (`go test -bench`)\n\n")
		fmt.Fprintln(w, "| Package | Benchmark | Figures |")
		fmt.Fprintln(w, "|---|---|---|")
		for _, mb := range r.Micro {
			var figs []string
			units := make([]string, 0, len(mb.Metrics))
			for u := range mb.Metrics {
				units = append(units, u)
			}
			sort.Slice(units, func(i, j int) bool {
				return unitOrder(units[i]) < unitOrder(units[j]) || unitOrder(units[i]) == unitOrder(units[j]) && units[i] < units[j]
			})
			hidden := 0
			for _, u := range units {
				if strings.HasPrefix(u, "step-") {
					hidden++ // per-step breakdowns stay in the JSON
					continue
				}
				figs = append(figs, fmtNum(mb.Metrics[u])+" "+u)
			}
			if hidden > 0 {
				figs = append(figs, fmt.Sprintf("(+%d per-step figures in the JSON)", hidden))
			}
			pkg := mb.Package[strings.LastIndex(mb.Package, "/")+1:]
			fmt.Fprintf(w, "| %s | %s | %s |\n", pkg, strings.TrimPrefix(mb.Name, "Benchmark"), strings.Join(figs, ", "))
		}
	}
	if len(r.Errors) > 0 {
		fmt.Fprintln(w, "\n**Errors** (figures marked n/a could not be measured):")
		for _, e := range r.Errors {
			fmt.Fprintf(w, "- %s\n", strings.ReplaceAll(e, "\n", " "))
		}
	}
}

// unitOrder puts ns/op first, then custom units, then B/op and allocs/op.
func unitOrder(u string) int {
	switch u {
	case "ns/op":
		return 0
	case "B/op":
		return 2
	case "allocs/op":
		return 3
	}
	return 1
}

// restartString is a restart figure: time to serving, the recovery time
// the daemon logged, containers back.
func restartString(serving, reported *float64, back *int) string {
	if serving == nil {
		return "n/a"
	}
	s := fmt.Sprintf("%.3f s to serving", *serving)
	if reported != nil {
		s += fmt.Sprintf(" (recovery itself: %.3f s)", *reported)
	}
	if back != nil {
		s += fmt.Sprintf(", %d containers back", *back)
	}
	return s
}
