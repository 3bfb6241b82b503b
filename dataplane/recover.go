package dataplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/netns/veth"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/vishvananda/netlink"
)

// Snapshot lists what exists in the kernel and the netns directory that
// carries isolatord's identity: host veths with our naming shape, bind mounts
// whose veth exists, and the host demux entries per slot. It dumps links and
// filters, so it is for recovery, not for the per-container path.
func (d *DataPlane) Snapshot(ctx context.Context) (Snapshot, error) {
	return d.SnapshotFor(ctx, nil)
}

// SnapshotFor is Snapshot that also reports, in Mounts, the IDs in ids that
// have a namespace bind mount even when their veth is gone (a container whose
// setup was interrupted between the mount and the veth).
func (d *DataPlane) SnapshotFor(ctx context.Context, ids []string) (Snapshot, error) {
	if err := checkCtx(ctx); err != nil {
		return Snapshot{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.ready(); err != nil {
		return Snapshot{}, err
	}
	s := Snapshot{Veths: map[string]int{}, Mounts: map[string]bool{}, Slots: map[uint16][]string{}}
	veths, err := d.ourVeths()
	if err != nil {
		return s, err
	}
	s.Veths = veths
	mounts, err := nspin.NsMounts(d.cfg.NetNSDir)
	if err != nil {
		return s, fmt.Errorf("list mounts in %s: %w", d.cfg.NetNSDir, err)
	}
	asked := map[string]bool{}
	for _, id := range ids {
		asked[id] = true
	}
	for name := range mounts {
		if _, ok := veths[plane.VethName(name)]; ok || asked[name] {
			s.Mounts[name] = true
		}
	}
	for _, dm := range d.demuxes() {
		es, err := dm.d.Entries()
		if err != nil {
			return s, fmt.Errorf("%s demux entries: %w", dm.name, err)
		}
		for _, e := range es {
			s.Slots[e.Slot] = append(s.Slots[e.Slot], describeEntry(dm.name, e))
		}
	}
	return s, nil
}

type namedDemux struct {
	name string
	d    *tcfilter.HostDemux
	eth0 bool
}

func (d *DataPlane) demuxes() []namedDemux {
	return []namedDemux{{d.links.Eth0, d.eth0, true}, {d.links.Lo, d.lo, false}}
}

func describeEntry(dev string, e tcfilter.Entry) string {
	switch e.Kind {
	case tcfilter.EntryRange:
		return fmt.Sprintf("%s range %s -> ifindex %d", dev, e.Range, e.Target)
	case tcfilter.EntryShared:
		return fmt.Sprintf("%s shared port %d -> ifindex %d", dev, e.Range.Begin, e.Target)
	default:
		return fmt.Sprintf("%s %s fan-out -> ifindex %d", dev, e.Kind, e.Target)
	}
}

// ourVeths dumps the host's links and keeps those named like ours.
func (d *DataPlane) ourVeths() (map[string]int, error) {
	ls, err := d.hostLinks()
	if err != nil {
		return nil, err
	}
	return vethsIn(ls), nil
}

// vethsIn keeps the links of ls named like our host veths (name ->
// ifindex).
func vethsIn(ls []netlink.Link) map[string]int { return linksNamed(ls, isVethName) }

// linksNamed keeps the links of ls whose names match (name -> ifindex),
// but retired ones (no container's; the background deletion's).
func linksNamed(ls []netlink.Link, match func(string) bool) map[string]int {
	out := map[string]int{}
	for _, l := range ls {
		if match(l.Attrs().Name) && !isRetired(l.Attrs()) {
			out[l.Attrs().Name] = l.Attrs().Index
		}
	}
	return out
}

// Check reports which expected objects of c are missing: the host veth, the
// bind mount, the namespace, the container's eth0, and each host demux entry
// (ranges on eth0 and lo, shared-port holders), as the demuxes' in-memory
// indexes have them. The ICMP fan-out is not checked: it is a best-effort
// copy, not a path to the container's ports, and Adopt puts it back when it
// is in use (a missing one is no reason to plumb the container again).
func (d *DataPlane) Check(ctx context.Context, c plane.Container) (missing []string, err error) {
	if err := d.begin(ctx, c.ID, keepCache); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if rec, ok := d.ctrs[c.ID]; ok {
		c = rec.c
	}
	name := plane.VethName(c.ID)
	veth := 0
	if idx, err := d.recoveryLinkIndex(name); err == nil {
		veth = idx
	} else {
		missing = append(missing, "veth "+name)
	}

	mp := d.pinOf(c).Path
	ns, err := nshandle.Open(mp)
	if err != nil {
		missing = append(missing, "bind mount "+mp)
		if c.NetNS != "" {
			ns, err = nshandle.Open(c.NetNS)
		}
	}
	if err != nil || ns == nil {
		missing = append(missing, "network namespace")
	} else {
		// The container's eth0 is the veth's peer: veth ends are created and
		// destroyed together, so the host end standing is enough (opening a
		// netlink socket inside every namespace made recovery of 1,000
		// containers take twice as long).
		ns.Close()
	}

	if sink, err := d.recoveryLinkOrZero(tcfilter.SinkName); err != nil || sink == 0 || sink != d.sink.Index {
		missing = append(missing, "drop sink "+tcfilter.SinkName)
	}
	if c.Slot < 1 || c.Slot > plane.MaxSlot || !c.Ephemeral.IsAligned() {
		return missing, nil
	}
	want := map[string]bool{}
	excl := exclusiveRanges(c.Ephemeral, c.Ports)
	for _, dm := range d.demuxes() {
		for _, r := range excl {
			want[fmt.Sprintf("%s range %s", dm.name, r)] = true
		}
		if n := len(c.Shared.Ports()); n > 0 {
			for _, p := range c.Shared.Ports() {
				if len(d.shared[p]) <= spread.Buckets {
					want[fmt.Sprintf("%s shared port %d", dm.name, p)] = true
				}
			}
		}
		// The demux's in-memory index (one kernel dump at PrepareHost, then
		// every change made through it): recovery checks each container
		// without dumping the host's filters again, so it stays linear.
		// A holder of a shared port may own no spread node for a while (its
		// buckets wait for other holders' flows to end): the port being
		// spread to its holders is what counts.
		for _, p := range c.Shared.Ports() {
			if dm.d.Draining(p)[c.Slot] {
				// its drain marker: a holder that drains alone, its
				// flows ended, owns no other node of the port
				delete(want, fmt.Sprintf("%s shared port %d", dm.name, p))
			}
			for s := range dm.d.SharedHolders(p) {
				if s != c.Slot && slices.ContainsFunc(d.shared[p], func(h spread.Holder) bool { return h.Slot == s }) {
					delete(want, fmt.Sprintf("%s shared port %d", dm.name, p))
					break
				}
			}
		}
		for _, e := range d.knownOf(dm, c.Slot) {
			if veth != 0 && e.Target != veth {
				continue
			}
			switch e.Kind {
			case tcfilter.EntryRange:
				delete(want, fmt.Sprintf("%s range %s", dm.name, e.Range))
			case tcfilter.EntryShared:
				delete(want, fmt.Sprintf("%s shared port %d", dm.name, e.Range.Begin))
			}
		}
	}
	var rest []string
	for k := range want {
		rest = append(rest, k)
	}
	sort.Strings(rest)
	return append(missing, rest...), nil
}

// RemoveStrays deletes isolatord's objects that belong to no container in
// keep: host demux entries (ranges, fan-out, shared holders) whose slot is
// not kept or that point elsewhere than the kept container's veth, veths
// and egress shaper pairs with our naming shape that are not kept, and the
// namespace pins of those veths' IDs that are isolatord's own
// (strayPinOwned: <id>@isolatord, or <id> when the veth's alias says
// PinOwned); a runtime's pin is left in place (logged). It also forgets
// unkept containers in the in-memory indexes.
// A bind mount whose veth is already gone cannot be told from someone else's
// named namespace; the lifecycle removes those by ID with Teardown.
func (d *DataPlane) RemoveStrays(ctx context.Context, keep []plane.Container) ([]string, error) {
	return d.strays(ctx, keep, true)
}

// Strays lists what RemoveStrays would remove, changing nothing.
func (d *DataPlane) Strays(ctx context.Context, keep []plane.Container) ([]string, error) {
	return d.strays(ctx, keep, false)
}

func (d *DataPlane) strays(ctx context.Context, keep []plane.Container, apply bool) ([]string, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.ready(); err != nil {
		return nil, err
	}
	// The report at the end of recovery reads the links recovery read (the
	// cache, while valid: nothing made or deleted a link since); a removal
	// dumps them.
	var ls []netlink.Link
	var err error
	if apply {
		ls, err = d.hostLinks()
	} else {
		ls, err = d.recoveryHostLinks()
	}
	d.rootQdiscs, d.recoveryLinkList = nil, nil // recovery ends here (and qdiscs may change): the cache is no longer valid
	d.recoveryOver = true
	if d.neigh != nil {
		d.neigh.Release() // adopted containers' neighbours (addNeighLater)
	}
	if err != nil {
		return nil, err
	}
	veths := vethsIn(ls)
	keepBySlot := map[uint16]plane.Container{}
	keepVeth := map[string]bool{}
	vethOf := map[uint16]int{}
	for _, c := range keep {
		if rec, ok := d.ctrs[c.ID]; ok {
			c = rec.c
		}
		keepBySlot[c.Slot] = c
		keepVeth[plane.VethName(c.ID)] = true
		vethOf[c.Slot] = veths[plane.VethName(c.ID)]
	}
	// A setup in progress builds its veth (and shaper) outside d.mu: not
	// strays.
	for id := range d.settingUp {
		keepVeth[plane.VethName(id)] = true
	}
	// Nor are pairs staged for a runtime to move in (staged.go).
	d.smu.Lock()
	for id := range d.staged {
		keepVeth[plane.VethName(id)] = true
	}
	d.smu.Unlock()
	var removed []string
	var errs []error
	sharedPorts := map[uint16][]string{} // ports with stray holders -> demuxes they were found on

	// 1. host filters first, so nothing is steered to a veth about to go.
	for _, dm := range d.demuxes() {
		// The report at start-up reads the demux's index (PrepareHost read
		// it from the kernel just before); a removal reads the kernel.
		es := dm.d.KnownAll()
		if apply {
			if es, err = dm.d.Entries(); err != nil {
				errs = append(errs, fmt.Errorf("%s demux entries: %w", dm.name, err))
				continue
			}
		}
		fanDone := map[uint16]bool{}
		for _, e := range es {
			kc, kept := keepBySlot[e.Slot]
			ok := kept && e.Target == vethOf[e.Slot] && e.Target != 0
			switch e.Kind {
			case tcfilter.EntryRange:
				if ok && containsRange(exclusiveRanges(kc.Ephemeral, kc.Ports), e.Range) {
					continue
				}
				if _, err := delIf(apply, func() (int, error) { return dm.d.DelRanges(e.Slot, []ephemeral.Range{e.Range}) }); err != nil {
					errs = append(errs, err)
					continue
				}
				removed = append(removed, fmt.Sprintf("%s range %s of slot %d", dm.name, e.Range, e.Slot))
			case tcfilter.EntryShared:
				if p := e.Range.Begin; (!ok || !kc.Shared.Contains(p)) && !slices.Contains(sharedPorts[p], dm.name) {
					sharedPorts[p] = append(sharedPorts[p], dm.name)
				}
			default:
				if ok || fanDone[e.Slot] || !dm.eth0 {
					continue
				}
				fanDone[e.Slot] = true
				if _, err := delIf(apply, func() (int, error) { return dm.d.DelFanout(e.Slot) }); err != nil {
					errs = append(errs, err)
					continue
				}
				removed = append(removed, fmt.Sprintf("%s fan-out of slot %d", dm.name, e.Slot))
			}
		}
	}
	// Stray holders leave the way a container does (setShared): the kept
	// holders' live flows stay where they are, on both demuxes.
	for _, port := range slices.Sorted(maps.Keys(sharedPorts)) {
		var hs []spread.Holder
		for slot, kc := range keepBySlot {
			if kc.Shared.Contains(port) && vethOf[slot] != 0 {
				hs = append(hs, spread.Holder{Slot: slot, Target: vethOf[slot]})
			}
		}
		sort.Slice(hs, func(i, j int) bool { return hs[i].Slot < hs[j].Slot })
		if _, err := delIf(apply, func() (int, error) { return 0, d.setShared(port, hs) }); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, name := range sharedPorts[port] {
			removed = append(removed, fmt.Sprintf("%s stray holders of shared port %d", name, port))
		}
	}

	// 2. bind mounts of stray veths' IDs, then the veths. (The mount table,
	// long with 1,000 containers, is read only when a veth is a stray.)
	var mounts map[string]uint64
	if !allKept(veths, keepVeth) {
		if mounts, err = nspin.NsMounts(d.cfg.NetNSDir); err != nil {
			errs = append(errs, err)
		}
	}
	for pin := range mounts {
		name := plane.VethName(strings.TrimSuffix(pin, nspin.Suffix))
		idx, ours := veths[name]
		if !ours || keepVeth[name] {
			continue
		}
		if !d.strayPinOwned(pin, idx, mounts) {
			if apply {
				d.log.Warn("namespace pin of a stray veth left in place: not isolatord's", "pin", d.mountPath(pin), "veth", name)
			}
			continue
		}
		if _, err := delIf(apply, func() (int, error) { _, _, err := nspin.Unmount(d.cfg.NetNSDir, pin); return 0, err }); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "bind mount "+d.mountPath(pin))
	}
	for name, idx := range veths {
		if keepVeth[name] {
			continue
		}
		if _, err := delIf(apply, func() (bool, error) { return veth.Delete(d.h, idx) }); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "veth "+name)
	}
	// egress shaper pairs of containers not kept (a kept container's pair
	// was put in line with its limits by Adopt)
	for name, idx := range linksNamed(ls, isShaperEntryName) {
		if keepVeth[plane.VethPrefix+name[len(ShaperEntryPrefix):]] {
			continue
		}
		if _, err := delIf(apply, func() (bool, error) { return veth.Delete(d.h, idx) }); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "egress shaper "+name)
	}

	// 3. forget unkept containers.
	if !apply {
		sort.Strings(removed)
		return removed, errors.Join(errs...)
	}
	for id, rec := range d.ctrs {
		if kc, ok := keepBySlot[rec.c.Slot]; !ok || kc.ID != id {
			delete(d.ctrs, id)
			delete(d.slots, rec.c.Slot)
			d.noteVeth(id, 0)
			d.dropNeigh(id)
		}
	}
	for port, hs := range d.shared {
		var kept []spread.Holder
		for _, h := range hs {
			if kc, ok := keepBySlot[h.Slot]; ok && kc.Shared.Contains(port) {
				kept = append(kept, h)
			}
		}
		if len(kept) == 0 {
			delete(d.shared, port)
		} else {
			d.shared[port] = kept
		}
	}
	sort.Strings(removed)
	return removed, errors.Join(errs...)
}

// allKept reports whether every veth of veths is kept.
func allKept(veths map[string]int, keep map[string]bool) bool {
	for name := range veths {
		if !keep[name] {
			return false
		}
	}
	return true
}

func containsRange(rs []ephemeral.Range, r ephemeral.Range) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// delIf runs a deletion when apply is set (RemoveStrays) and does nothing
// when it is not (Strays: report only).
func delIf[T any](apply bool, del func() (T, error)) (T, error) {
	if !apply {
		var zero T
		return zero, nil
	}
	return del()
}
