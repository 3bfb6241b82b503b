package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// series is one series of a scrapedCollector: its name after the
// namespace, its help, whether it is a gauge (else a counter) and its
// constant labels (several series of one name differ by them).
type series struct {
	name, help string
	gauge      bool
	labels     prometheus.Labels
}

// scrapedCollector exports fixed series whose values a source gives at
// scrape time, all zero until a Watch method sets the source: the shape
// of the neighbour sync's, the host follower's, the fragment steering's,
// the drains' and the IPv6 demux's series.
type scrapedCollector struct {
	mu    sync.Mutex
	read  func() []float64 // one value per series, in their order; nil: zeros
	descs []*prometheus.Desc
	types []prometheus.ValueType
}

func newScrapedCollector(ss []series) *scrapedCollector {
	c := &scrapedCollector{}
	for _, s := range ss {
		c.descs = append(c.descs, prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", s.name), s.help, nil, s.labels))
		t := prometheus.CounterValue
		if s.gauge {
			t = prometheus.GaugeValue
		}
		c.types = append(c.types, t)
	}
	return c
}

// watchSource makes every scrape of c read src and export values(src())
// (src nil: zeros). Scrapes are serialised: values may keep state.
func watchSource[T any](c *scrapedCollector, src func() T, values func(T) []float64) {
	var read func() []float64
	if src != nil {
		read = func() []float64 { return values(src()) }
	}
	c.mu.Lock()
	c.read = read
	c.mu.Unlock()
}

func (c *scrapedCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *scrapedCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var v []float64
	if c.read != nil {
		v = c.read()
	}
	for i, d := range c.descs {
		var x float64
		if i < len(v) {
			x = v[i]
		}
		ch <- prometheus.MustNewConstMetric(d, c.types[i], x)
	}
}

// floats converts a source's numbers for a scrapedCollector.
func floats[T uint64 | int](v ...T) []float64 {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return f
}
