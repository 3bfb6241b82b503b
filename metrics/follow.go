package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isolatord/isolatord/isolator/plane"
)

// Host follower series (dataplane follow.go: containers follow the host's
// address, gateway, MTU, MAC and eth0 at run time), read at scrape time
// from the source WatchFollower gives; zero until then.
type followCollector struct {
	mu    sync.Mutex
	src   func() plane.FollowStats
	descs []*prometheus.Desc
}

var followSeries = []struct {
	name, help string
	gauge      bool
}{
	{"host_changes_total", "Changes of the host's interface (address, gateway, MTU, MAC, IPv6, a recreated eth0) the daemon applied at run time.", false},
	{"host_follow_synced_total", "Containers brought in line with a change of the host.", false},
	{"host_follow_failures_total", "Attempts to bring a container in line with the host that failed (each is retried).", false},
	{"host_follow_pending", "Containers not in line with the host now.", true},
	{"host_follow_events_total", "Netlink notifications about the host's eth0 or lo.", false},
	{"host_follow_resubscriptions_total", "Times the netlink subscription to the host's changes ended and was made again.", false},
}

func newFollowCollector() *followCollector {
	c := &followCollector{}
	for _, s := range followSeries {
		c.descs = append(c.descs, prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", s.name), s.help, nil, nil))
	}
	return c
}

func (c *followCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *followCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	src := c.src
	c.mu.Unlock()
	var st plane.FollowStats
	if src != nil {
		st = src()
	}
	for i, v := range []uint64{st.Changes, st.Synced, st.Failures, uint64(st.Pending), st.Events, st.Resyncs} {
		t := prometheus.CounterValue
		if followSeries[i].gauge {
			t = prometheus.GaugeValue
		}
		ch <- prometheus.MustNewConstMetric(c.descs[i], t, float64(v))
	}
}

// WatchFollower makes every scrape read the host follower's counters from
// src (for instance (*dataplane.DataPlane).FollowStats).
func (m *Metrics) WatchFollower(src func() plane.FollowStats) {
	m.follow.mu.Lock()
	m.follow.src = src
	m.follow.mu.Unlock()
}
