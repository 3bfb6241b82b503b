package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestQuickRun runs the whole benchmark in quick mode (N=100, short
// measurements) against a freshly built isolatord and checks that the JSON
// has every figure, the targets are all evaluated and nothing failed. It
// asserts nothing about the figures' values (those belong in `make bench`).
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the quick benchmark (~15 s plus a build); skipped with -short")
	}
	sandbox.RequireRoot(t)
	binDir := t.TempDir()
	build := exec.Command("go", "build", "-o", binDir+"/", "github.com/isolatord/isolatord/cmd/isolatord", "github.com/isolatord/isolatord/cmd/isolator-cni", "github.com/isolatord/isolatord/cmd/isolatorctl")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build isolatord: %v\n%s", err, out)
	}
	outDir := t.TempDir()
	var stdout, stderr bytes.Buffer
	t0 := time.Now()
	code := run([]string{"--quick", "--bin", binDir, "--isotraffic", traffic.BinaryPath(t), "--out", outDir}, &stdout, &stderr)
	t.Logf("quick run took %v", time.Since(t0).Round(time.Millisecond))
	if code != 0 {
		t.Fatalf("isobench --quick exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"| Setup, N=1 |", "| (a) host, no isolator state, IPv4 |", "| (a) host, no isolator state, IPv6 |", "| (d)/(a), IPv4 |", "| (d)/(a), IPv6 |", "Targets: "} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, stdout.String())
		}
	}

	data, err := os.ReadFile(filepath.Join(outDir, "latest-quick.json"))
	if err != nil {
		t.Fatal(err)
	}
	stamped, _ := filepath.Glob(filepath.Join(outDir, "*Z-quick.json"))
	if len(stamped) != 1 {
		t.Errorf("want one time-stamped JSON file, got %v", stamped)
	}
	if svg, _ := filepath.Glob(filepath.Join(outDir, "*Z-quick-latency.svg")); len(svg) != 1 {
		t.Errorf("want one time-stamped SVG of the latency curve, got %v", svg)
	} else if b, err := os.ReadFile(svg[0]); err != nil || !strings.Contains(string(b), "<polyline") {
		t.Errorf("SVG %s without curves (%v)", svg[0], err)
	}
	if _, err := os.Stat(filepath.Join(outDir, "latest.json")); err == nil {
		t.Errorf("a quick run replaced latest.json")
	}
	// The tables can be printed again from the JSON alone.
	var again bytes.Buffer
	if code := run([]string{"--from", filepath.Join(outDir, "latest-quick.json")}, &again, &stderr); code != 0 {
		t.Errorf("--from exited %d: %s", code, stderr.String())
	}
	if md, _, _ := strings.Cut(stdout.String(), "\nJSON: "); strings.TrimSpace(again.String()) != strings.TrimSpace(md) {
		t.Errorf("--from printed other tables:\n%s\nwant:\n%s", again.String(), md)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("bad JSON: %v", err)
	}
	checkFields(t, doc)
}

