package neighsync

import "time"

// Per-namespace accounting: every request a container makes costs the
// Syncer's one reader (and, for an address the host does not know, a
// host resolution). The socket filter (filter.go) keeps a tenant's churn
// of its own entries away; requests on its eth0 get through, bounded by
// its kernel (app_solicit requests per entry per retrans_time, both of
// which a root tenant may raise). A budget per container bounds what one
// of them may cost: requests beyond it are counted (Stats.Throttled) and
// not served; the container asks again (app_solicit times, then on its
// next packet), so a container that asks at a sane rate never notices.

// Budget of a container: a burst of budgetBurst requests, refilled at
// budgetRate a second (a container meeting a whole /24 of neighbours at
// once is served within a few seconds).
var budgetBurst = 256.0

const budgetRate = 128.0

// budget is a token bucket.
type budget struct {
	tokens float64
	at     time.Time
}

func newBudget(now time.Time) budget { return budget{tokens: budgetBurst, at: now} }

// take spends one request at now, if the budget has one.
func (b *budget) take(now time.Time) bool {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(budgetBurst, b.tokens+d.Seconds()*budgetRate)
		b.at = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
