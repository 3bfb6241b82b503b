package tcfilter

// The H2 tables of small ranges, created and deleted on demand, and the
// stale list of unlinked tables the kernel still holds busy.

import (
	"errors"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// linkH2 creates H2_b (or reuses an empty one still waiting for deletion)
// and links H1[b] to it.
func (x *HostDemux) linkH2(b uint8) error {
	t := TableH2Base + uint32(b)
	x.unstale(t)
	if err := x.d.addTable(KindIP, PrioIP, t, 16); err != nil {
		return err
	}
	if err := x.d.add(KindIP, h2Link(b)); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	x.h2Linked[b] = true
	return nil
}

// releaseH2 unlinks the H2 tables of bs that hold no node any more and
// deletes them (link node first, then the table). The kernel keeps an
// unlinked table busy until deferred RCU work drops the link's reference
// (~10-25 ms); rather than make the caller wait, a busy table is kept on the
// stale list: it is empty and unreachable, later calls retry it once each,
// and Flush and Init wait for it.
func (x *HostDemux) releaseH2(bs []uint8) {
	var ts []tableRef
	for _, b := range bs {
		if !x.h2Linked[b] || x.h2[b] > 0 {
			continue
		}
		err := x.d.del(KindIP, PrioIP, MakeU32Handle(TableH1, uint32(b), nodeH2Link))
		if err != nil && !errors.Is(err, unix.ENOENT) {
			continue // keep it linked; a later release retries
		}
		x.h2Linked[b] = false
		ts = append(ts, tableRef{KindIP, PrioIP, TableH2Base + uint32(b)})
	}
	x.dropTables(ts)
}

// dropTables makes one attempt at deleting unlinked tables and keeps the
// busy ones on the stale list.
func (x *HostDemux) dropTables(ts []tableRef) {
	if len(ts) == 0 {
		return
	}
	busy, _ := x.d.delTables(ts, 0)
	for _, t := range busy {
		x.addStale(t)
	}
}

func (x *HostDemux) isStale(htid uint32) bool {
	return slices.ContainsFunc(x.stale, func(t tableRef) bool { return t.htid == htid })
}

func (x *HostDemux) addStale(t tableRef) {
	if !x.isStale(t.htid) {
		x.stale = append(x.stale, t)
	}
}

func (x *HostDemux) unstale(htid uint32) {
	x.stale = slices.DeleteFunc(x.stale, func(t tableRef) bool { return t.htid == htid })
}

// staleRetryGap is the least time between two attempts at the stale
// tables: the kernel frees an unlinked table in deferred work that needs
// rtnl, so a table busy now stays busy for milliseconds, longer while
// setups and teardowns keep rtnl busy; a retry at every call (every
// teardown of a drain) would cost one futile request per stale table.
const staleRetryGap = 20 * time.Millisecond

// retryStale makes one attempt at deleting tables that were still busy, at
// most once per staleRetryGap.
func (x *HostDemux) retryStale() {
	if len(x.stale) == 0 || time.Since(x.staleTried) < staleRetryGap {
		return
	}
	x.staleTried = time.Now()
	busy, _ := x.d.delTables(x.stale, 0)
	x.stale = busy
}

// Flush waits until the hash tables that were unlinked by earlier calls
// (H2 tables whose last range left, spread tables of ports no longer
// shared) are deleted; the kernel holds them busy for a few milliseconds
// after their link node goes. Nothing routes through such tables, so
// calling Flush is never needed for correctness; it gives a device with no
// leftovers (tests, shutdown).
func (x *HostDemux) Flush() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.flushLocked()
}

func (x *HostDemux) flushLocked() error {
	if len(x.stale) == 0 {
		return nil
	}
	busy, err := x.d.delTables(x.stale, tableBusyTimeout)
	x.stale = busy
	return err
}
