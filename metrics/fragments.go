package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Fragments are the fragment steering's counters (package
// tcfilter/fragbpf, read through the data plane).
type Fragments struct {
	Enabled            bool
	Steered4, Steered6 uint64 // later fragments sent after their first fragment
	Host4, Host6       uint64 // later fragments left to the host
	Evicted            uint64 // datagrams dropped from a full table
	Entries            uint64 // datagrams in the tables now
}

// fragCollector exports isolatord_fragments_steered_total{family},
// isolatord_fragments_to_host_total{family},
// isolatord_fragment_table_evictions_total and
// isolatord_fragment_table_entries, read at scrape time from the source
// WatchFragments gives; zero until then (and without fragment steering).
type fragCollector struct {
	mu                   sync.Mutex
	src                  func() (Fragments, error)
	last                 Fragments // counters never go back (tables rebuilt empty by a restart)
	steered, host, evict *prometheus.Desc
	entries              *prometheus.Desc
}

func newFragCollector() *fragCollector {
	fam := []string{"family"}
	name := func(s string) string { return prometheus.BuildFQName(Namespace, "", s) }
	return &fragCollector{
		steered: prometheus.NewDesc(name("fragments_steered_total"),
			"Later fragments of datagrams sent to the container their first fragment went to.", fam, nil),
		host: prometheus.NewDesc(name("fragments_to_host_total"),
			"Later fragments (TCP/UDP) whose first fragment no container got (the host's own datagrams, or a first fragment not seen yet): left to the host.", fam, nil),
		evict: prometheus.NewDesc(name("fragment_table_evictions_total"),
			"Datagrams dropped from a full fragment table (least recently used first) to make room.", nil, nil),
		entries: prometheus.NewDesc(name("fragment_table_entries"),
			"Datagrams in the fragment tables (IPv4 and IPv6) now.", nil, nil),
	}
}

func (c *fragCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.steered
	ch <- c.host
	ch <- c.evict
	ch <- c.entries
}

func (c *fragCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.src != nil {
		if f, err := c.src(); err == nil {
			l := &c.last
			l.Steered4, l.Steered6 = max(l.Steered4, f.Steered4), max(l.Steered6, f.Steered6)
			l.Host4, l.Host6 = max(l.Host4, f.Host4), max(l.Host6, f.Host6)
			l.Evicted = max(l.Evicted, f.Evicted)
			l.Entries = f.Entries
		}
	}
	l := c.last
	ch <- prometheus.MustNewConstMetric(c.steered, prometheus.CounterValue, float64(l.Steered4), "ipv4")
	ch <- prometheus.MustNewConstMetric(c.steered, prometheus.CounterValue, float64(l.Steered6), "ipv6")
	ch <- prometheus.MustNewConstMetric(c.host, prometheus.CounterValue, float64(l.Host4), "ipv4")
	ch <- prometheus.MustNewConstMetric(c.host, prometheus.CounterValue, float64(l.Host6), "ipv6")
	ch <- prometheus.MustNewConstMetric(c.evict, prometheus.CounterValue, float64(l.Evicted))
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(l.Entries))
}

// WatchFragments makes every scrape read the fragment counters from src.
func (m *Metrics) WatchFragments(src func() (Fragments, error)) {
	m.frag.mu.Lock()
	m.frag.src = src
	m.frag.mu.Unlock()
}
