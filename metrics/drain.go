package metrics

// drainSeries: the drains in force (docs/handoff.md), read from the data
// plane at scrape time from the source WatchDrains gives: the holdings of
// a port that drain (one per container and port) and the flows that
// still reach them (the host's pins of their live flows).
var drainSeries = []series{
	{"draining_ports", "Static ports a container drains (one per container and port): no new flow reaches it there.", true, nil},
	{"draining_live_flows", "Flows that still reach the containers draining ports (the host's pins of their live flows); 0 when every drain is done.", true, nil},
}

// WatchDrains makes every scrape read the drains from src (for instance
// (*dataplane.DataPlane).DrainTotals).
func (m *Metrics) WatchDrains(src func() (holdings, flows int)) {
	type totals struct{ holdings, flows int }
	var read func() totals
	if src != nil {
		read = func() totals { h, f := src(); return totals{h, f} }
	}
	watchSource(m.drain, read, func(t totals) []float64 { return floats(t.holdings, t.flows) })
}
