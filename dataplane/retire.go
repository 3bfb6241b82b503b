package dataplane

// Teardown without waiting for the kernel's RCU grace periods.
//
// Deleting a veth pair costs the kernel ~20 ms of waiting (RCU grace periods
// and barriers in unregister_netdevice), whatever the size of the pair, and
// deleting many links in one request costs about the same as deleting one.
// So Teardown does not delete a container's links itself: after the host
// demux entries that lead to the veth are gone, it retires the veth (and the
// egress shaper pair, if any):
//
//  1. the host end is set down: the pair has no carrier, nothing the
//     container sends leaves it and nothing is delivered to it (a mirred
//     redirect to a down link drops the packet);
//  2. it is renamed RetiredPrefix+ifindex (so the container's veth name is
//     free at once for a new setup of the same ID) and moved to link group
//     RetiredGroup.
//
// A background goroutine deletes them at a quiet moment of the control
// plane (settle): a few, one request each by their retired name (the rtnl
// lock is free between two, so a setup waits for one deletion at most);
// many (a drain), the whole group with one RTM_DELLINK (the kernel's group
// delete: one unregister_netdevice_many, one set of grace periods for every
// link in it).
// The kernel holds the pending list itself: a daemon killed with retired
// links still present deletes them at its next start (PrepareHost), after
// checking that every link of the group has a retired name (a link of that
// group we did not name is left alone and reported).
//
// The retired veth's peer keeps its name (eth0) inside the container's
// namespace until the group is deleted; a Setup into that same namespace
// meanwhile finds eth0 taken, waits for the pending deletion and retries.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/veth"
)

const (
	// RetiredGroup is the link group of retired links awaiting deletion.
	RetiredGroup = 0x150d1e7e
	// RetiredPrefix starts the name of a retired link (then its ifindex).
	RetiredPrefix = "isdel"
)

// retiredName is the name of a retired link.
func retiredName(idx int) string { return RetiredPrefix + strconv.Itoa(idx) }

// isRetiredName reports whether name is a retired link's name.
func isRetiredName(name string) bool {
	rest, ok := strings.CutPrefix(name, RetiredPrefix)
	if !ok || rest == "" {
		return false
	}
	_, err := strconv.Atoi(rest)
	return err == nil
}

// retirer deletes retired links in the background, batched.
type retirer struct {
	d       *DataPlane
	pending atomic.Int64 // links retired and not yet deleted
	// unsafe: the group holds links that are not ours, so it is never
	// deleted as a whole; retire then deletes links itself.
	unsafe atomic.Bool
	wake   chan struct{}
	urgent chan struct{} // a setup waits for the next pass
	busy   chan struct{} // a setup started: the control plane is not quiet
	stop   chan struct{}
	done   chan struct{}
	sock   retireSocket // of the retire requests (setRetired)

	mu      sync.Mutex
	waiters chan struct{} // closed at the end of the next pass
	names   []string      // retired by this run and not deleted yet (pending counts the sweep's too)
}

func newRetirer(d *DataPlane) *retirer {
	r := &retirer{d: d, wake: make(chan struct{}, 1), urgent: make(chan struct{}, 1), busy: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), waiters: make(chan struct{})}
	go r.loop()
	return r
}

// touch tells the deletion that a setup started (settle).
func (r *retirer) touch() {
	select {
	case r.busy <- struct{}{}:
	default:
	}
}

// kick asks for a deletion pass.
func (r *retirer) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// wait asks for a pass now and waits until one that started after the call
// has ended.
func (r *retirer) wait() {
	// The pass under way may have started before the call: wait for the
	// one after it too.
	for range 2 {
		r.mu.Lock()
		ch := r.waiters
		r.mu.Unlock()
		select {
		case r.urgent <- struct{}{}:
		default:
		}
		r.kick()
		select {
		case <-ch:
		case <-r.done:
			return
		}
	}
}

