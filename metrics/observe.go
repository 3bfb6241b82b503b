package metrics

import (
	"time"

	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/tcfilter"
)

// FilterOp counts one tc filter operation. Its signature makes m.FilterOp a
// tcfilter.Observer. Label values outside the pre-created set (a device
// label added to tcfilter later, say) are still counted, in a new series.
func (m *Metrics) FilterOp(op tcfilter.Op) {
	if c, ok := m.filterIdx[op]; ok {
		c.Inc()
		return
	}
	m.filterOps.WithLabelValues(op.Op, op.Device, op.Kind, op.Result).Inc()
}

// Operation records one lifecycle call (isolator.Observer): its duration in
// isolatord_operation_duration_seconds{op} and its outcome in
// isolatord_operations_total{op,code}, code being the name of
// isolator.KindOf(err) ("OK" on success).
func (m *Metrics) Operation(op string, d time.Duration, err error) {
	m.opDuration.WithLabelValues(op).Observe(d.Seconds())
	code := "OK"
	if err != nil {
		code = isolator.KindOf(err).String()
	}
	m.opTotal.WithLabelValues(op, code).Inc()
	m.hostPorts.operation(op, err)
}

// Recovered records the outcome of start-up recovery (isolator.Observer).
func (m *Metrics) Recovered(rep isolator.RecoveryReport, d time.Duration) {
	add := func(outcome string, n int) {
		if n > 0 {
			m.recoveryContainers.WithLabelValues(outcome).Add(float64(n))
		}
	}
	add("kept", rep.Kept)
	add("prepared", rep.Prepared)
	add("finished", rep.Finished)
	add("rolled_back", rep.RolledBack)
	add("cleaned_up", rep.CleanedUp)
	add("failed", len(rep.Failed))
	add("rebuilt", len(rep.Rebuilt))
	add("range_restored", len(rep.RangesRestored))
	add("held", len(rep.Held))
	m.recoveryStrays.Add(float64(len(rep.Strays)))
	m.recoveryUnreserved.Add(float64(len(rep.Unreserved)))
	m.recoveryDuration.Set(d.Seconds())
	m.recoveries.Inc()
}

// Compile-time checks that Metrics plugs into the hooks it is meant for.
var (
	_ isolator.Observer = (*Metrics)(nil)
	_ tcfilter.Observer = (*Metrics)(nil).FilterOp
)
