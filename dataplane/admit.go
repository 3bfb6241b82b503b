package dataplane

// Admission of the calls that change the kernel, and what reads need
// without d.mu.
//
// Almost every change a setup or teardown makes (links, qdiscs, filters,
// addresses, routes) takes the kernel's rtnl mutex, and so does every
// netlink read of links and filters, Stats' included. With a hundred
// setups in flight, a Stats queued behind all of them on rtnl; the kernel
// runs only one holder at a time anyway, so letting more than a few
// changing calls in at once only lengthens that queue. admit lets
// maxWriters Setups and Teardowns work at once; the others wait in Go,
// where reads do not queue behind them.

import (
	"context"
	"runtime"
)

// maxWriters is how many Setups and Teardowns work at once: enough to
// keep rtnl busy while others are between their kernel requests (namespace
// switches, procfs writes), few enough that a read waits behind few.
func maxWriters() int {
	return max(4, 2*runtime.GOMAXPROCS(0))
}

// admit waits for a writer's turn (or ctx); release ends it.
func (d *DataPlane) admit(ctx context.Context) (release func(), err error) {
	select {
	case d.writers <- struct{}{}:
		return func() { <-d.writers }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// noteVeth records (veth > 0) or forgets (0) container id's host veth for
// Stats, which looks it up without d.mu.
func (d *DataPlane) noteVeth(id string, veth int) {
	if veth > 0 {
		d.statsVeth.Store(id, veth)
	} else {
		d.statsVeth.Delete(id)
	}
}
