package metrics

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/tcfilter"
)

func TestEverySeriesExistsAtZero(t *testing.T) {
	m := New("1.2.3-test")
	f := scrape(t, m.Handler())

	// Every filter-operation combination, Mesos' and more, at zero.
	n := 0
	for _, op := range FilterOps {
		for _, dev := range FilterDevices {
			for _, kind := range FilterKinds {
				for _, res := range FilterResults {
					if v := f.value(t, "isolatord_filter_operations_total", "op", op, "device", dev, "kind", kind, "result", res); v != 0 {
						t.Errorf("filter %s/%s/%s/%s = %v before any operation", op, dev, kind, res, v)
					}
					n++
				}
			}
		}
	}
	if got := len(f["isolatord_filter_operations_total"].GetMetric()); got != n || n != 3*5*3*4 {
		t.Errorf("filter series: %d exported, %d expected (180)", got, n)
	}
	// Mesos' counters that it declared but never registered have a home.
	for _, c := range [][]string{
		{"add", "eth0", "ip", "error"}, {"add", "eth0", "ip", "exists"},
		{"remove", "veth", "ip", "not_found"}, {"update", "eth0", "arp", "not_found"},
		{"update", "eth0", "icmp", "exists"}, {"remove", "eth0", "icmp", "error"},
	} {
		f.value(t, "isolatord_filter_operations_total", "op", c[0], "device", c[1], "kind", c[2], "result", c[3])
	}

	for _, op := range Ops {
		for _, c := range allCodes() {
			if v := f.value(t, "isolatord_operations_total", "op", op, "code", c.String()); v != 0 {
				t.Errorf("operations %s/%s = %v", op, c, v)
			}
		}
		h := f.histogram(t, "isolatord_operation_duration_seconds", "op", op)
		// The text format adds the +Inf bucket.
		b := h.GetBucket()
		if h.GetSampleCount() != 0 || len(b) != len(DurationBuckets)+1 {
			t.Fatalf("histogram %s: count %d, %d buckets (want 0, %d)", op, h.GetSampleCount(), len(b), len(DurationBuckets)+1)
		}
		if b[0].GetUpperBound() != 0.0001 || b[len(b)-2].GetUpperBound() != 10 {
			t.Errorf("buckets from %v to %v, want 100µs to 10s", b[0].GetUpperBound(), b[len(b)-2].GetUpperBound())
		}
	}
	for _, s := range States {
		if v := f.value(t, "isolatord_containers", "state", string(s)); v != 0 {
			t.Errorf("containers{%s} = %v without a source", s, v)
		}
	}
	for _, s := range []string{"used", "free"} {
		f.value(t, "isolatord_ephemeral_blocks", "state", s)
	}
	for _, s := range []string{"exclusive", "shared"} {
		f.value(t, "isolatord_static_ports_held", "mode", s)
	}
	for _, feat := range HostFeatures {
		f.value(t, "isolatord_host_feature", "feature", feat)
	}
	f.value(t, "isolatord_static_ports_managed")
	f.value(t, "isolatord_ephemeral_block_ports")
	for _, o := range RecoveryOutcomes {
		f.value(t, "isolatord_recovery_containers_total", "outcome", o)
	}
	for _, name := range []string{"isolatord_recovery_strays_removed_total", "isolatord_recovery_unreserved_containers_total",
		"isolatord_recovery_duration_seconds", "isolatord_recoveries_total", "isolatord_container_stats_errors_total"} {
		if v := f.value(t, name); v != 0 {
			t.Errorf("%s = %v", name, v)
		}
	}
	if v := f.value(t, "isolatord_build_info", "version", "1.2.3-test", "goversion", runtime.Version()); v != 1 {
		t.Errorf("build_info = %v", v)
	}
	// Go and process collectors.
	if v := f.value(t, "go_goroutines"); v < 1 {
		t.Errorf("go_goroutines = %v", v)
	}
	if v := f.value(t, "process_resident_memory_bytes"); v <= 0 {
		t.Errorf("process_resident_memory_bytes = %v", v)
	}
	f.value(t, "process_cpu_seconds_total")
	// No per-container series unless asked for.
	if fam := f["isolatord_container_receive_bytes_total"]; fam != nil {
		t.Errorf("per-container series exported by default: %v", fam)
	}
}

