package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/isolatord/isolatord/isolator"
)

func newOrphansCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "orphans_reclaimed_total",
		Help:      "Containers cleaned up because their network namespace was left with no process and no pin but isolatord's own for the orphan grace period (removed by a runtime without a CNI DEL).",
	})
}

// OrphanReclaimed counts one reclaimed orphan (isolator.OrphanObserver).
func (m *Metrics) OrphanReclaimed(string) { m.orphans.Inc() }

var _ isolator.OrphanObserver = (*Metrics)(nil)
