package dataplane

// Rebuilding containers from the kernel alone. Everything isolatord puts in
// the kernel says whose it is: the host veth's name is a hash of the
// container ID and its alias carries the ID and metadata (Meta), the bind
// mount is named after the ID, every filter node carries the slot in its
// classid, the demux entries give the exclusive ranges, the veth filters
// the source ranges (exclusive and shared), the container's
// ip_local_port_range its ephemeral block, and the HTB classes its limits.
// Discover reads all of that without changing anything; what it cannot
// attribute to a container is reported, never removed.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/tcfilter"
)

// maxAlias is the longest interface alias the kernel keeps (IFALIASZ - 1).
const maxAlias = 255

// metaAlias encodes m for the veth's alias, leaving labels out when they
// do not fit.
func metaAlias(m plane.Meta) string {
	b, err := json.Marshal(m)
	if err == nil && len(b) <= maxAlias {
		return string(b)
	}
	m.Labels, m.LabelsDropped = nil, len(m.Labels) > 0
	b, _ = json.Marshal(m)
	return string(b)
}

// parseAlias reads Meta from an alias; ok is false when it is not ours.
func parseAlias(s string) (plane.Meta, bool) {
	var m plane.Meta
	if !strings.HasPrefix(s, "{") || json.Unmarshal([]byte(s), &m) != nil || plane.ValidateID(m.ID) != nil {
		return plane.Meta{}, false
	}
	return m, true
}

// setAlias writes c's metadata on its host veth.
func (d *DataPlane) setAlias(veth int, c plane.Container) error {
	m := c.Meta
	m.ID = c.ID
	m.Layout, m.Sink, m.V6, m.Loop, m.V4 = tcfilter.VethLayout, d.sink.Index, d.ip6Tag(), d.loopTag(), d.v4Tag()
	m.Eph = c.Ephemeral.String()
	if err := d.h.LinkSetAlias(linkRefIdx(veth), metaAlias(m)); err != nil {
		return fmt.Errorf("container %s: veth alias: %w", c.ID, err)
	}
	return nil
}

func linkRefIdx(idx int) netlink.Link {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: idx}}
}

