package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// drainCollector exports the drains in force (docs/handoff.md), read from
// the data plane at scrape time from the source WatchDrains gives: the
// holdings of a port that drain (one per container and port) and the
// flows that still reach them (the host's pins of their live flows).
type drainCollector struct {
	mu    sync.Mutex
	src   func() (holdings, flows int)
	ports *prometheus.Desc
	flows *prometheus.Desc
}

func newDrainCollector() *drainCollector {
	return &drainCollector{
		ports: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "draining_ports"),
			"Static ports a container drains (one per container and port): no new flow reaches it there.", nil, nil),
		flows: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "draining_live_flows"),
			"Flows that still reach the containers draining ports (the host's pins of their live flows); 0 when every drain is done.", nil, nil),
	}
}

func (c *drainCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.ports; ch <- c.flows }

func (c *drainCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var holdings, flows int
	if c.src != nil {
		holdings, flows = c.src()
	}
	ch <- prometheus.MustNewConstMetric(c.ports, prometheus.GaugeValue, float64(holdings))
	ch <- prometheus.MustNewConstMetric(c.flows, prometheus.GaugeValue, float64(flows))
}

// WatchDrains makes every scrape read the drains from src (for instance
// (*dataplane.DataPlane).DrainTotals).
func (m *Metrics) WatchDrains(src func() (holdings, flows int)) {
	m.drain.mu.Lock()
	m.drain.src = src
	m.drain.mu.Unlock()
}
