package dataplane

// Teardown without waiting for the kernel's RCU grace periods.
//
// Deleting a veth pair costs the kernel ~20 ms of waiting (RCU grace periods
// and barriers in unregister_netdevice), whatever the size of the pair, and
// deleting many links in one request costs about the same as deleting one.
// Setting a link down (dev_close: dev_deactivate_many) and renaming it
// (netif_change_name) each wait for an expedited grace period too, under
// the rtnl lock, which serialises a drain. So Teardown does not delete a
// container's links, nor set them down or rename them: after the host
// demux entries that lead to the veth are gone, it retires the veth (and
// the egress shaper pair, if any) in one write to the kernel:
//
//  1. the veth is muted: a filter ahead of all others on its ingress
//     drops (and the qdisc counts) everything the container sends
//     (tcfilter.Mute); nothing leads to it any more, so the container is
//     cut off while the link stays up;
//  2. it is moved to link group RetiredGroup (netif_set_group: no wait).
//
// Without cls_bpf (no mute filter) the link is set down instead, in the
// same request as the group. A retired link keeps its name until it is
// deleted: every lookup of a container's links by name skips links of
// RetiredGroup (isRetired), and a Setup of the same container ID meanwhile
// finds the name taken (as it finds eth0 taken in the same namespace),
// waits for the pending deletion and retries.
//
// A background goroutine deletes them at a quiet moment of the control
// plane (settle): a few, one request each by ifindex after reading the
// link back (still in RetiredGroup and ours; the rtnl lock is free between
// two, so a setup waits for one deletion at most); many (a drain), the
// whole group with one RTM_DELLINK (the kernel's group delete: one
// unregister_netdevice_many, one set of grace periods for every link in
// it), after a dump has shown that every link of the group is ours
// (ourRetired: a veth named like ours whose alias names that container,
// or an egress shaper end named like ours). A link of the group we cannot attribute
// is not deleted: it is reported, and from then on teardowns delete their
// links themselves. (The kernel cannot delete a group on a condition: a
// link someone moves into RetiredGroup between that dump and the delete,
// a few ms, goes with it. The group number is isolatord's alone.)
// A retired veth moved to the group but not cut off (the mute and the
// fallback both failed, or the daemon was killed between two requests of
// the fallback) is cut off again by the teardown done again and by the
// start-up sweep (cutAgain).
// The kernel holds the pending list itself: a daemon killed with retired
// links still present deletes them at its next start (PrepareHost).

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/veth"
	"github.com/isolatord/isolatord/tcfilter"
)

// RetiredGroup is the link group of retired links awaiting deletion.
const RetiredGroup = 0x150d1e7e

// isRetired reports whether a host link is retired (in RetiredGroup): no
// longer any container's, whatever its name.
func isRetired(a *netlink.LinkAttrs) bool { return a.Group == RetiredGroup }

// ourRetired reports whether a link of RetiredGroup is one isolatord
// retired: a host veth named like ours whose alias names the container
// the name belongs to, or an egress shaper end named like ours.
func ourRetired(a *netlink.LinkAttrs) bool {
	switch {
	case !isRetired(a):
		return false
	case isShaperEntryName(a.Name), isShaperExitName(a.Name):
		return true
	case isVethName(a.Name):
		m, ok := parseAlias(a.Alias)
		return ok && plane.VethName(m.ID) == a.Name
	}
	return false
}

// errRetired is the not-found error of a lookup by name that found only a
// retired link.
func errRetired(name string) error {
	return fmt.Errorf("link %s is retired (awaiting deletion): %w", name, unix.ENODEV)
}

// liveLinks leaves out the retired links of ls.
func liveLinks(ls []netlink.Link) []netlink.Link {
	out := make([]netlink.Link, 0, len(ls))
	for _, l := range ls {
		if !isRetired(l.Attrs()) {
			out = append(out, l)
		}
	}
	return out
}

