package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isolatord/isolatord/netns/neighsync"
)

// Neighbour sync series (package neighsync: containers get their
// neighbours from the host's table instead of ARP), read at scrape time
// from the source WatchNeighbours gives; zero until then.
type neighbourCollector struct {
	mu    sync.Mutex
	src   func() neighsync.Stats
	descs []*prometheus.Desc
}

var neighbourSeries = []struct{ name, help string }{
	{"neighbour_requests_total", "Neighbour requests from containers (their kernel asking user space for an address's MAC)."},
	{"neighbour_entries_written_total", "Neighbour entries written into containers from the host's table."},
	{"neighbour_entries_deleted_total", "Neighbour entries deleted in containers because the host's entry went or failed."},
	{"neighbour_host_resolutions_total", "Host neighbour resolutions started for containers (addresses the host did not know)."},
	{"neighbour_errors_total", "Failed netlink requests of the neighbour sync."},
	{"neighbour_requests_refused_total", "Neighbour requests from containers not served: the container already waited for neighsync.MaxWaiting unresolved addresses."},
	{"neighbour_resyncs_total", "Times neighbour notifications were lost (a receive buffer of the neighbour sync was full) and the host's or the containers' tables read again."},
	{"neighbour_requests_throttled_total", "Neighbour requests from containers not served: the container asked faster than its budget allows (it asks again)."},
}

func newNeighbourCollector() *neighbourCollector {
	c := &neighbourCollector{}
	for _, s := range neighbourSeries {
		c.descs = append(c.descs, prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", s.name), s.help, nil, nil))
	}
	return c
}

func (c *neighbourCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *neighbourCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	src := c.src
	c.mu.Unlock()
	var st neighsync.Stats
	if src != nil {
		st = src()
	}
	for i, v := range []uint64{st.Asked, st.Pushed, st.Deleted, st.Kicks, st.Errors, st.Refused, st.Resyncs, st.Throttled} {
		ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.CounterValue, float64(v))
	}
}

// WatchNeighbours makes every scrape read the neighbour sync's counters
// from src (for instance (*dataplane.DataPlane).NeighStats).
func (m *Metrics) WatchNeighbours(src func() neighsync.Stats) {
	m.neigh.mu.Lock()
	m.neigh.src = src
	m.neigh.mu.Unlock()
}
