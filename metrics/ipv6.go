package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ipv6Collector exports isolatord_ipv6_to_host_packets_total: IPv6 packets
// for the host's addresses that the eth0 demux passed to the host without
// looking at their ports (extension headers, fragments, other next
// headers), read from the kernel at scrape time from the source
// WatchIPv6ToHost gives; zero until then (and without IPv6).
type ipv6Collector struct {
	mu   sync.Mutex
	src  func() (uint64, error)
	last uint64 // a counter never goes back (the demux re-created by a restart starts at 0)
	desc *prometheus.Desc
}

func newIPv6Collector() *ipv6Collector {
	return &ipv6Collector{desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "ipv6_to_host_packets_total"),
		"IPv6 packets for the host's addresses that the host demux did not demultiplex by port (extension headers, fragments, other next headers) and left to the host.",
		nil, nil)}
}

func (c *ipv6Collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *ipv6Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.src != nil {
		if n, err := c.src(); err == nil {
			c.last = max(c.last, n)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.last))
}

// WatchIPv6ToHost makes every scrape read the counter from src (for
// instance (*dataplane.DataPlane).IPv6ToHost).
func (m *Metrics) WatchIPv6ToHost(src func() (uint64, error)) {
	m.ipv6.mu.Lock()
	m.ipv6.src = src
	m.ipv6.mu.Unlock()
}