func TestFilterOpIncrementsItsSeriesOnly(t *testing.T) {
	m := New("test")
	var obs tcfilter.Observer = m.FilterOp // usable as tcfilter's observer
	obs(tcfilter.Op{Op: "remove", Device: "eth0", Kind: "ip", Result: "not_found"})
	obs(tcfilter.Op{Op: "remove", Device: "eth0", Kind: "ip", Result: "not_found"})
	obs(tcfilter.Op{Op: "add", Device: "veth", Kind: "arp", Result: "ok"})
	obs(tcfilter.Op{Op: "update", Device: "eth0", Kind: "icmp", Result: "error"})
	// A label value tcfilter may add later is still counted.
	obs(tcfilter.Op{Op: "add", Device: "ifb0", Kind: "ip", Result: "ok"})

	f := scrape(t, m.Handler())
	const name = "isolatord_filter_operations_total"
	if v := f.value(t, name, "op", "remove", "device", "eth0", "kind", "ip", "result", "not_found"); v != 2 {
		t.Errorf("remove/eth0/ip/not_found = %v, want 2", v)
	}
	want := []string{
		"{device=eth0,kind=icmp,op=update,result=error}",
		"{device=eth0,kind=ip,op=remove,result=not_found}",
		"{device=ifb0,kind=ip,op=add,result=ok}",
		"{device=veth,kind=arp,op=add,result=ok}",
	}
	if got := f.nonZero(name); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("non-zero filter series:\n got %v\nwant %v", got, want)
	}
}

func TestFilterOpConcurrent(t *testing.T) {
	m := New("test")
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				m.FilterOp(tcfilter.Op{Op: "add", Device: "lo", Kind: "ip", Result: "ok"})
			}
		}()
	}
	wg.Wait()
	f := scrape(t, m.Handler())
	if v := f.value(t, "isolatord_filter_operations_total", "op", "add", "device", "lo", "kind", "ip", "result", "ok"); v != 4000 {
		t.Errorf("add/lo/ip/ok = %v, want 4000", v)
	}
}

