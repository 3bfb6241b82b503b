package dataplane

import (
	"context"
	"errors"
	"fmt"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/tcfilter"
)

// SetPorts changes the static ports (exclusive and shared) of a running
// container, make-before-break: the veth and container filters first grow to
// the union of old and new ports, the host demuxes gain the new ranges and
// shared holders, then lose the old ones, and finally the veth and container
// filters shrink to the new set. Any failure puts back what was changed.
func (d *DataPlane) SetPorts(ctx context.Context, c plane.Container, ports, shared ephemeral.Set) (err error) {
	if err := d.begin(ctx, c.ID, dropCache); err != nil {
		return err
	}
	defer d.mu.Unlock()
	rec, ok := d.ctrs[c.ID]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknown, c.ID)
	}
	old := rec.c
	if err := validatePorts(c.ID, old.Ephemeral, ports, shared); err != nil {
		return err
	}
	eph := old.Ephemeral
	oldAll := allRanges(eph, old.Ports, old.Shared)
	newAll := allRanges(eph, ports, shared)
	unionAll := allRanges(eph, old.Ports.Union(ports), old.Shared.Union(shared))
	oldEx := exclusiveRanges(eph, old.Ports)
	newEx := exclusiveRanges(eph, ports)
	addEx, delEx := rangeDiff(newEx, oldEx), rangeDiff(oldEx, newEx)

	var undo undoStack
	var closers []func() // after the rollback, which uses the handles
	defer func() {
		if err != nil {
			if uerr := undo.run(); uerr != nil {
				d.log.Error("rollback of failed port change incomplete", "container", c.ID, "err", uerr)
				err = errors.Join(err, uerr)
			}
		}
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()

	// Container side, through the pinned namespace.
	ns, err := nshandle.Open(rec.pin.Path)
	if err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	closers = append(closers, func() { ns.Close() })
	ch, err := ns.Netlink()
	if err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	closers = append(closers, ch.Close)
	cf, err := d.containerFiltersIn(ch)
	if err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	vf := d.vethFilters(old.Slot, rec.veth, rec.via)

	// 1. grow veth and container filters to old ∪ new.
	if err := vf.SetRanges(oldAll, unionAll); err != nil {
		return fmt.Errorf("container %s: veth filters: %w", c.ID, err)
	}
	undo.push("veth filters", func() error { return vf.SetRanges(unionAll, oldAll) })
	if err := cf.SetRanges(oldAll, unionAll); err != nil {
		return fmt.Errorf("container %s: container filters: %w", c.ID, err)
	}
	undo.push("container filters", func() error { return cf.SetRanges(unionAll, oldAll) })
	if err := d.step("grow"); err != nil {
		return err
	}

	// 2. host demuxes: new exclusive ranges.
	if len(addEx) > 0 {
		// AddRanges keeps ranges the slot already has, so an update that
		// was interrupted after some of these adds is rolled forward here.
		for _, dm := range d.demuxes() {
			if err := dm.d.AddRanges(old.Slot, rec.veth, addEx); err != nil {
				return fmt.Errorf("container %s: %s demux: %w", c.ID, dm.name, err)
			}
			undo.push(dm.name+" demux add", func() error { _, err := dm.d.DelRanges(old.Slot, addEx); return err })
		}
	}
	if err := d.step("add"); err != nil {
		return err
	}

	// 3. shared holders: join new shared ports, leave dropped ones.
	for _, port := range shared.Subtract(old.Shared).Ports() {
		prev := d.shared[port]
		if err := d.setShared(port, holdersWith(prev, old.Slot, rec.veth)); err != nil {
			return fmt.Errorf("container %s: %w", c.ID, err)
		}
		undo.push(fmt.Sprintf("shared port %d", port), func() error { return d.setShared(port, prev) })
	}
	for _, port := range old.Shared.Subtract(shared).Ports() {
		prev := d.shared[port]
		if err := d.setShared(port, holdersWithout(prev, old.Slot)); err != nil {
			return fmt.Errorf("container %s: %w", c.ID, err)
		}
		undo.push(fmt.Sprintf("shared port %d", port), func() error { return d.setShared(port, prev) })
	}
	if err := d.step("shared"); err != nil {
		return err
	}

	// 4. host demuxes: drop old exclusive ranges.
	if len(delEx) > 0 {
		if _, err := d.eth0.DelRanges(old.Slot, delEx); err != nil {
			undo.push("eth0 demux del", func() error { return d.readdRanges(d.eth0, old.Slot, rec.veth, delEx) })
			return fmt.Errorf("container %s: %s demux: %w", c.ID, d.links.Eth0, err)
		}
		undo.push("eth0 demux del", func() error { return d.eth0.AddRanges(old.Slot, rec.veth, delEx) })
		if _, err := d.lo.DelRanges(old.Slot, delEx); err != nil {
			undo.push("lo demux del", func() error { return d.readdRanges(d.lo, old.Slot, rec.veth, delEx) })
			return fmt.Errorf("container %s: %s demux: %w", c.ID, d.links.Lo, err)
		}
		undo.push("lo demux del", func() error { return d.lo.AddRanges(old.Slot, rec.veth, delEx) })
	}
	if err := d.step("remove"); err != nil {
		return err
	}

	// 5. shrink veth and container filters to the new set.
	if err := vf.SetRanges(unionAll, newAll); err != nil {
		return fmt.Errorf("container %s: veth filters: %w", c.ID, err)
	}
	undo.push("veth filters shrink", func() error { return vf.SetRanges(newAll, unionAll) })
	if err := cf.SetRanges(unionAll, newAll); err != nil {
		return fmt.Errorf("container %s: container filters: %w", c.ID, err)
	}
	if err := d.step("shrink"); err != nil {
		undo.push("container filters shrink", func() error { return cf.SetRanges(newAll, unionAll) })
		return err
	}

	rec.c.Ports, rec.c.Shared = ports, shared
	return nil
}

