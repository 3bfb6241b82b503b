package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// RecoverySource is what the kernel-as-truth series read at scrape time
// (the lifecycle: isolator.Isolator).
type RecoverySource interface {
	// Unattributed lists the kernel objects of isolatord's shape that
	// belong to no container (left in place until an operator removes them).
	Unattributed() []string
	// RebuiltCount is how many containers the last start-up rebuilt from
	// the kernel.
	RebuiltCount() int
}

// WatchRecovery registers isolatord_unattributed_kernel_objects and
// isolatord_recovery_rebuilt_containers over src (both 0 until src says
// otherwise).
func (m *Metrics) WatchRecovery(src RecoverySource) {
	var mu sync.Mutex
	get := func(f func() float64) func() float64 {
		return func() float64 {
			mu.Lock()
			defer mu.Unlock()
			return f()
		}
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "isolatord_unattributed_kernel_objects",
			Help: "Kernel objects of isolatord's shape (veths, filters, shapers) that belong to no container: left in place; isolatorctl remove-unattributed removes them.",
		}, get(func() float64 { return float64(len(src.Unattributed())) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "isolatord_recovery_rebuilt_containers",
			Help: "Containers whose records the last start-up rebuilt from the kernel (state missing, corrupt or out of date).",
		}, get(func() float64 { return float64(src.RebuiltCount()) })),
	)
}
