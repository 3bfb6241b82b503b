package metrics

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane"
)

// StateSource is what the scrape-time collector reads; *isolator.Isolator
// implements it.
type StateSource interface {
	Status(ctx context.Context) isolator.Status
	List(ctx context.Context) []isolator.Record
	Usage(ctx context.Context, id string) (isolator.Record, plane.LinkStats, error)
}

var _ StateSource = (*isolator.Isolator)(nil)

// HostFeatures are the kernel features isolatord_host_feature always
// reports (0 until start-up has detected them); any other feature the data
// plane reports is exported too.
var HostFeatures = []string{
	plane.FeatureClsact, plane.FeatureU32, plane.FeatureMirred,
	plane.FeatureHTB, plane.FeatureTBF, plane.FeatureIFB, plane.FeatureFQCodel,
}

// StateTimeout bounds the per-container Usage calls of one scrape: it is
// the deadline of their context and is checked between containers, so once
// it has passed the remaining containers are skipped and counted in
// isolatord_container_stats_errors_total. (A Usage call waits for the
// container's lock, which an Isolate in progress holds, whatever the
// context says.)
const StateTimeout = 5 * time.Second

// WatchState makes every scrape read src: container counts per state,
// ephemeral blocks, static ports held, kernel features, and, when
// perContainer is true, each isolated container's traffic counters (one
// Usage call per container per scrape; the series carry a container_id
// label, hence off by default). Until WatchState is called the gauges read
// zero. Calling it again replaces the source.
func (m *Metrics) WatchState(src StateSource, perContainer bool) {
	m.state.mu.Lock()
	m.state.src, m.state.perContainer = src, perContainer
	m.state.mu.Unlock()
}

// stateCollector reads a StateSource at scrape time.
type stateCollector struct {
	mu           sync.Mutex
	src          StateSource
	perContainer bool
	timeout      time.Duration // StateTimeout; tests shorten it

	containers    *prometheus.Desc
	blocks        *prometheus.Desc
	blockPorts    *prometheus.Desc
	portsHeld     *prometheus.Desc
	portsManaged  *prometheus.Desc
	hostFeature   *prometheus.Desc
	statsErrors   prometheus.Counter
	ctrCounters   []ctrCounter
	ctrEphemeral  *prometheus.Desc
	ctrStaticPort *prometheus.Desc
}

// ctrCounter is one per-container traffic counter.
type ctrCounter struct {
	desc *prometheus.Desc
	get  func(plane.LinkStats) uint64
}