// readdRanges puts back ranges after a partial DelRanges: one at a time, so
// those still present (AddRanges refuses duplicates as a whole) do not stop
// the others.
func (d *DataPlane) readdRanges(dm *tcfilter.HostDemux, slot uint16, veth int, rs []ephemeral.Range) error {
	var errs []error
	for _, r := range rs {
		if err := dm.AddRanges(slot, veth, []ephemeral.Range{r}); err != nil && !errors.Is(err, tcfilter.ErrOverlap) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rangeDiff returns the ranges of a that are not in b (as exact ranges).
func rangeDiff(a, b []ephemeral.Range) []ephemeral.Range {
	in := make(map[ephemeral.Range]bool, len(b))
	for _, r := range b {
		in[r] = true
	}
	var out []ephemeral.Range
	for _, r := range a {
		if !in[r] {
			out = append(out, r)
		}
	}
	return out
}

// Stats returns the container's traffic counters (its veth's, from the
// container's side).
func (d *DataPlane) Stats(ctx context.Context, c plane.Container) (plane.LinkStats, error) {
	if err := checkCtx(ctx); err != nil {
		return plane.LinkStats{}, err
	}
	// A read: it never waits for d.mu (a setup or teardown in progress),
	// only for the handles to stay open. The veth is the one recorded for
	// the container, else found by name (the caller serialises calls for
	// one container, and gives its limits): each netlink read queues on
	// rtnl behind the changes of setups and teardowns, so it makes as few
	// as it can. The veth's counters come from d.sys, which takes no
	// rtnl, nor do the drop counters (the sinks' count map, a BPF map
	// lookup); the shaping counters do.
	d.hmu.RLock()
	defer d.hmu.RUnlock()
	if d.hclosed {
		return plane.LinkStats{}, ErrClosed
	}
	idx, via := 0, 0
	if v, ok := d.statsVeth.Load(c.ID); ok {
		idx = v.(int)
	} else {
		l, err := d.hr.LinkByName(plane.VethName(c.ID))
		if err == nil && isRetired(l.Attrs()) {
			err = errRetired(l.Attrs().Name) // torn down, awaiting deletion
		}
		if err != nil {
			return plane.LinkStats{}, fmt.Errorf("container %s: veth %s: %w", c.ID, plane.VethName(c.ID), err)
		}
		idx = l.Attrs().Index
	}
	var s hostlink.Counters
	var err error
	if d.sys != nil {
		s, err = d.sys.PeerCounters(plane.VethName(c.ID))
	} else {
		s, err = hostlink.PeerCounters(d.hr, idx)
	}
	if err != nil {
		return plane.LinkStats{}, fmt.Errorf("container %s: %w", c.ID, err)
	}
	st := plane.LinkStats{
		RxBytes: s.RxBytes, RxPackets: s.RxPackets, RxErrors: s.RxErrors, RxDropped: s.RxDropped,
		TxBytes: s.TxBytes, TxPackets: s.TxPackets, TxErrors: s.TxErrors, TxDropped: s.TxDropped,
	}
	if st.Dropped, err = d.vethDrops(idx); err != nil {
		return st, fmt.Errorf("container %s: drop counters: %w", c.ID, err)
	}
	if !c.Ingress.IsZero() {
		if st.Ingress, err = d.shapeCounters(idx, c.Ingress); err != nil {
			return st, fmt.Errorf("container %s: ingress shaping: %w", c.ID, err)
		}
	}
	if !c.Egress.IsZero() {
		if via == 0 {
			entry, _ := ShaperNames(c.ID)
			via, _ = d.linkIndex(entry)
		}
		if st.Egress, err = d.shapeCounters(via, c.Egress); err != nil {
			return st, fmt.Errorf("container %s: egress shaping: %w", c.ID, err)
		}
	}
	return st, nil
}

// Teardown removes everything plumbed for c, tolerating objects that are
// already gone (listed in the report): host demux ranges, fan-out, shared
// holders, the veth (which takes the container's eth0 with it) and the bind
// mount. It uses what Setup/SetPorts recorded when the container is known,
// and c otherwise (after a restart without Adopt). It is idempotent.
func (d *DataPlane) Teardown(ctx context.Context, c plane.Container) (plane.TeardownReport, error) {
	var rep plane.TeardownReport
	release, aerr := d.admit(ctx)
	if aerr != nil {
		return rep, aerr
	}
	defer release()
	// hmu before mu (see Close); the veth and the mount are removed with
	// hmu alone.
	d.hmu.RLock()
	defer d.hmu.RUnlock()
	if err := checkID(c.ID); err != nil {
		return rep, err
	}
	if err := checkCtx(ctx); err != nil {
		return rep, err
	}
	// Everything that leads to the container goes first (unroute.go),
	// under d.mu, maybe in one pass with other teardowns.
	u := d.unroute(c)
	if u.err != nil {
		return rep, u.err
	}
	// (prepared: the background deletion waits for the teardowns under
	// way, settle)
	d.retired.tearing.Add(1)
	defer d.retired.tearing.Add(-1)
	c, veth, pin := u.c, u.veth, u.pin
	rep.Missing = u.missing
	errs := u.errs
	miss := func(format string, args ...any) { rep.Missing = append(rep.Missing, fmt.Sprintf(format, args...)) }

	if d.trace != nil {
		d.trace("", "teardown demux")
	}
	// Nothing leads to the container any more: the rest is its own objects,
	// done without d.mu (only the handles must stay open).
	name := plane.VethName(c.ID)
	existed := false
	var err error
	var departed map[string]uint64
	// The veth is muted and left to the background deletion (retire.go).
	if veth != 0 {
		// The ifindex is only trusted if it still carries our name (and
		// was not retired already: a teardown done again, which makes
		// sure it is cut off).
		if l, lerr := d.h.LinkByIndex(veth); lerr == nil && l.Attrs().Name == name {
			existed = true
			d.ensureAlias(l.Attrs(), c.ID)
			if !isRetired(l.Attrs()) {
				existed, err = d.retire(veth, true)
			} else {
				err = d.recut(l.Attrs())
			}
			// Once muted nothing more is counted for it.
			departed = d.departedDrops(veth) // added under d.mu below
		} else {
			existed, err = d.retireVethByName(name, c.ID)
		}
	} else {
		existed, err = d.retireVethByName(name, c.ID)
	}
	if err != nil {
		errs = append(errs, err)
	} else if !existed {
		miss("veth %s", name)
		// The veth's own filters (ARP, ICMP, IP redirects) go with the
		// veth; they were gone before we could remove them.
		if obs := d.cfg.Observer; obs != nil {
			for _, kind := range []string{"arp", "icmp", "ip"} {
				obs(tcfilter.Op{Op: "remove", Device: "veth", Kind: kind, Result: "not_found"})
			}
		}
	}

	// The egress shaper pair (if any) after the veth: nothing is sent to
	// it any more. Its entry was looked up with the paths (unroute).
	entry, exit := ShaperNames(c.ID)
	existed, err = false, u.shaperErr
	if err == nil && u.shaper != 0 {
		existed, err = d.retire(u.shaper, false)
	}
	if err != nil {
		errs = append(errs, err)
	} else if !existed && !c.Egress.IsZero() {
		miss("egress shaper %s", entry)
	} else if existed {
		// Its peer goes with it; in the group too, so that a lookup by
		// name skips it.
		if _, err := d.retireByName(exit, false); err != nil {
			errs = append(errs, err)
		}
	}

	if d.trace != nil {
		d.trace("", "teardown veth")
	}
	// Only a pin isolatord made is removed: a runtime's pin stays theirs
	// (pin was read with the record, under d.mu, above).
	if pin.Owned {
		mounted, present, err := nspin.Remove(pin)
		if err != nil {
			errs = append(errs, err)
		} else if !mounted {
			if present {
				miss("bind mount %s (the file was there, unmounted)", pin.Path)
			} else {
				miss("bind mount %s", pin.Path)
			}
		}
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	for r, n := range departed {
		d.departed[r] += n
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("container %s teardown: %w", c.ID, err)
	}
	if rec, ok := d.ctrs[c.ID]; ok {
		delete(d.slots, rec.c.Slot)
		delete(d.ctrs, c.ID)
		d.noteVeth(c.ID, 0)
	}
	return rep, nil
}

// Adopt registers an existing, complete container (after a daemon restart)
// in the in-memory indexes: it looks up the veth and the bind mount and
// records c's ports and shared holders. Its neighbour requests are served
// from shortly after (in the background: addNeighLater). It then brings the container's
// bandwidth shaping in line with c's limits, changing nothing when the
// kernel already enforces them (so a restart causes no glitch); an error
// there wraps ErrShaping and leaves the container registered.
func (d *DataPlane) Adopt(ctx context.Context, c plane.Container) error {
	if err := validateContainer(c); err != nil {
		return err
	}
	if err := d.begin(ctx, c.ID, keepCache); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if _, ok := d.ctrs[c.ID]; ok {
		return fmt.Errorf("%w: %s", ErrExists, c.ID)
	}
	if other, ok := d.slots[c.Slot]; ok {
		return fmt.Errorf("%w: slot %d is used by container %s", ErrExists, c.Slot, other)
	}
	veth, err := d.recoveryLinkIndex(plane.VethName(c.ID))
	if err != nil {
		return fmt.Errorf("adopt %s: veth %s: %w", c.ID, plane.VethName(c.ID), err)
	}
	pin := d.pinOf(c)
	ns, err := nshandle.Open(pin.Path)
	if err != nil {
		return fmt.Errorf("adopt %s: bind mount: %w", c.ID, err)
	}
	ino := ns.Ino()
	ns.Close()
	d.addNeighLater(c.ID, pin.Path, ino)
	if err := d.adoptEchoOrigins(c.ID, veth, !c.Egress.IsZero()); err != nil {
		d.dropNeigh(c.ID)
		return fmt.Errorf("adopt %s: %w", c.ID, err)
	}
	for _, port := range c.Shared.Ports() {
		d.shared[port] = holdersWith(d.shared[port], c.Slot, veth)
		d.adoptDrain(port, c.Slot)
	}
	// The veth's filters: a veth whose alias records another layout (or a
	// sink that was recreated) is brought up to date; one that is right is
	// only dumped. Redirects keep pointing at an existing egress shaper,
	// which applyLimits then puts in line.
	via := 0
	if !c.Egress.IsZero() {
		entry, _ := ShaperNames(c.ID)
		if via, err = d.linkIndex(entry); err != nil {
			return fmt.Errorf("adopt %s: %w", c.ID, err)
		}
	}
	// A veth whose alias says it has the current layout, pointing at the
	// current sink, with the current host IPv6 addresses, is trusted (as
	// its pair and the container's inside are: a dump per veth would make
	// recovery of 1,000 containers take seconds). Otherwise the veth's
	// filters are re-installed, then the container's inside (its IPv6
	// addresses, routes and filters) brought in line; the alias is
	// updated once both are.
	if !d.recoveryCurrent[plane.VethName(c.ID)] {
		if err := d.refreshHostVeth(c, veth, via); err != nil {
			d.log.Error("host veth not brought up to date", "container", c.ID, "veth", plane.VethName(c.ID), "err", err)
		} else if err := d.vethFilters(c.Slot, veth, via).Install(allRanges(c.Ephemeral, c.Ports, c.Shared)); err != nil {
			// The container is kept (its traffic flows through the filters it
			// has); a later Adopt tries again.
			d.log.Error("veth filters not brought up to date", "container", c.ID, "veth", plane.VethName(c.ID), "err", err)
		} else if err := d.refreshContainerSide(c, pin.Path); err != nil {
			d.log.Error("container's inside not brought up to date", "container", c.ID, "err", err)
		} else if err := d.setAlias(veth, c); err != nil {
			d.log.Warn("veth alias not updated", "container", c.ID, "err", err)
		}
	}
	// The ICMP fan-out, when in use (the echo programs could not be loaded
	// at this start, or the container was plumbed without its node): a
	// best-effort copy, so a failure is logged and the container kept.
	if d.fanoutUsed() {
		if t, ok := d.eth0.FanoutTarget(c.Slot); !ok || t != veth {
			if err := d.eth0.AddFanout(c.Slot, veth); err != nil {
				d.log.Warn("ICMP fan-out node not restored: echo replies no container's ports attribute do not reach this container", "container", c.ID, "err", err)
			}
		}
	}
	// A restart of this build kept the learn program on the veth
	// (fragbpf.Steering.Kept); otherwise it is put there again.
	if d.frag == nil || !d.frag.Kept() {
		d.fragLearn(c.ID, veth)
	}
	rec := &record{c: c, veth: veth, via: via, ino: ino, pin: pin, in: d.hostNow}
	rec.c.Egress, rec.c.Ingress = rate.Limit{}, rate.Limit{}
	d.ctrs[c.ID] = rec
	d.slots[c.Slot] = c.ID
	d.noteVeth(c.ID, veth)
	err = d.checkLimits(c.Egress, c.Ingress)
	if err == nil {
		err = d.applyLimits(rec, c.Egress, c.Ingress)
	}
	if err != nil {
		return fmt.Errorf("adopt %s: %w: %w", c.ID, plane.ErrShaping, err)
	}
	return nil
}
