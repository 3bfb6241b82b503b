package dataplane

import (
	"fmt"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/wait"
)

// BenchmarkFollowRenumber measures the time from a renumbering of the
// host (new address and gateway added, the old address removed: three
// `ip` commands) to every container in line with it (the follower's
// count of containers not in line back to zero), with 100 and then
// 1,000 containers plumbed: inline-ms/op (150 ms of it is the wait for
// the burst's end). Each iteration renumbers the other way round.
// Containers' insides are brought in line a few at once
// (followWorkers), their host sides one at a time.
func BenchmarkFollowRenumber(b *testing.B) {
	fe := newFollowEnv(b)
	sb := fe.sb
	ip(b, sb.Client, "addr", "add", "198.18.5.2/24", "dev", "eth0")
	addrs := [2][2]string{{"198.18.0.1/24", "198.18.0.2"}, {"198.18.5.1/24", "198.18.5.2"}}
	cur := 0
	have := 0
	for _, n := range []int{100, 1000} {
		fe.addFleet(have, n-have)
		have = n
		b.Run(fmt.Sprintf("containers=%d", n), func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				from, to := addrs[cur], addrs[1-cur]
				start := time.Now()
				ip(b, sb.Host, "addr", "add", to[0], "dev", "eth0")
				ip(b, sb.Host, "route", "replace", "default", "via", to[1], "dev", "eth0")
				ip(b, sb.Host, "addr", "del", from[0], "dev", "eth0")
				ok := wait.Until(2*time.Minute, func() bool {
					st := fe.d.FollowStats()
					h := fe.host()
					return h.IP.String() == to[0] && st.Pending == 0
				})
				if !ok {
					b.Fatalf("%d containers not in line with %s: %+v", n, to[0], fe.d.FollowStats())
				}
				total += time.Since(start)
				cur = 1 - cur
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "inline-ms/op")
			b.ReportMetric(0, "ns/op")
		})
	}
}