func TestOperationCountsByCode(t *testing.T) {
	m := New("test")
	var obs isolator.Observer = m
	notFound := &isolator.Error{Kind: isolator.ErrNotFound, Msg: "container_id: c1 is not known"}
	obs.Operation("update", 3*time.Millisecond, notFound)
	obs.Operation("update", 40*time.Millisecond, fmt.Errorf("wrapped: %w", notFound))
	obs.Operation("update", 200*time.Microsecond, nil)
	obs.Operation("isolate", 2*time.Second, errors.New("plain error"))

	f := scrape(t, m.Handler())
	for _, c := range []struct {
		op, code string
		want     float64
	}{
		{"update", "NotFound", 2}, {"update", "OK", 1}, {"update", "Internal", 0},
		{"isolate", "Internal", 1}, {"isolate", "OK", 0}, {"prepare", "NotFound", 0},
	} {
		if v := f.value(t, "isolatord_operations_total", "op", c.op, "code", c.code); v != c.want {
			t.Errorf("operations{op=%s,code=%s} = %v, want %v", c.op, c.code, v, c.want)
		}
	}
	h := f.histogram(t, "isolatord_operation_duration_seconds", "op", "update")
	if h.GetSampleCount() != 3 {
		t.Errorf("update histogram count = %d, want 3", h.GetSampleCount())
	}
	if s := h.GetSampleSum(); s < 0.0431 || s > 0.0433 {
		t.Errorf("update histogram sum = %v, want 0.0432", s)
	}
	cum := map[float64]uint64{}
	for _, b := range h.GetBucket() {
		cum[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	if cum[0.0001] != 0 || cum[0.00025] != 1 || cum[0.005] != 2 || cum[0.05] != 3 {
		t.Errorf("update buckets = %v", cum)
	}
	if h := f.histogram(t, "isolatord_operation_duration_seconds", "op", "isolate"); h.GetSampleCount() != 1 {
		t.Errorf("isolate histogram count = %d", h.GetSampleCount())
	}
}

func TestRecovered(t *testing.T) {
	m := New("test")
	m.Recovered(isolator.RecoveryReport{Kept: 3, Prepared: 1, Finished: 2, RolledBack: 1, CleanedUp: 4,
		Strays: []string{"veth isd-x", "eth0 filter slot 9"}, Unreserved: []string{"c9"}}, 1500*time.Millisecond)
	f := scrape(t, m.Handler())
	for outcome, want := range map[string]float64{"kept": 3, "prepared": 1, "finished": 2, "rolled_back": 1, "cleaned_up": 4} {
		if v := f.value(t, "isolatord_recovery_containers_total", "outcome", outcome); v != want {
			t.Errorf("recovery %s = %v, want %v", outcome, v, want)
		}
	}
	for name, want := range map[string]float64{
		"isolatord_recovery_strays_removed_total":        2,
		"isolatord_recovery_unreserved_containers_total": 1,
		"isolatord_recovery_duration_seconds":            1.5,
		"isolatord_recoveries_total":                     1,
	} {
		if v := f.value(t, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}

// fakeSource is a StateSource whose answers the test changes.
type fakeSource struct {
	mu       sync.Mutex
	status   isolator.Status
	recs     []isolator.Record
	stats    map[string]plane.LinkStats
	errs     map[string]error
	usageCtx []context.Context
	block    string // Usage of this container waits for its context to end
}

func (s *fakeSource) Status(ctx context.Context) isolator.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

func (s *fakeSource) List(ctx context.Context) []isolator.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]isolator.Record(nil), s.recs...)
}

func (s *fakeSource) Usage(ctx context.Context, id string) (isolator.Record, plane.LinkStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.usageCtx = append(s.usageCtx, ctx)
	if id == s.block {
		s.mu.Unlock()
		<-ctx.Done()
		s.mu.Lock()
		return isolator.Record{}, plane.LinkStats{}, &isolator.Error{Kind: isolator.ErrInternal, Msg: ctx.Err().Error()}
	}
	if err := s.errs[id]; err != nil {
		return isolator.Record{}, plane.LinkStats{}, err
	}
	for _, r := range s.recs {
		if r.ID == id {
			return r, s.stats[id], nil
		}
	}
	return isolator.Record{}, plane.LinkStats{}, &isolator.Error{Kind: isolator.ErrNotFound, Msg: "not known"}
}

func (s *fakeSource) set(fn func(s *fakeSource)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(s)
}

func TestStateGauges(t *testing.T) {
	m := New("test")
	src := &fakeSource{status: isolator.Status{
		BlockSize: 1024, BlocksTotal: 16, BlocksUsed: 5,
		ManagedPorts:   ephemeral.MustParseSet("31000-31999"),
		ExclusivePorts: ephemeral.MustParseSet("31000-31009,31500"),
		SharedPorts:    ephemeral.MustParseSet("31800-31801"),
		Containers:     map[isolator.State]int{isolator.StateIsolated: 3, isolator.StatePrepared: 2},
		Host:           plane.HostInfo{Features: map[string]bool{"clsact": true, "fq_codel": false, "bpf": true}},
	}}
	m.WatchState(src, false)
	f := scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"isolatord_containers", []string{"state", "isolated"}, 3},
		{"isolatord_containers", []string{"state", "prepared"}, 2},
		{"isolatord_containers", []string{"state", "cleaning"}, 0},
		{"isolatord_ephemeral_blocks", []string{"state", "used"}, 5},
		{"isolatord_ephemeral_blocks", []string{"state", "free"}, 11},
		{"isolatord_ephemeral_block_ports", nil, 1024},
		{"isolatord_static_ports_held", []string{"mode", "exclusive"}, 11},
		{"isolatord_static_ports_held", []string{"mode", "shared"}, 2},
		{"isolatord_static_ports_managed", nil, 1000},
		{"isolatord_host_feature", []string{"feature", "clsact"}, 1},
		{"isolatord_host_feature", []string{"feature", "fq_codel"}, 0},
		{"isolatord_host_feature", []string{"feature", "htb"}, 0},
		{"isolatord_host_feature", []string{"feature", "bpf"}, 1},
	} {
		if v := f.value(t, c.name, c.labels...); v != c.want {
			t.Errorf("%s%s = %v, want %v", c.name, fmtLabels(c.labels), v, c.want)
		}
	}

	// The gauges follow the source at the next scrape.
	src.set(func(s *fakeSource) {
		s.status.BlocksUsed = 6
		s.status.Containers = map[isolator.State]int{isolator.StateIsolated: 4, isolator.StateCleaning: 1, "paused": 1}
	})
	f = scrape(t, m.Handler())
	for _, c := range []struct {
		name, k, v string
		want       float64
	}{
		{"isolatord_ephemeral_blocks", "state", "used", 6},
		{"isolatord_ephemeral_blocks", "state", "free", 10},
		{"isolatord_containers", "state", "isolated", 4},
		{"isolatord_containers", "state", "prepared", 0},
		{"isolatord_containers", "state", "cleaning", 1},
		{"isolatord_containers", "state", "paused", 1},
	} {
		if v := f.value(t, c.name, c.k, c.v); v != c.want {
			t.Errorf("%s{%s=%s} = %v, want %v", c.name, c.k, c.v, v, c.want)
		}
	}
	src.mu.Lock()
	calls := len(src.usageCtx)
	src.mu.Unlock()
	if calls != 0 {
		t.Errorf("Usage called %d times with per-container metrics off", calls)
	}
}

