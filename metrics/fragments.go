package metrics

import "github.com/prometheus/client_golang/prometheus"

// Fragments are the fragment steering's counters (package
// tcfilter/fragbpf, read through the data plane).
type Fragments struct {
	Enabled            bool
	Steered4, Steered6 uint64 // later fragments sent after their first fragment
	Host4, Host6       uint64 // later fragments left to the host
	Evicted            uint64 // datagrams dropped from a full table
	Entries            uint64 // datagrams in the tables now
}

// fragmentSeries: isolatord_fragments_steered_total{family},
// isolatord_fragments_to_host_total{family},
// isolatord_fragment_table_evictions_total and
// isolatord_fragment_table_entries, read at scrape time from the source
// WatchFragments gives; zero until then (and without fragment steering).
var fragmentSeries = func() []series {
	const (
		steered = "Later fragments of datagrams sent to the container their first fragment went to."
		host    = "Later fragments (TCP/UDP) whose first fragment no container got (the host's own datagrams, or a first fragment not seen yet): left to the host."
	)
	v4, v6 := prometheus.Labels{"family": "ipv4"}, prometheus.Labels{"family": "ipv6"}
	return []series{
		{"fragments_steered_total", steered, false, v4},
		{"fragments_steered_total", steered, false, v6},
		{"fragments_to_host_total", host, false, v4},
		{"fragments_to_host_total", host, false, v6},
		{"fragment_table_evictions_total", "Datagrams dropped from a full fragment table (least recently used first) to make room.", false, nil},
		{"fragment_table_entries", "Datagrams in the fragment tables (IPv4 and IPv6) now.", true, nil},
	}
}()

// WatchFragments makes every scrape read the fragment counters from src.
func (m *Metrics) WatchFragments(src func() (Fragments, error)) {
	var last Fragments // counters never go back (tables rebuilt empty by a restart)
	var read func() Fragments
	if src != nil {
		read = func() Fragments {
			if f, err := src(); err == nil {
				l := &last
				l.Steered4, l.Steered6 = max(l.Steered4, f.Steered4), max(l.Steered6, f.Steered6)
				l.Host4, l.Host6 = max(l.Host4, f.Host4), max(l.Host6, f.Host6)
				l.Evicted = max(l.Evicted, f.Evicted)
				l.Entries = f.Entries
			}
			return last
		}
	}
	watchSource(m.frag, read, func(l Fragments) []float64 {
		return floats(l.Steered4, l.Steered6, l.Host4, l.Host6, l.Evicted, l.Entries)
	})
}
