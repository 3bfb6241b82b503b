package metrics

// ipv6Series: isolatord_ipv6_to_host_packets_total, IPv6 packets for the
// host's addresses that the eth0 demux passed to the host without looking
// at their ports (extension headers, fragments, other next headers), read
// from the kernel at scrape time from the source WatchIPv6ToHost gives;
// zero until then (and without IPv6).
var ipv6Series = []series{
	{"ipv6_to_host_packets_total", "IPv6 packets for the host's addresses that the host demux did not demultiplex by port (extension headers, fragments, other next headers) and left to the host.", false, nil},
}

// WatchIPv6ToHost makes every scrape read the counter from src (for
// instance (*dataplane.DataPlane).IPv6ToHost).
func (m *Metrics) WatchIPv6ToHost(src func() (uint64, error)) {
	var last uint64 // a counter never goes back (the demux re-created by a restart starts at 0)
	var read func() uint64
	if src != nil {
		read = func() uint64 {
			if n, err := src(); err == nil {
				last = max(last, n)
			}
			return last
		}
	}
	watchSource(m.ipv6, read, func(n uint64) []float64 { return floats(n) })
}