// close stops the goroutine after a last pass.
func (r *retirer) close() {
	close(r.stop)
	<-r.done
	r.sock.close()
}

func (r *retirer) loop() {
	defer close(r.done)
	for {
		select {
		case <-r.wake:
			r.settle()
		case <-r.stop:
			if r.pending.Load() > 0 {
				r.pass()
			}
			return
		}
		r.pass()
	}
}

// Batching window of the deletion passes (settle).
const (
	retireQuiet    = 5 * time.Millisecond
	retireMaxDelay = 250 * time.Millisecond
)

// settle defers a deletion pass to a quiet moment of the control plane.
// Deleting links holds the kernel's rtnl lock for a time that grows with the
// number of tc actions on the host (mirred_device_event walks them all for
// each link), and setups need that lock too: so a pass waits until no link
// was retired and no setup started for retireQuiet (a drain retires all its
// links first, a setup/teardown loop deletes in batches), retireMaxDelay at
// most, and starts at once when a setup waits for it (wait) or on close.
func (r *retirer) settle() {
	limit := time.NewTimer(retireMaxDelay)
	defer limit.Stop()
	for {
		quiet := time.NewTimer(retireQuiet)
		select {
		case <-r.wake:
			quiet.Stop()
			continue
		case <-r.busy:
			quiet.Stop()
			continue
		case <-r.urgent:
		case <-r.stop: // closed: seen again by loop
		case <-quiet.C:
		case <-limit.C:
		}
		quiet.Stop()
		return
	}
}

// WaitRetired waits until the links retired so far are deleted (tests and
// tools that count links; Teardown never needs it).
func (d *DataPlane) WaitRetired() {
	if r := d.retired; r != nil && r.pending.Load() > 0 {
		r.wait()
	}
}

// retireOneByOne: up to this many links waiting, a pass deletes them one
// request each (by their retired name), so that the kernel's rtnl lock is
// free between two of them and a setup waits for one deletion at most; more
// (a drain), and the whole group goes in one request, for throughput.
const retireOneByOne = 8

// pass deletes the retired links once.
func (r *retirer) pass() {
	r.mu.Lock()
	names := r.names
	r.names = nil
	r.mu.Unlock()
	n := r.pending.Load()
	var err error
	if int(n) <= retireOneByOne && len(names) == int(n) {
		var left []string
		for _, name := range names {
			if e := r.d.deleteRetiredLink(name); e != nil {
				err = e
				left = append(left, name)
				continue
			}
			r.pending.Add(-1)
		}
		if len(left) > 0 {
			r.mu.Lock()
			r.names = append(left, r.names...)
			r.mu.Unlock()
		}
	} else if err = r.d.deleteRetired(); err == nil {
		r.pending.Add(-n)
	} else {
		r.mu.Lock()
		r.names = append(names, r.names...)
		r.mu.Unlock()
	}
	if err != nil {
		r.d.log.Warn("deleting retired links failed; they stay down and are retried at the next teardown or start", "err", err)
	}
	r.mu.Lock()
	close(r.waiters)
	r.waiters = make(chan struct{})
	r.mu.Unlock()
	if err == nil && r.pending.Load() > 0 {
		r.kick()
	}
}

// retire mutes link idx (down) and hands it to the background deletion
// (renamed, moved to RetiredGroup). It reports whether the link existed.
// The three changes go in one RTM_SETLINK (retireRequest); when that fails,
// they are made one request each, so the error names the step.
func (d *DataPlane) retire(idx int) (bool, error) {
	if d.retired.unsafe.Load() {
		return veth.Delete(d.h, idx)
	}
	err := d.retired.setRetired(d, idx)
	if err != nil && veth.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		if existed, err := d.retireStepwise(idx); err != nil || !existed {
			return existed, err
		}
	}
	d.retired.mu.Lock()
	d.retired.names = append(d.retired.names, retiredName(idx))
	d.retired.mu.Unlock()
	d.retired.pending.Add(1)
	d.retired.kick()
	return true, nil
}

