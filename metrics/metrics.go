// Package metrics is isolatord's Prometheus instrumentation.
//
// Everything lives in its own registry (never the global one) and every
// series the daemon can export exists from the start, at zero: Mesos'
// port_mapping isolator declared counters it never registered, so a graph of
// "removing eth0 egress filter errors" stayed empty whatever happened. Here
// each label combination that can occur is created in New, so an absent
// series means a scrape problem, never "nothing happened yet".
//
// Sources, by how they are fed:
//
//   - Events pushed by the code that does the work: FilterOp (a
//     tcfilter.Observer, one call per filter netlink request), Operation and
//     Recovered (isolator.Observer), and UnaryServerInterceptor (every gRPC
//     call).
//   - State read at scrape time by a collector (WatchState): containers per
//     state, ephemeral blocks, static ports held, host features, and,
//     optionally, per-container traffic counters. Reading at scrape time
//     means the numbers can never drift from the lifecycle's own bookkeeping.
//     WatchNeighbours does the same for the neighbour sync's counters
//     (isolatord_neighbour_*, neighbours.go).
//   - Build information, and the standard Go runtime and process collectors.
//
// Naming follows https://prometheus.io/docs/practices/naming: the isolatord_
// prefix, base units (seconds, bytes), _total on counters. No hot series
// carries a container ID; the per-container traffic series do and are off by
// default.
//
// Mesos' port_mapping/ counters map onto isolatord_filter_operations_total
// as follows ("errors" = result="error", "already_exist" = result="exists",
// "do_not_exist" = result="not_found"):
//
//	adding_{eth0,lo,veth}_ip_filters_*         op="add",    device=..., kind="ip"
//	adding_{eth0,veth}_{arp,icmp}_filters_*    op="add",    device=..., kind="arp"|"icmp"
//	removing_{eth0,lo,veth}_ip_filters_*       op="remove", device=..., kind="ip"
//	removing_eth0_{arp,icmp}_filters_*         op="remove", device="eth0", kind="arp"|"icmp"
//	updating_eth0_{arp,icmp}_filters_*         op="update", device="eth0", kind="arp"|"icmp"
//	updating_container_ip_filters_errors       op=..., device="container_lo"|"container_eth0", result="error"
//
// plus result="ok" for every operation, so error ratios can be computed.
// Unlike Mesos, a "filter missing" outcome is never counted as
// "already exists": results come from the kernel's errno (EEXIST, ENOENT).
package metrics

import (
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"

	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/tcfilter"
)

// Namespace is the prefix of every isolatord series.
const Namespace = "isolatord"

// DurationBuckets are the histogram buckets of operation and RPC latencies,
// in seconds: 100µs to 10s, about three per decade.
var DurationBuckets = []float64{
	0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005,
	0.01, 0.025, 0.05,
	0.1, 0.25, 0.5,
	1, 2.5, 5, 10,
}

// Label values pre-created at start-up.
var (
	// FilterOps, FilterDevices, FilterKinds and FilterResults are the values
	// of the labels of isolatord_filter_operations_total (the tcfilter
	// constants and device labels).
	FilterOps     = []string{tcfilter.OpAdd, tcfilter.OpRemove, tcfilter.OpUpdate}
	FilterDevices = []string{"eth0", "lo", "veth", "container_lo", "container_eth0"}
	FilterKinds   = []string{tcfilter.KindIP, tcfilter.KindARP, tcfilter.KindICMP}
	FilterResults = []string{tcfilter.ResultOK, tcfilter.ResultError, tcfilter.ResultExists, tcfilter.ResultNotFound}

	// Ops are the lifecycle operations reported through isolator.Observer.
	Ops = []string{"prepare", "isolate", "update", "usage", "cleanup"}

	// States are the container states of isolatord_containers.
	States = []isolator.State{isolator.StatePrepared, isolator.StateIsolating, isolator.StateIsolated, isolator.StateUpdating, isolator.StateCleaning}

	// RecoveryOutcomes are the outcome label values of
	// isolatord_recovery_containers_total, one per RecoveryReport counter.
	RecoveryOutcomes = []string{"kept", "prepared", "finished", "rolled_back", "cleaned_up"}
)

// allCodes are the gRPC status codes, OK to Unauthenticated.
func allCodes() []codes.Code {
	out := make([]codes.Code, 0, 17)
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		out = append(out, c)
	}
	return out
}

// Metrics holds isolatord's collectors and their registry. All methods are
// safe for concurrent use.
type Metrics struct {
	reg     *prometheus.Registry
	handler http.Handler

	filterOps *prometheus.CounterVec
	filterIdx map[tcfilter.Op]prometheus.Counter // pre-created series, read-only after New

	opTotal    *prometheus.CounterVec
	opDuration *prometheus.HistogramVec

	rpcRequests *prometheus.CounterVec
	rpcDuration *prometheus.HistogramVec

	recoveryContainers *prometheus.CounterVec
	recoveryStrays     prometheus.Counter
	recoveryUnreserved prometheus.Counter
	recoveryDuration   prometheus.Gauge
	recoveries         prometheus.Counter

	orphans prometheus.Counter // orphans.go

	state     *stateCollector
	hostPorts *hostPortsCollector // hostports.go
	drops     *dropCollector      // drops.go
	neigh     *scrapedCollector   // neighbours.go
	follow    *scrapedCollector   // follow.go
	ipv6      *scrapedCollector   // ipv6.go
	frag      *scrapedCollector   // fragments.go
	drain     *scrapedCollector   // drain.go
}

