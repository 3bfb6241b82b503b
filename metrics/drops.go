package metrics

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// DropSource is what isolatord_dropped_packets_total reads at scrape time
// (the data plane).
type DropSource interface {
	DropTotals(ctx context.Context) (map[string]uint64, error)
}

// dropCollector exports the frames containers sent that the host dropped.
type dropCollector struct {
	mu     sync.Mutex
	src    DropSource
	reason []string          // the label values, every one present from zero
	last   map[string]uint64 // what the last scrape exported: a counter never goes back
	desc   *prometheus.Desc
	errors prometheus.Counter
}

func newDropCollector() *dropCollector {
	return &dropCollector{
		last: map[string]uint64{},
		desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "dropped_packets_total"),
			"Frames containers sent that their host-side veth dropped, by reason (mac, ip_header, source_ip, port, icmp, protocol, arp, ethertype, vlan, ipv6_ext, ndp, mld, icmp_state, loopback, echo): a frame leaves only if a host process owning exactly the container's ports could have sent it; mld counts the multicast listener reports every container's kernel sends on its own (expected, not an attack); icmp_state ICMP errors an end host does not send about its own flows (frag-needed/packet too big, time exceeded, redirects: they would change how peers treat the shared address); loopback TCP/UDP to a host-only service on 127.0.0.0/8 or ::1 not opened with --host-loopback-ports; echo echo requests with an {identifier, peer} another container or the host is using, or over the container's quota. Read from the kernel at scrape time; counts of containers cleaned up since the daemon started are kept.",
			[]string{"reason"}, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "dropped_packets_errors_total",
			Help:      "Scrapes whose dropped-packet counters could not all be read from the kernel (the series then keep their last values where lower).",
		}),
	}
}

// WatchDrops makes every scrape read the drop counters from src, every
// one of reasons (the data plane's drop reasons) present from zero. Until
// it is called there are no drop series.
func (m *Metrics) WatchDrops(src DropSource, reasons []string) {
	m.drops.mu.Lock()
	m.drops.src = src
	m.drops.reason = reasons
	m.drops.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *dropCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	c.errors.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *dropCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.src != nil {
		ctx, cancel := context.WithTimeout(context.Background(), StateTimeout)
		now, err := c.src.DropTotals(ctx)
		cancel()
		if err != nil {
			c.errors.Inc()
		}
		for r, n := range now {
			c.last[r] = max(c.last[r], n)
		}
	}
	for _, r := range c.reason {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.last[r]), r)
	}
	c.errors.Collect(ch)
}