// retirer deletes retired links in the background, batched.
type retirer struct {
	d       *DataPlane
	pending atomic.Int64 // links retired and not yet deleted (len(idxs) and those of a pass under way)
	// unsafe: the group holds links that are not ours, so it is never
	// deleted as a whole; retire then deletes links itself.
	unsafe atomic.Bool
	wake   chan struct{}
	urgent chan struct{} // a setup waits for the next pass
	busy   chan struct{} // a setup started: the control plane is not quiet
	// tearing: teardowns in progress (the control plane is not quiet).
	tearing atomic.Int64
	// held: passes delete nothing while it is above zero (tests that look
	// at retired links; release kicks a pass).
	held atomic.Int64
	stop chan struct{}
	done chan struct{}
	sock retireSocket    // of the retire requests (setRetired)
	bg   *netlink.Handle // of the deletions (the goroutine's; opened at its first pass)

	mu      sync.Mutex
	waiters chan struct{} // closed at the end of the next pass
	idxs    []int         // ifindexes retired and not deleted yet
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

// add hands retired links to the deletion.
func (r *retirer) add(idxs ...int) {
	r.mu.Lock()
	r.idxs = append(r.idxs, idxs...)
	r.mu.Unlock()
	r.pending.Add(int64(len(idxs)))
	r.kick()
}

func (r *retirer) loop() {
	defer close(r.done)
	defer func() {
		if r.bg != nil {
			r.bg.Close()
		}
	}()
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
	retireQuiet         = 5 * time.Millisecond
	retireMaxDelay      = 250 * time.Millisecond
	retireMaxGroupDelay = 15 * time.Second
)

// settle defers a deletion pass to a quiet moment of the control plane.
// Deleting links holds the kernel's rtnl lock for a time that grows with the
// number of tc actions on the host (mirred_device_event walks them all for
// each link), and setups and teardowns need that lock too: so a pass waits
// until no teardown is in progress and no link was retired and no setup
// started for retireQuiet (a drain retires all its links first, a
// setup/teardown loop deletes in batches),
// and starts at once when a setup waits for it (wait) or on close. It
// waits retireMaxDelay at most, or, while teardowns are in progress or
// with more than retireOneByOne links waiting (a group delete, which holds
// the lock for all of them at once: seconds for hundreds of links),
// retireMaxGroupDelay: a drain's teardowns then never queue behind a
// deletion of the links they retired, even on a slow machine.
func (r *retirer) settle() {
	start := time.Now()
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
			if r.tearing.Load() > 0 {
				continue // a drain under way: more links to come
			}
		case <-limit.C:
			if left := retireMaxGroupDelay - time.Since(start); left > 0 && (r.pending.Load() > retireOneByOne || r.tearing.Load() > 0) {
				quiet.Stop()
				limit.Reset(left)
				continue
			}
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
// request each, so that the kernel's rtnl lock is free between two of them
// and a setup waits for one deletion at most; more (a drain), and the
// whole group goes in one request, for throughput. The group delete needs
// a dump of the host's links first (every link of the group must be ours),
// which costs the kernel ~30 ms of CPU with 1,000 containers (each veth's
// peer namespace id is looked up by a walk of the namespace ids): a pass
// of fewer links deletes them for less, one by one (the CPU of a deletion
// is the same either way; a group saves waiting).
const retireOneByOne = 32

// pass deletes the retired links once.
func (r *retirer) pass() {
	r.mu.Lock()
	idxs := r.idxs
	r.idxs = nil
	if r.held.Load() > 0 {
		r.idxs, idxs = idxs, nil
	}
	r.mu.Unlock()
	var left []int
	var err error
	if r.bg == nil {
		r.bg, err = r.d.hostNS.Netlink()
	}
	switch {
	case err != nil:
		left = idxs
	case len(idxs) <= retireOneByOne || r.unsafe.Load():
		left, err = r.deleteEach(idxs)
	default:
		left, err = r.deleteGroup(idxs)
	}
	r.pending.Add(-int64(len(idxs) - len(left)))
	if len(left) > 0 {
		r.mu.Lock()
		r.idxs = append(left, r.idxs...)
		r.mu.Unlock()
	}
	if err != nil {
		r.d.log.Warn("deleting retired links failed; they stay muted and are retried at the next teardown or start", "err", err)
	}
	r.mu.Lock()
	close(r.waiters)
	r.waiters = make(chan struct{})
	r.mu.Unlock()
	if err == nil && r.pending.Load() > 0 && r.held.Load() == 0 {
		r.kick()
	}
}

// deleteEach deletes the retired links idxs one request each, each after
// reading it back: a link gone already is done, one no longer retired or
// not ours is left alone (it is not the link we retired). It returns those
// it could not delete.
func (r *retirer) deleteEach(idxs []int) (left []int, err error) {
	var errs []error
	for _, idx := range idxs {
		l, lerr := r.bg.LinkByIndex(idx)
		if lerr != nil {
			if !veth.IsNotFound(lerr) {
				left, errs = append(left, idx), append(errs, fmt.Errorf("look up retired link %d: %w", idx, lerr))
			}
			continue
		}
		if !ourRetired(l.Attrs()) {
			r.d.log.Warn("a link retired by isolatord changed meanwhile; not deleted", "ifindex", idx, "name", l.Attrs().Name, "group", l.Attrs().Group)
			continue
		}
		if _, derr := veth.Delete(r.bg, idx); derr != nil {
			left, errs = append(left, idx), append(errs, derr)
		}
	}
	return left, errors.Join(errs...)
}

// deleteGroup deletes every link of RetiredGroup in one request once a
// dump has shown that they are all ours; otherwise it reports the others,
// marks the group unsafe and deletes ours one by one.
func (r *retirer) deleteGroup(idxs []int) (left []int, err error) {
	foreign, err := r.d.foreignRetired()
	if err != nil {
		return idxs, err
	}
	if len(foreign) > 0 {
		r.markUnsafe(foreign)
		return r.deleteEach(idxs)
	}
	if err := r.d.deleteRetired(); err != nil {
		return idxs, err
	}
	return nil, nil
}

// retiredIn sorts the links of RetiredGroup in ls: ours (ourRetired, by
// ifindex) and the others (by name).
func retiredIn(ls []netlink.Link) (ours []int, foreign []string) {
	for _, l := range ls {
		a := l.Attrs()
		if !isRetired(a) {
			continue
		}
		if ourRetired(a) {
			ours = append(ours, a.Index)
		} else {
			foreign = append(foreign, a.Name)
		}
	}
	return ours, foreign
}

// markUnsafe notes that RetiredGroup holds links that are not ours.
func (r *retirer) markUnsafe(foreign []string) {
	if r.unsafe.Swap(true) {
		return
	}
	r.d.log.Warn("links isolatord cannot attribute are in its deletion group; left alone, and teardowns delete their links themselves",
		"group", RetiredGroup, "links", strings.Join(foreign, ","))
}

// How retire cuts a link off.
type cutOff int

const (
	cutNone cutOff = iota // group only: nothing reaches the link any more
	cutMute               // the mute filter on its ingress (tcfilter.Mute)
	cutDown               // set down (waits for the kernel's grace periods)
)

// retire cuts link idx off (mute: a container's veth, muted or, without
// cls_bpf, set down; the egress shaper's links need nothing, nothing
// reaches them once the veth is cut off) and hands it to the background
// deletion (moved to RetiredGroup). It reports whether the link existed.
// The changes go in one write (setRetired); when that fails, they are made
// one request each, so the error names the step, and a veth the mute
// filter could not be added to is set down.
func (d *DataPlane) retire(idx int, mute bool) (bool, error) {
	r := d.retired
	if r.unsafe.Load() {
		return veth.Delete(d.h, idx)
	}
	how := cutNone
	if mute {
		how = cutDown
		if d.sink.BPF {
			how = cutMute
		}
	}
	muteErr, err := r.setRetired(d, idx, how)
	down := false
	if err != nil {
		if veth.IsNotFound(err) {
			return false, nil
		}
		if err := d.h.LinkSetGroup(linkRefIdx(idx), RetiredGroup); err != nil {
			if veth.IsNotFound(err) {
				return false, nil
			}
			return true, fmt.Errorf("move link %d to the deletion group: %w", idx, err)
		}
		down = how == cutDown
	}
	if how == cutMute && muteErr != nil {
		d.log.Warn("retired veth not muted; set down instead", "ifindex", idx, "err", muteErr)
		down = true
	}
	// In the group, it is the deletion's even when it could not be cut off
	// (deleting it cuts it off; nothing else would delete it in this run).
	r.add(idx)
	if down {
		if err := d.h.LinkSetDown(linkRefIdx(idx)); err != nil && !veth.IsNotFound(err) {
			return true, fmt.Errorf("set link %d down: %w", idx, err)
		}
	}
	return true, nil
}

// retireByName retires the named host link (a retired one is taken for
// gone); it reports whether it existed.
func (d *DataPlane) retireByName(name string, mute bool) (bool, error) {
	l, err := d.h.LinkByName(name)
	if err != nil {
		if veth.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("look up link %s: %w", name, err)
	}
	if isRetired(l.Attrs()) {
		if mute {
			return false, d.recut(l.Attrs())
		}
		return false, nil
	}
	return d.retire(l.Attrs().Index, mute)
}

// retireVethByName is retireByName for container id's host veth, which
// it makes attributable first (ensureAlias).
func (d *DataPlane) retireVethByName(name, id string) (bool, error) {
	if l, err := d.h.LinkByName(name); err == nil {
		d.ensureAlias(l.Attrs(), id)
	}
	return d.retireByName(name, true)
}

// ensureAlias gives container id's host veth an alias naming it when it
// has none of ours: a setup cut short before its alias (an isolate killed
// early, rolled back at the next start) would otherwise leave a retired
// veth no later start can attribute, never deleted, its peer holding eth0
// in the namespace so the namespace could not be isolated again. A
// failure is logged: the teardown goes on.
func (d *DataPlane) ensureAlias(a *netlink.LinkAttrs, id string) {
	if m, ok := parseAlias(a.Alias); ok && plane.VethName(m.ID) == a.Name {
		return
	}
	if err := d.h.LinkSetAlias(linkRefIdx(a.Index), metaAlias(plane.Meta{ID: id})); err != nil {
		d.log.Warn("veth alias not set before its retirement", "container", id, "veth", a.Name, "err", err)
		return
	}
	a.Alias = metaAlias(plane.Meta{ID: id})
}

// recut cuts a retired veth of ours off again (cutAgain) and hands it to
// the background deletion (a retire that failed after the move to the group
// did not); a link pending already is deleted once, the other entry finds
// it gone.
func (d *DataPlane) recut(a *netlink.LinkAttrs) error {
	if err := d.cutAgain(a); err != nil {
		return err
	}
	if ourRetired(a) && isVethName(a.Name) {
		d.retired.add(a.Index)
	}
	return nil
}

// cutAgain makes sure a retired veth of ours is cut off: muted (or, without
// cls_bpf or when the mute cannot be added, set down). A retire that failed
// or was killed after the move to RetiredGroup and before the cut leaves
// the veth in the group with its filters working; a lookup by name skips
// it, so the teardown done again (or the start-up sweep) cuts it here.
// Muted already, or gone, is not an error; a link not ours is left alone.
func (d *DataPlane) cutAgain(a *netlink.LinkAttrs) error {
	if !ourRetired(a) || !isVethName(a.Name) {
		return nil
	}
	if d.sink.BPF {
		// (only ENODEV is gone: ENOENT could be a missing qdisc)
		err := tcfilter.Mute(d.h, a.Index)
		if err == nil || errors.Is(err, unix.ENODEV) {
			return nil
		}
		d.log.Warn("retired veth not muted; set down instead", "ifindex", a.Index, "err", err)
	}
	if err := d.h.LinkSetDown(linkRefIdx(a.Index)); err != nil && !veth.IsNotFound(err) {
		return fmt.Errorf("set retired link %d down: %w", a.Index, err)
	}
	return nil
}

// deleteRetired deletes every link of RetiredGroup in the host namespace in
// one request. An empty group is not an error.
func (d *DataPlane) deleteRetired() error {
	return d.delLinkBy(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(RetiredGroup)))
}

// delLinkBy sends one RTM_DELLINK naming its link(s) by attr (a group: all
// its links) in the host namespace; none found is not an error.
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
// delete yet (it was killed) and hands them to the background deletion.
// When the group holds links that are not ours, they are reported and
// left alone, and ours are deleted one by one.
func (d *DataPlane) sweepRetired() error {
	ls, err := d.recoveryHostLinks()
	if err != nil {
		return err
	}
	ours, foreign := retiredIn(ls)
	if len(foreign) > 0 {
		d.retired.markUnsafe(foreign)
	}
	if len(ours) == 0 {
		return nil
	}
	// (a run killed between the move to the group and the cut left a veth
	// with its filters working)
	var errs []error
	for _, l := range ls {
		if isRetired(l.Attrs()) {
			if err := d.cutAgain(l.Attrs()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	d.log.Info("deleting links retired by an earlier run", "links", len(ours))
	d.retired.add(ours...)
	return errors.Join(errs...)
}
