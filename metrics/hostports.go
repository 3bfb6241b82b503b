package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isolatord/isolatord/isolator"
)

// HostPortOps are the operations whose refusals (a host process holds a
// port) isolatord_host_port_refusals_total counts.
var HostPortOps = []string{"prepare", "update"}

// hostPortsCollector exports the host port reservations: two gauges read
// from the state source at scrape time, and a counter of refusals.
type hostPortsCollector struct {
	state     *stateCollector // its source (WatchState)
	reserved  *prometheus.Desc
	conflicts *prometheus.Desc
	refusals  *prometheus.CounterVec
}

func newHostPortsCollector(state *stateCollector) *hostPortsCollector {
	name := func(n string) string { return prometheus.BuildFQName(Namespace, "", n) }
	c := &hostPortsCollector{
		state:     state,
		reserved:  prometheus.NewDesc(name("host_port_reservations"), "Static ports of containers that isolatord also holds in the host namespace (bound sockets, so a host process's bind() of them fails); a shared port counts once.", nil, nil),
		conflicts: prometheus.NewDesc(name("host_port_conflicts"), "Containers' static ports that a host process bound while the daemon was down (found at start-up; the container keeps the traffic, the host process gets none). Non-zero needs an operator.", nil, nil),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "host_port_refusals_total",
			Help:      "Prepare and Update calls refused because a host process holds a requested static port.",
		}, []string{"op"}),
	}
	for _, op := range HostPortOps {
		c.refusals.WithLabelValues(op)
	}
	return c
}

// operation counts a refusal (called for every lifecycle operation).
func (c *hostPortsCollector) operation(op string, err error) {
	if err != nil && isolator.IsHostPortHeld(err) {
		c.refusals.WithLabelValues(op).Inc()
	}
}

// Describe implements prometheus.Collector.
func (c *hostPortsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.reserved
	ch <- c.conflicts
	c.refusals.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *hostPortsCollector) Collect(ch chan<- prometheus.Metric) {
	c.state.mu.Lock()
	src, timeout := c.state.src, c.state.timeout
	c.state.mu.Unlock()
	var st isolator.HostPortsStatus
	if src != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		st = src.Status(ctx).HostPorts
		cancel()
	}
	ch <- prometheus.MustNewConstMetric(c.reserved, prometheus.GaugeValue, float64(st.Reserved))
	ch <- prometheus.MustNewConstMetric(c.conflicts, prometheus.GaugeValue, float64(len(st.Conflicts)))
	c.refusals.Collect(ch)
}