// Discover rebuilds every container that has a host veth of ours from the
// kernel, except those whose IDs known lists (the lifecycle's records
// cover them: reading their namespaces and filters would only slow a
// restart down). It changes nothing.
func (d *DataPlane) Discover(ctx context.Context, known []string) (plane.Discovery, error) {
	var out plane.Discovery
	if err := d.beginHost(ctx, keepCache); err != nil {
		return out, err
	}
	defer d.mu.Unlock()
	// the links and the qdiscs (a qdisc dump is not filtered by device):
	// one dump each for all, the recovery cache's
	if err := d.fillRootQdiscs(); err != nil {
		return out, err
	}
	ls := liveLinks(d.recoveryLinkList) // a retired link is no container's
	skip := make(map[string]bool, len(known))
	for _, id := range known {
		skip[plane.VethName(id)] = true
	}
	// exclusive ranges, fan-out and shared holders on eth0, by target, from
	// the demux's index (PrepareHost read it from the kernel just before)
	es := d.eth0.KnownAll()
	byTarget := map[int]*demuxOf{}
	for _, e := range es {
		x := byTarget[e.Target]
		if x == nil {
			x = &demuxOf{slots: map[uint16]bool{}}
			byTarget[e.Target] = x
		}
		x.slots[e.Slot] = true
		switch e.Kind {
		case tcfilter.EntryRange:
			x.excl = append(x.excl, e.Range)
		case tcfilter.EntryShared:
			x.shared = append(x.shared, e.Range.Begin)
		}
	}
	// the exclusive ranges the lo demux routes, by target: a second host
	// fact for the same right
	loOf := map[int]ephemeral.Set{}
	if d.lo != nil {
		for _, e := range d.lo.KnownAll() {
			if e.Kind == tcfilter.EntryRange {
				loOf[e.Target] = loOf[e.Target].Union(ephemeral.NewSet(e.Range))
			}
		}
	}
	shapers := map[string]int{}
	vethIdx := map[int]bool{}
	for _, l := range ls {
		a := l.Attrs()
		if isShaperEntryName(a.Name) {
			shapers[a.Name] = a.Index
		}
	}
	var todo []*netlink.LinkAttrs
	for _, l := range ls {
		a := l.Attrs()
		if !isVethName(a.Name) {
			continue
		}
		vethIdx[a.Index] = true
		if !skip[a.Name] {
			todo = append(todo, a)
		}
	}
	// the namespace pins, read only when there are veths to rebuild (with
	// 1,000 containers, the mount table is long)
	var mounts map[string]uint64
	byVeth := map[string]string{} // veth name -> ID of a pin with that hash
	if len(todo) > 0 {
		var err error
		if mounts, err = nspin.NsMounts(d.cfg.NetNSDir); err != nil {
			return out, fmt.Errorf("list mounts in %s: %w", d.cfg.NetNSDir, err)
		}
	}
	for id := range mounts {
		if plane.ValidateID(id) == nil {
			byVeth[plane.VethName(id)] = id
		}
	}
	found := d.discoverAll(todo, func(h *netlink.Handle, a *netlink.LinkAttrs) (plane.Found, string) {
		lo, ok := loOf[a.Index]
		return d.discoverOne(h, a, byVeth, byTarget[a.Index], lo, ok, mounts, shapers)
	})
	slotsTaken := map[uint16]string{}
	for i, a := range todo {
		f, why := found[i].f, found[i].why
		if why != "" {
			what := fmt.Sprintf("veth %s: %s", a.Name, why)
			out.Unattributed = append(out.Unattributed, what)
			out.Held = append(out.Held, heldOf(what, byTarget[a.Index], f.Slot))
			continue
		}
		if other, ok := slotsTaken[f.Slot]; ok {
			what := fmt.Sprintf("veth %s of container %s: slot %d is also carried by container %s", a.Name, f.ID, f.Slot, other)
			out.Unattributed = append(out.Unattributed, what)
			out.Held = append(out.Held, heldOf(what, byTarget[a.Index], 0))
			continue
		}
		slotsTaken[f.Slot] = f.ID
		out.Found = append(out.Found, f)
	}
	for target, x := range byTarget {
		if !vethIdx[target] {
			what := fmt.Sprintf("%s demux entries of slot(s) %s point at ifindex %d, which is no veth of ours", d.links.Eth0, slotList(x.slots), target)
			out.Unattributed = append(out.Unattributed, what)
			out.Held = append(out.Held, heldOf(what, x, 0))
		}
	}
	for name := range shapers {
		if _, ok := vethOfShaper(name, ls); !ok {
			out.Unattributed = append(out.Unattributed, "egress shaper "+name+": its container's veth is gone")
		}
	}
	sort.Slice(out.Found, func(i, j int) bool { return out.Found[i].ID < out.Found[j].ID })
	sort.Strings(out.Unattributed)
	return out, nil
}

// heldOf is what x (nil: nothing) still routes, and slot (0: none): kept
// from being handed out again.
func heldOf(what string, x *demuxOf, slot uint16) plane.Held {
	h := plane.Held{What: what}
	if slot != 0 {
		h.Slots = append(h.Slots, slot)
	}
	if x != nil {
		for s := range x.slots {
			if s != slot {
				h.Slots = append(h.Slots, s)
			}
		}
		h.Ports = ephemeral.NewSet(x.excl...)
		for _, p := range x.shared {
			h.Ports = h.Ports.Union(ephemeral.NewSet(ephemeral.Range{Begin: p, End: p}))
		}
	}
	return h
}

