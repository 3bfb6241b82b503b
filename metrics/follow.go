package metrics

import (
	"github.com/isolatord/isolatord/isolator/plane"
)

// Host follower series (dataplane follow.go: containers follow the host's
// address, gateway, MTU, MAC and eth0 at run time), read at scrape time
// from the source WatchFollower gives; zero until then.
var followSeries = []series{
	{"host_changes_total", "Changes of the host's interface (address, gateway, MTU, MAC, IPv6, a recreated eth0) the daemon applied at run time.", false, nil},
	{"host_follow_synced_total", "Containers brought in line with a change of the host.", false, nil},
	{"host_follow_failures_total", "Attempts to bring a container in line with the host that failed (each is retried).", false, nil},
	{"host_follow_pending", "Containers not in line with the host now.", true, nil},
	{"host_follow_events_total", "Netlink notifications about the host's eth0 or lo.", false, nil},
	{"host_follow_resubscriptions_total", "Times the netlink subscription to the host's changes ended and was made again.", false, nil},
}

// WatchFollower makes every scrape read the host follower's counters from
// src (for instance (*dataplane.DataPlane).FollowStats).
func (m *Metrics) WatchFollower(src func() plane.FollowStats) {
	watchSource(m.follow, src, func(st plane.FollowStats) []float64 {
		return floats(st.Changes, st.Synced, st.Failures, uint64(st.Pending), st.Events, st.Resyncs)
	})
}