// retireStepwise sets link idx down, renames it and moves it to
// RetiredGroup, one request each. A link left in RetiredGroup under another
// name would make the group unsafe to delete (sweepRetired): a failed
// rename takes it out again.
func (d *DataPlane) retireStepwise(idx int) (bool, error) {
	l := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}
	if err := d.h.LinkSetDown(l); err != nil {
		if veth.IsNotFound(err) {
			return false, nil
		}
		return true, fmt.Errorf("set link %d down: %w", idx, err)
	}
	// Not found from here on: deleted meanwhile with its peer (a shaper
	// pair's other end already retired), which is the aim.
	if err := d.h.LinkSetName(l, retiredName(idx)); err != nil {
		if veth.IsNotFound(err) {
			return true, nil
		}
		if gerr := d.h.LinkSetGroup(l, 0); gerr != nil && !veth.IsNotFound(gerr) {
			err = errors.Join(err, gerr)
		}
		return true, fmt.Errorf("rename link %d for deletion: %w", idx, err)
	}
	if err := d.h.LinkSetGroup(l, RetiredGroup); err != nil {
		if veth.IsNotFound(err) {
			return true, nil
		}
		return true, fmt.Errorf("move link %d to the deletion group: %w", idx, err)
	}
	return true, nil
}

// retireByName retires the named host link; it reports whether it existed.
func (d *DataPlane) retireByName(name string) (bool, error) {
	l, err := d.h.LinkByName(name)
	if err != nil {
		if veth.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("look up link %s: %w", name, err)
	}
	return d.retire(l.Attrs().Index)
}

// deleteRetired deletes every link of RetiredGroup in the host namespace in
// one request. An empty group is not an error.
func (d *DataPlane) deleteRetired() error {
	return d.delLinkBy(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(RetiredGroup)))
}

// deleteRetiredLink deletes one retired link by its name (a name only
// retire gives: never another link, even if the ifindex was reused). A
// link already gone is not an error.
func (d *DataPlane) deleteRetiredLink(name string) error {
	return d.delLinkBy(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
}

// delLinkBy sends one RTM_DELLINK naming its link(s) by attr (a name, or a
// group: all its links) in the host namespace; none found is not an error.
func (d *DataPlane) delLinkBy(attr *nl.RtAttr) error {
	return d.hostNS.Do(func() error {
		req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
		req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
		req.AddData(attr)
		_, err := req.Execute(unix.NETLINK_ROUTE, 0)
		if errors.Is(err, unix.ENODEV) {
			return nil
		}
		return err
	})
}

// sweepRetired, at start-up, finds links a previous run retired and did not
// delete yet (it was killed). When every link of RetiredGroup has a retired
// name, the group is deleted in the background; otherwise only ours are
// deleted, one by one, and the others are reported and left alone.
func (d *DataPlane) sweepRetired() error {
	ls, err := d.recoveryHostLinks()
	if err != nil {
		return err
	}
	var ours []int
	var foreign []string
	for _, l := range ls {
		a := l.Attrs()
		if a.Group != RetiredGroup {
			continue
		}
		if isRetiredName(a.Name) {
			ours = append(ours, a.Index)
		} else {
			foreign = append(foreign, a.Name)
		}
	}
	if len(ours) == 0 {
		return nil
	}
	d.log.Info("deleting links retired by an earlier run", "links", len(ours))
	if len(foreign) == 0 {
		d.retired.pending.Add(int64(len(ours)))
		d.retired.kick()
		return nil
	}
	d.retired.unsafe.Store(true)
	d.log.Warn("links not named by isolatord are in its deletion group; left alone, and teardowns delete their links themselves",
		"group", RetiredGroup, "links", strings.Join(foreign, ","))
	var errs []error
	for _, idx := range ours {
		if _, err := veth.Delete(d.h, idx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