func slotList(m map[uint16]bool) string {
	var s []string
	for k := range m {
		s = append(s, strconv.Itoa(int(k)))
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

func vethOfShaper(entry string, ls []netlink.Link) (string, bool) {
	want := plane.VethPrefix + entry[len(ShaperEntryPrefix):]
	for _, l := range ls {
		if l.Attrs().Name == want {
			return want, true
		}
	}
	return "", false
}

// discoverWorkers is how many veths Discover reads at once: each costs a
// thread switch into the container's namespace and a filter dump, which
// mostly wait (for the namespace switch, for the RTNL lock).
const discoverWorkers = 4

type discovered struct {
	f   plane.Found
	why string
}

// discoverAll runs one(h, a) for every veth in todo, discoverWorkers at a
// time, each worker with a netlink handle of its own in the host namespace
// (d.h answers one request at a time); with no handle to spare it runs
// them one by one on d.h. Results are in todo's order.
func (d *DataPlane) discoverAll(todo []*netlink.LinkAttrs, one func(*netlink.Handle, *netlink.LinkAttrs) (plane.Found, string)) []discovered {
	out := make([]discovered, len(todo))
	next := make(chan int)
	var wg sync.WaitGroup
	workers := 0
	for ; workers < discoverWorkers && workers < len(todo); workers++ {
		h, err := d.hostNS.Netlink()
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer h.Close()
			for i := range next {
				out[i].f, out[i].why = one(h, todo[i])
			}
		}()
	}
	for i := range todo {
		if workers == 0 {
			out[i].f, out[i].why = one(d.h, todo[i])
			continue
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// demuxOf is what the host eth0 demux steers to one target.
type demuxOf struct {
	slots  map[uint16]bool
	excl   []ephemeral.Range
	shared []uint16
}

// discoverOne rebuilds the container of one host veth; why says why it
// cannot be attributed.
func (d *DataPlane) discoverOne(h *netlink.Handle, a *netlink.LinkAttrs, byVeth map[string]string, dm *demuxOf, lo ephemeral.Set, onLo bool, mounts map[string]uint64, shapers map[string]int) (plane.Found, string) {
	f := plane.Found{Veth: a.Name, VethIndex: a.Index}
	meta, ok := parseAlias(a.Alias)
	switch {
	case ok && plane.VethName(meta.ID) == a.Name:
		f.ID = meta.ID
	case byVeth[a.Name] != "":
		f.ID = byVeth[a.Name]
		meta = plane.Meta{ID: f.ID}
		f.Lost = append(f.Lost, "labels", "creation time", "pin ownership")
	default:
		return f, "no container ID: no alias of ours and no namespace pin whose name hashes to it"
	}
	f.Meta = meta
	if meta.LabelsDropped {
		f.Lost = append(f.Lost, "labels (too long for the veth alias)")
	}
	if meta.Created != 0 {
		f.Created = time.Unix(meta.Created, 0).UTC()
	}
	f.Mount = d.mountPath(f.ID)
	if _, ok := mounts[f.ID]; !ok {
		// Ours beside a runtime's pin of another namespace (nspin.Create).
		if _, alt := mounts[f.ID+nspin.Suffix]; !alt || !meta.PinOwned {
			return f, fmt.Sprintf("container %s: its namespace pin %s is gone", f.ID, d.mountPath(f.ID))
		}
		f.Mount += nspin.Suffix
	}
	f.NetNS = f.Mount
	vs, err := tcfilter.ReadVeth(h, a.Index)
	if err != nil {
		return f, fmt.Sprintf("container %s: %v", f.ID, err)
	}
	// the slot: the host demux entries pointing at the veth, else the
	// veth's own nodes
	switch {
	case dm != nil && len(dm.slots) == 1:
		for s := range dm.slots {
			f.Slot = s
		}
		if vs.Slot != 0 && vs.Slot != f.Slot {
			return f, fmt.Sprintf("container %s: the host demux routes slot %d to it, its veth filters carry slot %d", f.ID, f.Slot, vs.Slot)
		}
	case dm != nil && len(dm.slots) > 1:
		return f, fmt.Sprintf("container %s: host demux entries of several slots (%s) point at it", f.ID, slotList(dm.slots))
	case vs.Slot != 0:
		f.Slot = vs.Slot
		f.Lost = append(f.Lost, "host demux entries (none point at the veth)")
	default:
		return f, fmt.Sprintf("container %s: no filter carries its slot", f.ID)
	}
	// Rights come from the host side only, each from two objects the
	// tenant cannot write, the narrower winning: the exclusive ports are
	// those the host demux routes to the veth AND its veth filters let it
	// send from; the ephemeral block is the one the veth's alias names,
	// which the demux must route to it. Nothing inside the namespace (its
	// ip_local_port_range, addresses, filters) adds a right.
	var excl ephemeral.Set
	if dm != nil {
		excl = ephemeral.NewSet(dm.excl...)
	}
	src := ephemeral.NewSet(vs.Ranges...)
	routed := excl.Intersect(src)
	if dm != nil && !routed.Equal(excl) {
		f.Lost = append(f.Lost, fmt.Sprintf("ports %s (routed by the host demux, not allowed by its veth filters)", excl.Subtract(src)))
	}
	// the lo demux, when it routes anything to the veth, narrows too (a
	// setup cut short before its lo entries leaves none: not a right
	// taken away, the check re-plumbs what eth0 and the filters prove)
	if onLo && !routed.Subtract(lo).Empty() {
		f.Lost = append(f.Lost, fmt.Sprintf("ports %s (routed on %s, not on %s)", routed.Subtract(lo), d.links.Eth0, d.links.Lo))
		routed = routed.Intersect(lo)
	}
	if meta.Eph != "" {
		r, err := ephemeral.ParseRange(meta.Eph)
		if err != nil || !r.IsAligned() {
			return f, fmt.Sprintf("container %s: veth alias names ephemeral block %q, no block of ours", f.ID, meta.Eph)
		}
		proof := routed
		if dm == nil {
			proof = src // no demux entry left: the veth filters must allow it
		}
		if !proof.ContainsRange(r) {
			return f, fmt.Sprintf("container %s: its ephemeral block %s (veth alias) is not routed to it by the host demux and its veth filters", f.ID, r)
		}
		f.Ephemeral = r
	} // else: the lifecycle finds the block among the routed ranges (it knows the pool)
	f.Ports = routed.Subtract(ephemeral.NewSet(f.Ephemeral))
	shared := src
	if dm != nil {
		for _, p := range dm.shared {
			shared = shared.Union(ephemeral.NewSet(ephemeral.Range{Begin: p, End: p}))
		}
	}
	f.Shared = shared.Subtract(excl).Subtract(ephemeral.NewSet(f.Ephemeral))
	if f.Ephemeral != (ephemeral.Range{}) {
		if why := d.restoreRange(&f); why != "" {
			return f, why
		}
	}
	// limits: ingress HTB on the veth, egress on the shaper entry (read
	// only where a root qdisc is: one device's qdiscs cost a dump of all)
	var err2 error
	if d.rootQdiscs[a.Index] {
		if f.Ingress, err2 = d.readLimit(a.Index); err2 != nil {
			f.Lost = append(f.Lost, "ingress limit")
		}
	}
	entry, _ := ShaperNames(f.ID)
	if idx, ok := shapers[entry]; ok && d.rootQdiscs[idx] {
		if f.Egress, err2 = d.readLimit(idx); err2 != nil {
			f.Lost = append(f.Lost, "egress limit")
		}
	}
	return f, ""
}

// restoreRange opens f's namespace and, when its tenant changed its
// ip_local_port_range, writes f's ephemeral block back (the block the host
// side proves; the tenant's value is kept in f.TenantRange for the report).
func (d *DataPlane) restoreRange(f *plane.Found) string {
	ns, err := nshandle.Open(f.Mount)
	if err != nil {
		return fmt.Sprintf("container %s: %v", f.ID, err)
	}
	f.NetNSIno = ns.Ino()
	defer ns.Close()
	return d.rewriteRange(ns, f)
}

// RestoreRange writes f's ephemeral block back as its ip_local_port_range
// when the tenant changed it (for a block the lifecycle found itself).
func (d *DataPlane) RestoreRange(f *plane.Found) error {
	if why := d.restoreRange(f); why != "" {
		return errors.New(why)
	}
	return nil
}

func (d *DataPlane) rewriteRange(ns *nshandle.NS, f *plane.Found) string {
	const key = "net/ipv4/ip_local_port_range"
	want := fmt.Sprintf("%d %d", f.Ephemeral.Begin, f.Ephemeral.End)
	err := sysctl.In(ns, func(sd *sysctl.Dir) error {
		v, err := sd.Read(key)
		if err != nil {
			return err
		}
		if strings.Join(strings.Fields(v), " ") == want {
			return nil
		}
		f.TenantRange = strings.Join(strings.Fields(v), " ")
		return sd.Write(key, want)
	})
	if err != nil {
		return fmt.Sprintf("container %s: restore its ip_local_port_range %s: %v", f.ID, want, err)
	}
	return ""
}

func (d *DataPlane) readLimit(link int) (rate.Limit, error) {
	st, err := d.shaper(link).Read()
	return st.Limit(), err
}

// fillRootQdiscs fills the recovery caches (d.rootQdiscs: links with a
// root qdisc; d.recoveryLinkList and d.recoveryLinks: the host's links, by
// name) from one dump each, unless they are valid; call with d.mu held.
func (d *DataPlane) fillRootQdiscs() error {
	if d.rootQdiscs != nil {
		return nil
	}
	ls, qs, err := dumpLinksQdiscs(d.h)
	if err != nil {
		return err
	}
	d.setRecoveryCache(ls, qs)
	return nil
}

// dumpLinksQdiscs dumps the links and the qdiscs of h's namespace, each
// complete.
func dumpLinksQdiscs(h *netlink.Handle) ([]netlink.Link, []netlink.Qdisc, error) {
	qs, err := dump("qdiscs", func() ([]netlink.Qdisc, error) { return h.QdiscList(nil) })
	if err != nil {
		return nil, nil, err
	}
	ls, err := dump("host links", h.LinkList)
	if err != nil {
		return nil, nil, err
	}
	return ls, qs, nil
}

// setRecoveryCache fills the recovery caches from dumps of the host's
// links and qdiscs; call with d.mu held, once the drop sink is known.
func (d *DataPlane) setRecoveryCache(ls []netlink.Link, qs []netlink.Qdisc) {
	d.rootQdiscs = map[int]bool{}
	for _, q := range qs {
		if a := q.Attrs(); a.Parent == netlink.HANDLE_ROOT && q.Type() != "noqueue" {
			d.rootQdiscs[a.LinkIndex] = true
		}
	}
	d.recoveryLinkList = ls
	d.recoveryLinks = make(map[string]int, len(ls))
	d.recoveryCurrent = map[string]bool{}
	d.recoveryKnown = map[string]map[uint16][]tcfilter.Entry{}
	v6, loop, v4 := d.ip6Tag(), d.loopTag(), d.v4Tag() // hashes: once, not per link
	for _, l := range ls {
		a := l.Attrs()
		if isRetired(a) {
			continue // no container's (it keeps its name until deleted)
		}
		d.recoveryLinks[a.Name] = a.Index
		if m, ok := parseAlias(a.Alias); ok && m.Layout == tcfilter.VethLayout && m.Sink == d.sink.Index && m.V6 == v6 && m.Loop == loop &&
			m.V4 == v4 && m.Eph != "" {
			d.recoveryCurrent[a.Name] = true
		}
	}
}

// recoveryHostLinks is the host's links: during recovery, from the
// recovery cache (one dump serves the start-up's readers: the sweep of
// retired links, Discover, Check and the report of strays; a dump of the
// links of 1,000 containers costs tens of ms), filled if it is not valid
// (every call that makes or deletes a link clears it); after recovery, a
// fresh dump. Call with d.mu held.
func (d *DataPlane) recoveryHostLinks() ([]netlink.Link, error) {
	if d.recoveryOver {
		return d.hostLinks()
	}
	if err := d.fillRootQdiscs(); err != nil {
		return nil, err
	}
	return d.recoveryLinkList, nil
}

// recoveryLinkOrZero is linkIndex (0 when the link does not exist) that,
// during recovery and while the recovery cache is valid, reads the cache
// (a complete dump), for which a link it does not list does not exist:
// links are made or deleted during recovery only by calls that invalidate
// the cache (Setup, Teardown, SetPorts, SetLimits)
// or by Adopt for its own container (its egress shaper, after looking it
// up). A request per container for links that mostly do not exist (the
// drop sink checked for each, the egress shapers of unlimited containers)
// made recovery of 1,000 containers slower. Call with d.mu held.
func (d *DataPlane) recoveryLinkOrZero(name string) (int, error) {
	if !d.recoveryOver && d.rootQdiscs != nil {
		return d.recoveryLinks[name], nil
	}
	return d.linkIndex(name)
}

// knownOf is dm's entries of slot in its in-memory index. During recovery,
// while the recovery cache is valid (the demuxes change only through
// calls that invalidate it), they come from one copy of the index grouped
// by slot: asking the index for each container walks all of its nodes
// each time, quadratic in containers. Call with d.mu held.
func (d *DataPlane) knownOf(dm namedDemux, slot uint16) []tcfilter.Entry {
	if d.recoveryOver || d.rootQdiscs == nil || d.recoveryKnown == nil {
		return dm.d.Known(slot)
	}
	by, ok := d.recoveryKnown[dm.name]
	if !ok {
		by = map[uint16][]tcfilter.Entry{}
		for _, e := range dm.d.KnownAll() { // sorted by kind, slot, port: per slot as Known
			by[e.Slot] = append(by[e.Slot], e)
		}
		d.recoveryKnown[dm.name] = by
	}
	return by[slot]
}

// recoveryLinkIndex returns the ifindex of host link name from the
// recovery cache (filled by one dump for all containers: a request per
// container is what made recovery with the state slow), asking the kernel
// when the cache does not have it.
func (d *DataPlane) recoveryLinkIndex(name string) (int, error) {
	if err := d.fillRootQdiscs(); err != nil {
		return 0, err
	}
	if idx, ok := d.recoveryLinks[name]; ok {
		return idx, nil
	}
	l, err := d.h.LinkByName(name)
	if err != nil {
		return 0, err
	}
	if isRetired(l.Attrs()) {
		return 0, errRetired(name)
	}
	return l.Attrs().Index, nil
}
