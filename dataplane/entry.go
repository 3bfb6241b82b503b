package dataplane

import "context"

// cacheUse says what an entry point does to the recovery cache
// (d.rootQdiscs, see fillRootQdiscs).
type cacheUse bool

const (
	keepCache cacheUse = false // the call changes no qdisc: the cache stays valid
	dropCache cacheUse = true  // the call may change qdiscs: the cache ends
)

// begin is the preamble of an entry point about container id: it checks
// the ID and ctx, takes d.mu, ends the recovery cache if cache says so and
// fails unless the data plane is open and prepared. On success d.mu is held
// and the caller unlocks it; on error it is not held.
func (d *DataPlane) begin(ctx context.Context, id string, cache cacheUse) error {
	if err := checkID(id); err != nil {
		return err
	}
	return d.beginHost(ctx, cache)
}

// beginHost is begin for an entry point about no one container.
func (d *DataPlane) beginHost(ctx context.Context, cache cacheUse) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	d.mu.Lock()
	if cache == dropCache {
		d.rootQdiscs = nil
	}
	if err := d.ready(); err != nil {
		d.mu.Unlock()
		return err
	}
	return nil
}