// New creates the registry and registers every isolatord series (each label
// combination initialised at zero), isolatord_build_info{version,goversion},
// and the Go and process collectors.
func New(version string) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{reg: reg, neigh: newScrapedCollector(neighbourSeries), ipv6: newScrapedCollector(ipv6Series),
		follow: newScrapedCollector(followSeries), frag: newScrapedCollector(fragmentSeries), drain: newScrapedCollector(drainSeries)}
	reg.MustRegister(m.neigh, m.ipv6, m.follow, m.frag, m.drain)

	m.filterOps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "filter_operations_total",
		Help:      "tc filter netlink requests by operation (add, remove, update), device (eth0, lo, veth, container_lo, container_eth0), filter kind (ip, arp, icmp) and result (ok, error, exists, not_found).",
	}, []string{"op", "device", "kind", "result"})
	m.filterIdx = map[tcfilter.Op]prometheus.Counter{}
	for _, op := range FilterOps {
		for _, dev := range FilterDevices {
			for _, kind := range FilterKinds {
				for _, res := range FilterResults {
					k := tcfilter.Op{Op: op, Device: dev, Kind: kind, Result: res}
					m.filterIdx[k] = m.filterOps.WithLabelValues(op, dev, kind, res)
				}
			}
		}
	}

	m.opTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "operations_total",
		Help:      "Lifecycle operations (prepare, isolate, update, usage, cleanup) by gRPC status code of their result.",
	}, []string{"op", "code"})
	m.opDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace,
		Name:      "operation_duration_seconds",
		Help:      "Duration of lifecycle operations, successful or not.",
		Buckets:   DurationBuckets,
	}, []string{"op"})
	for _, op := range Ops {
		m.opDuration.WithLabelValues(op)
		for _, c := range allCodes() {
			m.opTotal.WithLabelValues(op, c.String())
		}
	}

	m.rpcRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "rpc_requests_total",
		Help:      "Unary gRPC calls handled, by full method name, gRPC status code and the caller's uid (SO_PEERCRED).",
	}, []string{"method", "code", "peer_uid"})
	m.rpcDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace,
		Name:      "rpc_duration_seconds",
		Help:      "Duration of unary gRPC calls, by full method name.",
		Buckets:   DurationBuckets,
	}, []string{"method"})

	m.recoveryContainers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "recovery_containers_total",
		Help:      "Containers resolved by start-up recovery, by outcome: kept (isolated, plumbing complete), prepared (nothing in the kernel), finished (an interrupted operation completed), rolled_back (an interrupted operation undone), cleaned_up (removed), failed (not recovered: reported, left as it was), rebuilt (from the kernel alone), range_restored (a rebuilt container's ip_local_port_range, changed by its tenant, written back to its block), held (an unattributed kernel object's slot and ports kept reserved).",
	}, []string{"outcome"})
	for _, o := range RecoveryOutcomes {
		m.recoveryContainers.WithLabelValues(o)
	}
	m.recoveryStrays = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "recovery_strays_removed_total",
		Help:      "Kernel objects (veths, filters, namespace mounts) that belonged to no known container, removed by start-up recovery.",
	})
	m.recoveryUnreserved = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "recovery_unreserved_containers_total",
		Help:      "Containers kept by start-up recovery whose ports no longer fit the configuration (their ports are not reserved).",
	})
	m.recoveryDuration = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace,
		Name:      "recovery_duration_seconds",
		Help:      "How long the last start-up recovery took (0 until it has run).",
	})
	m.recoveries = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "recoveries_total",
		Help:      "Start-up recoveries completed by this process (0 until recovery finishes, then 1).",
	})

	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace:   Namespace,
		Name:        "build_info",
		Help:        "Always 1; labels give the isolatord version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	buildInfo.Set(1)

	m.state = newStateCollector()
	m.hostPorts = newHostPortsCollector(m.state)
	m.drops = newDropCollector()
	m.orphans = newOrphansCounter()

	reg.MustRegister(m.drops)
	reg.MustRegister(
		m.filterOps, m.opTotal, m.opDuration, m.rpcRequests, m.rpcDuration,
		m.recoveryContainers, m.recoveryStrays, m.recoveryUnreserved, m.recoveryDuration, m.recoveries,
		buildInfo, m.state, m.hostPorts, m.orphans,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.handler = promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// A failing collector drops its own series (and counts in
		// promhttp_metric_handler_errors_total) instead of failing the scrape.
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            reg,
		MaxRequestsInFlight: 4,
		Timeout:             30 * time.Second,
	}))
	return m
}

// Registry returns the registry holding every isolatord collector.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats (it also
// exports promhttp_metric_handler_requests_total about itself).
func (m *Metrics) Handler() http.Handler { return m.handler }