func TestPerContainerTraffic(t *testing.T) {
	m := New("test")
	recs := []isolator.Record{
		{ID: "web", State: isolator.StateIsolated, Ephemeral: ephemeral.Range{Begin: 32768, End: 33791}, Ports: ephemeral.MustParseSet("31000-31001"), Shared: ephemeral.MustParseSet("31800")},
		{ID: "db", State: isolator.StateIsolated, Ephemeral: ephemeral.Range{Begin: 33792, End: 34815}},
		{ID: "new", State: isolator.StatePrepared},
		{ID: "gone", State: isolator.StateIsolated}, // cleaned up between List and Usage
		{ID: "broken", State: isolator.StateIsolated},
	}
	src := &fakeSource{
		recs: recs,
		stats: map[string]plane.LinkStats{
			"web": {RxBytes: 1000, RxPackets: 10, TxBytes: 2000, TxPackets: 20, TxDropped: 1},
			"db":  {RxBytes: 5},
		},
		errs: map[string]error{
			"gone":   &isolator.Error{Kind: isolator.ErrNotFound, Msg: "container_id: gone is not known"},
			"broken": &isolator.Error{Kind: isolator.ErrInternal, Msg: "usage of broken: link not found"},
		},
	}
	m.WatchState(src, true)
	f := scrape(t, m.Handler())
	for _, c := range []struct {
		name, id string
		want     float64
	}{
		{"isolatord_container_receive_bytes_total", "web", 1000},
		{"isolatord_container_receive_packets_total", "web", 10},
		{"isolatord_container_transmit_bytes_total", "web", 2000},
		{"isolatord_container_transmit_packets_total", "web", 20},
		{"isolatord_container_transmit_dropped_total", "web", 1},
		{"isolatord_container_receive_errors_total", "web", 0},
		{"isolatord_container_receive_bytes_total", "db", 5},
	} {
		if v := f.value(t, c.name, "container_id", c.id); v != c.want {
			t.Errorf("%s{container_id=%s} = %v, want %v", c.name, c.id, v, c.want)
		}
	}
	if v := f.value(t, "isolatord_container_ephemeral_ports", "container_id", "web", "begin", "32768", "end", "33791"); v != 1024 {
		t.Errorf("ephemeral ports of web = %v", v)
	}
	if v := f.value(t, "isolatord_container_static_ports", "container_id", "web", "mode", "exclusive"); v != 2 {
		t.Errorf("static exclusive ports of web = %v", v)
	}
	if v := f.value(t, "isolatord_container_static_ports", "container_id", "web", "mode", "shared"); v != 1 {
		t.Errorf("static shared ports of web = %v", v)
	}
	for _, id := range []string{"new", "gone", "broken"} {
		if f.find("isolatord_container_receive_bytes_total", "container_id", id) != nil {
			t.Errorf("container %s has traffic series", id)
		}
	}
	// Only the Internal error counts; NotFound is a race with Cleanup.
	if v := f.value(t, "isolatord_container_stats_errors_total"); v != 1 {
		t.Errorf("stats errors = %v, want 1", v)
	}
	src.mu.Lock()
	for _, ctx := range src.usageCtx {
		if _, ok := ctx.Deadline(); !ok {
			t.Errorf("Usage called without a deadline")
		}
	}
	n := len(src.usageCtx)
	src.mu.Unlock()
	if n != 4 {
		t.Errorf("Usage called %d times, want 4 (isolated containers only)", n)
	}

	// Counters move with the source; a removed container's series go away.
	src.set(func(s *fakeSource) {
		s.stats["web"] = plane.LinkStats{RxBytes: 1500}
		s.recs = s.recs[:1]
	})
	f = scrape(t, m.Handler())
	if v := f.value(t, "isolatord_container_receive_bytes_total", "container_id", "web"); v != 1500 {
		t.Errorf("web rx bytes after traffic = %v, want 1500", v)
	}
	if f.find("isolatord_container_receive_bytes_total", "container_id", "db") != nil {
		t.Errorf("db's series survived its removal")
	}
}