// checkFields checks that every figure of a quick run is present.
func checkFields(t *testing.T, doc map[string]any) {
	t.Helper()
	positive := []string{
		"schema", "machine.cores", "machine.memory_mib", "config.containers", "config.cycles",
		"config.rounds", "config.duration_seconds", "config.block_size", "total_seconds",
		"control_plane.setup_all_seconds", "control_plane.teardown_all_seconds",
		"control_plane.namespaces_seconds", "control_plane.recovery_seconds",
		"control_plane.recovery_reported_seconds", "control_plane.recovered_containers",
		"control_plane.rss_mib", "control_plane.rss_peak_mib", "control_plane.rss_after_restart_mib",
		"control_plane.rebuild_seconds", "control_plane.rebuild_reported_seconds", "control_plane.rebuilt_containers",
		"control_plane.setup_ratio", "control_plane.teardown_ratio",
	}
	for _, l := range []string{"setup_n1", "teardown_n1", "setup_nn", "teardown_nn", "prepare_n1", "isolate_n1", "prepare_nn", "isolate_nn", "setup_all_first_tenth", "setup_all_last_tenth"} {
		for _, f := range []string{"samples", "p50_ms", "p99_ms", "mean_ms", "max_ms"} {
			positive = append(positive, "control_plane."+l+"."+f)
		}
	}
	for _, dp := range []string{"data_plane", "data_plane_ipv6"} {
		for _, m := range metrics {
			for _, c := range cases {
				positive = append(positive, fmt.Sprintf("%s.rates.%s.%s.median", dp, m, c), fmt.Sprintf("%s.rates.%s.%s.best", dp, m, c))
			}
			for _, r := range ratioNames {
				for _, kind := range []string{"ratios", "ratios_paired", "ratios_best"} {
					positive = append(positive, fmt.Sprintf("%s.%s.%s.%s", dp, kind, m, r))
				}
			}
		}
	}
	for _, f := range []string{"setup_ratio", "setup_all_seconds", "burst_setup_seconds", "burst_teardown_seconds", "drain_seconds",
		"setup_n1.p50_ms", "teardown_n1.p50_ms", "setup_nn.p50_ms", "teardown_nn.p99_ms", "reads_during_bursts.p99_ms", "reads_separate.p99_ms", "usage_separate.p50_ms", "get_separate.p50_ms", "cni_add.p50_ms", "cni_del.p50_ms"} {
		positive = append(positive, "control_scale."+f)
	}
	for _, p := range []string{"prepare", "daemons", "n_containers", "cycles", "one_container", "data_plane", "restart", "rebuild", "teardown", "control"} {
		positive = append(positive, "phase_seconds."+p)
	}
	for _, p := range positive {
		v, ok := lookup(doc, p)
		f, isNum := v.(float64)
		if !ok || !isNum || f <= 0 {
			t.Errorf("%s = %v, want a positive number", p, v)
		}
	}
	for _, p := range []string{"date", "machine.hostname", "machine.cpu", "machine.kernel", "machine.go", "config.ephemeral_pool", "config.static_ports", "config.namespaces"} {
		if v, _ := lookup(doc, p); v == nil || v == "" {
			t.Errorf("%s is empty", p)
		}
	}
	for _, p := range []string{"load_average.start", "load_average.end", "data_plane.daemon_cpu_seconds.s1", "data_plane.daemon_cpu_seconds.sn"} {
		if v, ok := lookup(doc, p); !ok {
			t.Errorf("%s missing", p)
		} else if _, isNum := v.(float64); !isNum {
			t.Errorf("%s = %v, want a number", p, v)
		}
	}
	if _, ok := lookup(doc, "busy"); !ok {
		t.Errorf("busy missing")
	}
	if v, _ := lookup(doc, "quick"); v != true {
		t.Errorf("quick = %v, want true", v)
	}
	if v, _ := lookup(doc, "control_plane.recovered_containers"); v != float64(100) {
		t.Errorf("recovered_containers = %v, want 100", v)
	}
	if v, _ := lookup(doc, "control_plane.rebuilt_containers"); v != float64(100) {
		t.Errorf("rebuilt_containers = %v, want 100", v)
	}
	for _, dp := range []string{"data_plane", "data_plane_ipv6"} {
		for _, m := range metrics {
			for _, c := range cases {
				s, _ := lookup(doc, fmt.Sprintf("%s.rates.%s.%s.samples", dp, m, c))
				if l, ok := s.([]any); !ok || len(l) != 2 {
					t.Errorf("%s %s/%s samples = %v, want 2 (one per round)", dp, m, c, s)
				}
			}
		}
	}
	targets, _ := doc["targets"].([]any)
	if len(targets) != 43 { // 20, 11 of the IPv6 data plane and 12 of the control phase
		t.Errorf("%d targets, want 43", len(targets))
	}
	for _, x := range targets {
		tg, _ := x.(map[string]any)
		if st := tg["status"]; st != "PASS" && st != "MISS" {
			t.Errorf("target %v: status %v, want PASS or MISS", tg["name"], st)
		}
		if _, ok := tg["value"].(float64); !ok {
			t.Errorf("target %v has no value", tg["name"])
		}
	}
	if errs, _ := doc["errors"].([]any); len(errs) != 0 {
		t.Errorf("errors: %v", errs)
	}
	if _, ok := doc["micro_benchmarks"].([]any); !ok {
		t.Errorf("micro_benchmarks is not a list")
	}
}

