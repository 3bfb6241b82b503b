package metrics

import (
	"github.com/isolatord/isolatord/netns/neighsync"
)

// Neighbour sync series (package neighsync: containers get their
// neighbours from the host's table instead of ARP), read at scrape time
// from the source WatchNeighbours gives; zero until then.
var neighbourSeries = []series{
	{"neighbour_requests_total", "Neighbour requests from containers (their kernel asking user space for an address's MAC).", false, nil},
	{"neighbour_entries_written_total", "Neighbour entries written into containers from the host's table.", false, nil},
	{"neighbour_entries_deleted_total", "Neighbour entries deleted in containers because the host's entry went or failed.", false, nil},
	{"neighbour_host_resolutions_total", "Host neighbour resolutions started for containers (addresses the host did not know).", false, nil},
	{"neighbour_errors_total", "Failed netlink requests of the neighbour sync.", false, nil},
	{"neighbour_requests_refused_total", "Neighbour requests from containers not served: the container already waited for neighsync.MaxWaiting unresolved addresses.", false, nil},
	{"neighbour_resyncs_total", "Times neighbour notifications were lost (a receive buffer of the neighbour sync was full) and the host's or the containers' tables read again.", false, nil},
	{"neighbour_requests_throttled_total", "Neighbour requests from containers not served: the container asked faster than its budget allows (it asks again).", false, nil},
}

// WatchNeighbours makes every scrape read the neighbour sync's counters
// from src (for instance (*dataplane.DataPlane).NeighStats).
func (m *Metrics) WatchNeighbours(src func() neighsync.Stats) {
	watchSource(m.neigh, src, func(st neighsync.Stats) []float64 {
		return floats(st.Asked, st.Pushed, st.Deleted, st.Kicks, st.Errors, st.Refused, st.Resyncs, st.Throttled)
	})
}