func TestPerContainerStopsAtTimeout(t *testing.T) {
	m := New("test")
	m.state.timeout = 100 * time.Millisecond
	src := &fakeSource{
		recs: []isolator.Record{
			{ID: "a", State: isolator.StateIsolated},
			{ID: "b", State: isolator.StateIsolated}, // its Usage hangs until the deadline
			{ID: "c", State: isolator.StateIsolated},
			{ID: "d", State: isolator.StateIsolated},
		},
		stats: map[string]plane.LinkStats{"a": {RxBytes: 1}, "c": {RxBytes: 3}, "d": {RxBytes: 4}},
		block: "b",
	}
	m.WatchState(src, true)
	start := time.Now()
	f := scrape(t, m.Handler())
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("scrape took %v", d)
	}
	if v := f.value(t, "isolatord_container_receive_bytes_total", "container_id", "a"); v != 1 {
		t.Errorf("a = %v", v)
	}
	for _, id := range []string{"b", "c", "d"} {
		if f.find("isolatord_container_receive_bytes_total", "container_id", id) != nil {
			t.Errorf("container %s exported after the deadline", id)
		}
	}
	// b failed, c and d were skipped.
	if v := f.value(t, "isolatord_container_stats_errors_total"); v != 3 {
		t.Errorf("stats errors = %v, want 3", v)
	}
	// The gauges are still there.
	f.value(t, "isolatord_containers", "state", "isolated")
}

// A real Isolator satisfies StateSource (compile-time) and the interface
// methods match its signatures.
var _ StateSource = (*isolator.Isolator)(nil)

func BenchmarkFilterOp(b *testing.B) {
	m := New("bench")
	op := tcfilter.Op{Op: "add", Device: "eth0", Kind: "ip", Result: "ok"}
	b.ReportAllocs()
	for b.Loop() {
		m.FilterOp(op)
	}
}

func BenchmarkOperation(b *testing.B) {
	m := New("bench")
	b.ReportAllocs()
	for b.Loop() {
		m.Operation("isolate", time.Millisecond, nil)
	}
}

func BenchmarkScrape(b *testing.B) {
	m := New("bench")
	m.WatchState(&fakeSource{status: isolator.Status{BlocksTotal: 16, Containers: map[isolator.State]int{}}}, false)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Registry().Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