func newStateCollector() *stateCollector {
	name := func(n string) string { return prometheus.BuildFQName(Namespace, "", n) }
	c := &stateCollector{
		timeout:      StateTimeout,
		containers:   prometheus.NewDesc(name("containers"), "Containers known to the lifecycle, by state (prepared, isolating, isolated, updating, cleaning).", []string{"state"}, nil),
		blocks:       prometheus.NewDesc(name("ephemeral_blocks"), "Ephemeral port blocks of the pool, by state (used, free); their sum is the pool's capacity in containers.", []string{"state"}, nil),
		blockPorts:   prometheus.NewDesc(name("ephemeral_block_ports"), "Ports per ephemeral block (--ephemeral-ports-per-container).", nil, nil),
		portsHeld:    prometheus.NewDesc(name("static_ports_held"), "Static ports held by containers, by mode (exclusive, shared; a shared port counts once however many containers share it).", []string{"mode"}, nil),
		portsManaged: prometheus.NewDesc(name("static_ports_managed"), "Static ports the operator lets containers ask for (--ports).", nil, nil),
		hostFeature:  prometheus.NewDesc(name("host_feature"), "1 if the kernel feature was detected at start-up (clsact, u32, mirred, htb, ...), else 0.", []string{"feature"}, nil),
		statsErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "container_stats_errors_total",
			Help:      "Per-container traffic counters a scrape could not read (error or StateTimeout); only with per-container metrics on.",
		}),
		ctrEphemeral:  prometheus.NewDesc(name("container_ephemeral_ports"), "Size of the container's ephemeral port block; the labels give its first and last port. Per-container metrics only.", []string{"container_id", "begin", "end"}, nil),
		ctrStaticPort: prometheus.NewDesc(name("container_static_ports"), "Static ports the container holds, by mode (exclusive, shared). Per-container metrics only.", []string{"container_id", "mode"}, nil),
	}
	for _, d := range []struct {
		dir, what, help string
		get             func(plane.LinkStats) uint64
	}{
		{"receive", "bytes", "Bytes the container received", func(s plane.LinkStats) uint64 { return s.RxBytes }},
		{"receive", "packets", "Packets the container received", func(s plane.LinkStats) uint64 { return s.RxPackets }},
		{"receive", "errors", "Receive errors on the container's eth0", func(s plane.LinkStats) uint64 { return s.RxErrors }},
		{"receive", "dropped", "Packets dropped on receive by the container's eth0", func(s plane.LinkStats) uint64 { return s.RxDropped }},
		{"transmit", "bytes", "Bytes the container sent", func(s plane.LinkStats) uint64 { return s.TxBytes }},
		{"transmit", "packets", "Packets the container sent", func(s plane.LinkStats) uint64 { return s.TxPackets }},
		{"transmit", "errors", "Transmit errors on the container's eth0", func(s plane.LinkStats) uint64 { return s.TxErrors }},
		{"transmit", "dropped", "Packets dropped on transmit by the container's eth0", func(s plane.LinkStats) uint64 { return s.TxDropped }},
	} {
		c.ctrCounters = append(c.ctrCounters, ctrCounter{
			desc: prometheus.NewDesc(name("container_"+d.dir+"_"+d.what+"_total"), d.help+" (read from its host-side veth at scrape time). Per-container metrics only.", []string{"container_id"}, nil),
			get:  d.get,
		})
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.containers, c.blocks, c.blockPorts, c.portsHeld, c.portsManaged, c.hostFeature, c.ctrEphemeral, c.ctrStaticPort} {
		ch <- d
	}
	for _, cc := range c.ctrCounters {
		ch <- cc.desc
	}
	c.statsErrors.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	src, per, timeout := c.src, c.perContainer, c.timeout
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var st isolator.Status
	if src != nil {
		st = src.Status(ctx)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, s := range States {
		gauge(c.containers, float64(st.Containers[s]), string(s))
	}
	// States not in the list above (a future state) are exported too.
	var extra []string
	for s := range st.Containers {
		if !knownState(s) {
			extra = append(extra, string(s))
		}
	}
	sort.Strings(extra)
	for _, s := range extra {
		gauge(c.containers, float64(st.Containers[isolator.State(s)]), s)
	}
	gauge(c.blocks, float64(st.BlocksUsed), "used")
	gauge(c.blocks, float64(st.BlocksTotal-st.BlocksUsed), "free")
	gauge(c.blockPorts, float64(st.BlockSize))
	gauge(c.portsHeld, float64(st.ExclusivePorts.Len()), "exclusive")
	gauge(c.portsHeld, float64(st.SharedPorts.Len()), "shared")
	gauge(c.portsManaged, float64(st.ManagedPorts.Len()))
	features := map[string]bool{}
	for _, f := range HostFeatures {
		features[f] = false
	}
	for f, ok := range st.Host.Features {
		features[f] = ok
	}
	names := make([]string, 0, len(features))
	for f := range features {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		v := 0.0
		if features[f] {
			v = 1
		}
		gauge(c.hostFeature, v, f)
	}

	if src != nil && per {
		c.collectContainers(ctx, src, ch)
	}
	c.statsErrors.Collect(ch)
}

// collectContainers exports each isolated container's counters.
func (c *stateCollector) collectContainers(ctx context.Context, src StateSource, ch chan<- prometheus.Metric) {
	for _, r := range src.List(ctx) {
		if ctx.Err() != nil {
			c.statsErrors.Inc()
			continue
		}
		if r.State != isolator.StateIsolated {
			continue
		}
		rec, ls, err := src.Usage(ctx, r.ID)
		if err != nil {
			// Cleaned up between List and Usage: not an error.
			if !errors.Is(err, isolator.ErrNotFound) {
				c.statsErrors.Inc()
			}
			continue
		}
		if rec.State != isolator.StateIsolated {
			continue
		}
		for _, cc := range c.ctrCounters {
			ch <- prometheus.MustNewConstMetric(cc.desc, prometheus.CounterValue, float64(cc.get(ls)), rec.ID)
		}
		e := rec.Ephemeral
		ch <- prometheus.MustNewConstMetric(c.ctrEphemeral, prometheus.GaugeValue, float64(e.Size()), rec.ID, strconv.Itoa(int(e.Begin)), strconv.Itoa(int(e.End)))
		ch <- prometheus.MustNewConstMetric(c.ctrStaticPort, prometheus.GaugeValue, float64(rec.Ports.Len()), rec.ID, "exclusive")
		ch <- prometheus.MustNewConstMetric(c.ctrStaticPort, prometheus.GaugeValue, float64(rec.Shared.Len()), rec.ID, "shared")
	}
}

func knownState(s isolator.State) bool {
	for _, k := range States {
		if k == s {
			return true
		}
	}
	return false
}