// lookup follows a dotted path through nested JSON objects.
func lookup(doc map[string]any, path string) (any, bool) {
	var cur any = doc
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func TestParseGoBench(t *testing.T) {
	out := `goos: linux
pkg: github.com/isolatord/isolatord/ephemeral
cpu: AMD EPYC
BenchmarkAllocateRelease-2   	 5000000	       231.5 ns/op	       0 B/op	       0 allocs/op
BenchmarkSplit/aligned-2     	 100	 12.5 ns/op
--- FAIL: BenchmarkBroken
PASS
ok  	github.com/isolatord/isolatord/ephemeral	3.1s
pkg: github.com/isolatord/isolatord/tcfilter
BenchmarkAddDelRanges/present=1000/1port-2  	 300	 41000 ns/op	 52.1 add-µs	 40.3 del-µs
`
	got := parseGoBench(strings.NewReader(out))
	if len(got) != 3 {
		t.Fatalf("got %d benchmarks, want 3: %+v", len(got), got)
	}
	if got[0].Name != "BenchmarkAllocateRelease" || got[0].Package != "github.com/isolatord/isolatord/ephemeral" ||
		got[0].Iterations != 5000000 || got[0].Metrics["ns/op"] != 231.5 || got[0].Metrics["allocs/op"] != 0 {
		t.Errorf("first: %+v", got[0])
	}
	if got[1].Name != "BenchmarkSplit/aligned" {
		t.Errorf("second name %q", got[1].Name)
	}
	if got[2].Package != "github.com/isolatord/isolatord/tcfilter" || got[2].Metrics["add-µs"] != 52.1 || got[2].Name != "BenchmarkAddDelRanges/present=1000/1port" {
		t.Errorf("third: %+v", got[2])
	}
}

func TestSummarize(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	l := summarize(ds)
	if l.Samples != 100 || l.P50Ms != 50 || l.P99Ms != 99 || l.MaxMs != 100 || l.MeanMs != 50.5 {
		t.Errorf("summarize 1..100 ms: %+v", l)
	}
	if summarize(nil) != nil {
		t.Errorf("summarize(nil) should be nil")
	}
	if m := median([]float64{3, 1, 2}); m == nil || *m != 2 {
		t.Errorf("median odd: %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m == nil || *m != 2.5 {
		t.Errorf("median even: %v", m)
	}
}

func TestRatios(t *testing.T) {
	r := &Results{DataPlane: newDataPlane(ipv4)}
	rates := r.DataPlane.Rates[metricRR]
	// The machine slows down by half in round 2: the paired ratios see
	// 0.9 every round.
	rates[caseA].Samples = []float64{100, 50, 100, 120}
	rates[caseB].Samples = []float64{90, 45, 90, 108}
	for _, c := range []string{caseA, caseB} {
		rates[c].Median = median(rates[c].Samples)
	}
	r.computeRatios()
	near := func(v *float64, want float64) bool { return v != nil && *v > want-1e-9 && *v < want+1e-9 }
	if v := r.DataPlane.Ratios[metricRR]["b/a"]; !near(v, 0.9) {
		t.Errorf("b/a of the medians = %v, want 0.9", v)
	}
	if v := r.DataPlane.RatiosPaired[metricRR]["b/a"]; !near(v, 0.9) {
		t.Errorf("paired b/a = %v, want 0.9", v)
	}
	if v := r.DataPlane.RatiosBest[metricRR]["b/a"]; !near(v, 0.9) {
		t.Errorf("best b/a = %v, want 0.9", v)
	}
	if a := rates[caseA]; !near(a.Best, 120) || !near(a.Spread, 0) {
		t.Errorf("a: best %v spread %v", a.Best, a.Spread)
	}
	if v := r.DataPlane.Ratios[metricRR]["c/a"]; v != nil {
		t.Errorf("c/a = %v without samples of c", *v)
	}
}

func TestEvaluate(t *testing.T) {
	r := &Results{Config: Config{Containers: 1000}, DataPlane: newDataPlane(ipv4)}
	r.ControlPlane.SetupN1 = &Latency{P50Ms: 2}
	r.ControlPlane.SetupNN = &Latency{P50Ms: 3}
	r.ControlPlane.RSSMiB = ptr(80.0)
	r.DataPlane.Rates[metricRR][caseA].Median = ptr(100.0)
	r.DataPlane.Rates[metricRR][caseB].Median = ptr(96.0)
	r.DataPlane.Rates[metricRR][caseD].Median = ptr(90.0)
	r.computeRatios()
	r.evaluate()
	want := map[string]string{
		"setup p50, N=1":                    "PASS",
		"setup p50, N=1000":                 "PASS",
		"setup p50 N=1000 / N=1":            "MISS", // 1.5x
		"daemon RSS with 1000":              "MISS",
		"request/response (b)/(a)":          "PASS",
		"request/response (d)/(a)":          "MISS",
		"bulk (b)/(a)":                      "NOT MEASURED",
		"teardown p50, N=1":                 "NOT MEASURED",
		"restart recovery with 1000":        "NOT MEASURED",
		"rebuild from the kernel with 1000": "NOT MEASURED",
		"request/response (c)/(b)":          "NOT MEASURED",
		"new connections (d)/(a)":           "NOT MEASURED",
		"teardown p50 N=1000 / N=1":         "NOT MEASURED",
		"teardown p50, N=1000":              "NOT MEASURED",
		"bulk (c)/(b)":                      "NOT MEASURED",
		"new connections (c)/(b)":           "NOT MEASURED",
		"bulk (d)/(a)":                      "NOT MEASURED",
		fragLabel + " (b)/(a)":              "NOT MEASURED",
		fragLabel + " (c)/(b)":              "NOT MEASURED",
		fragLabel + " (d)/(a)":              "NOT MEASURED",
	}
	if len(r.Targets) != len(want) {
		t.Errorf("%d targets, want %d", len(r.Targets), len(want))
	}
	for _, tg := range r.Targets {
		if want[tg.Name] != tg.Status {
			t.Errorf("%s: %s, want %s", tg.Name, tg.Status, want[tg.Name])
		}
	}
	var b bytes.Buffer
	r.Date = "2026-01-02T03:04:05Z"
	r.writeMarkdown(&b)
	for _, s := range []string{"| Setup p50, 1,000 / 1 | 1.50x | <= 1.3x | **MISS** |", "| Daemon RSS with 1,000 | 80.0 MiB | <= 64 MiB | **MISS** |", "96.0/s (0.96)"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("markdown lacks %q:\n%s", s, b.String())
		}
	}
}

func TestControlTargetsAndSVG(t *testing.T) {
	c := &ControlScale{
		BurstSize: 100, SetupN1: &Latency{P50Ms: 2, P99Ms: 4}, DrainSeconds: ptr(1.5), CNIAdd: &Latency{P50Ms: 12},
		Curve: []CurvePoint{
			{Present: 1000, Setup: &Latency{P50Ms: 2.5, P99Ms: 6}, Teardown: &Latency{P50Ms: 1, P99Ms: 3}},
			{Present: 0, Setup: &Latency{P50Ms: 2, P99Ms: 4}, Teardown: &Latency{P50Ms: 1, P99Ms: 2}},
		},
	}
	r := &Results{Config: Config{Containers: 1000, Only: []string{"control"}}, DataPlane: newDataPlane(ipv4), Control: c}
	r.evaluate()
	want := map[string]string{
		"process-held: setup p50, N=1":         "PASS",
		"drain: 1000 teardowns at once":        "PASS",
		"CNI ADD p50":                          "MISS",
		"process-held: teardown p50, N=1":      "NOT MEASURED",
		"burst: 100 setups at once":            "NOT MEASURED",
		"Usage/Get p99 during bursts":          "NOT MEASURED",
		"process-held: setup p50, N=1000":      "NOT MEASURED",
		"process-held: 1000 set up one by one": "NOT MEASURED",
	}
	for name, st := range want {
		if got := r.targetStatus(name); got != st {
			t.Errorf("%s: %q, want %q", name, got, st)
		}
	}
	if len(r.Targets) != 12 {
		t.Errorf("%d targets with only the control phase run, want its 12", len(r.Targets))
	}
	path := filepath.Join(t.TempDir(), "x.svg")
	if err := c.writeSVG(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Four series (setup/teardown x p50/p99), points in order of N.
	if n := strings.Count(string(b), "<polyline"); n != 4 {
		t.Errorf("%d curves, want 4", n)
	}
	if i, j := strings.Index(string(b), ">0</text>"), strings.Index(string(b), ">1000</text>"); i < 0 || j < i {
		t.Errorf("x axis labels missing or out of order")
	}
}
