package neighsync

import "time"

// Per-namespace accounting: every request a container makes costs the
// Syncer's one reader time (a netlink request into the container, or a
// host resolution, each taking the kernel's locks, slower when the machine
// is busy). The socket filter (filter.go) keeps a tenant's churn of its
// own entries away; requests on its eth0 get through, bounded by its
// kernel (app_solicit requests per entry per retrans_time, both of which
// a root tenant may raise). A budget per container bounds what one of
// them may cost: the reader's time spent on its requests (at least
// minRequestCost each), refilled at budgetRate (a share of the reader)
// up to budgetBurst. Requests beyond it are counted (Stats.Throttled) and
// not served; the container asks again (app_solicit times, then on its
// next packet), so a container that asks at a sane rate never notices:
// 500 requests at once, 100 a second after, on a quiet machine.

// budgetBurst is the most reader time a container may have saved up.
var budgetBurst = 250 * time.Millisecond

const (
	budgetRate     = 0.05 // reader time a second each container may use
	minRequestCost = 500 * time.Microsecond
)

// budget is a token bucket of reader time.
type budget struct {
	left time.Duration
	at   time.Time
}

func newBudget(now time.Time) budget { return budget{left: budgetBurst, at: now} }

// ok reports whether a request may be served at now (the budget is not
// spent).
func (b *budget) ok(now time.Time) bool {
	if d := now.Sub(b.at); d > 0 {
		b.left = min(budgetBurst, b.left+time.Duration(float64(d)*budgetRate))
		b.at = now
	}
	return b.left > 0
}

// charge spends what a served request cost (took, minRequestCost at
// least).
func (b *budget) charge(took time.Duration) {
	b.left -= max(took, minRequestCost)
}
