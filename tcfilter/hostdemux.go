package tcfilter

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
)

// HostDemux is the port demultiplexer on one host device's ingress hook
// (host eth0 with the host IP as destination, or host lo without one). It
// keeps an in-memory index of its own nodes (rebuilt from the kernel by
// Init) so that adds and deletes never dump the filter table; every method
// is safe for concurrent use.
type HostDemux struct {
	d   dev
	dst net.IP // 4 bytes, nil on lo

	mu         sync.Mutex
	ready      bool
	initDump   []netlink.Filter       // the ingress hook's dump while Init runs (nil otherwise)
	nodes      map[uint32]owned       // range node handle -> owner
	owners     [256][]owned           // ranges meeting each 256-port chunk
	h2         [256]int               // nodes (ranges + shared ports) in H2_b
	h2Linked   [256]bool              // H2_b exists and H1[b] links to it
	shared     map[uint16]*sharedPort // shared port -> its spread table
	spreadUsed map[uint32]uint16      // spread table id -> shared port
	fanout     map[uint16]int         // slot -> mirror target (ARP and ICMP)
	stale      []tableRef             // unlinked tables the kernel still held busy
	echo       *echoSteer             // echo programs and maps (eth0, echo.go); nil: fan-out
	echoErr    error                  // why echo is nil after Init
}

type owned struct {
	slot   uint16
	target int
	r      ephemeral.Range
}

// Entry is one thing of ours found on the device. A range that takes
// several nodes (one per 256- or 16-port chunk) is one Entry whose Handle is
// its first node; a shared port is one Entry per holder that owns at least
// one spread bucket or pin (Handle: the first such node).
type Entry struct {
	Kind   string // range | shared | arp | icmp
	Slot   uint16
	Target int
	Range  ephemeral.Range // range and shared entries (a shared port is Begin == End)
	Handle uint32
}

// Entry kinds.
const (
	EntryRange  = "range"
	EntryShared = "shared"
	EntryARP    = "arp"
	EntryICMP   = "icmp"
)

// NewHostDemux describes the demux on device ifindex of the namespace h is
// opened in. device labels metrics ("eth0" or "lo"); dst is the host IPv4
// address matched on eth0 (nil on lo: every local TCP/UDP packet is
// demultiplexed, and there is no ARP/ICMP fan-out). Nothing touches the
// kernel before Init (or the first call that needs it).
func NewHostDemux(h *netlink.Handle, ifindex int, device string, dst net.IP, obs Observer) *HostDemux {
	var d4 net.IP
	if dst != nil {
		d4 = dst.To4()
	}
	return &HostDemux{d: dev{h: h, ifindex: ifindex, label: device, obs: obs}, dst: d4}
}

// ---- node layout ----

func (x *HostDemux) rootNodes() []node {
	l4 := func(proto uint8) *nl.TcU32Sel {
		keys := []nl.TcU32Key{protoKey(proto), firstFragKey()}
		if x.dst != nil {
			keys = append(keys, dstKey(x.dst))
		}
		return eatIHL(sel(0, keys...))
	}
	ns := []node{
		{prio: PrioIP, handle: nodeRootTCP, sel: l4(ipprotoTCP), link: TableL},
		{prio: PrioIP, handle: nodeRootUDP, sel: l4(ipprotoUDP), link: TableL},
	}
	if x.dst != nil {
		// Non-first ICMP fragments the echo program did not steer stay
		// with the host; without it they are fanned out.
		fragLink := uint32(TableICMPFn)
		if x.echo != nil {
			fragLink = 0
		}
		ns = append(ns,
			node{prio: PrioIP, handle: nodeRootICMP, link: TableICMP,
				sel: eatIHL(sel(0, protoKey(ipprotoICMP), firstFragKey(), dstKey(x.dst)))},
			// Non-first fragments of ICMP (large echo replies): fan out
			// as well, then stop. First fragments never get here: every
			// node of TableICMP is terminal.
			node{prio: PrioIP, handle: nodeRootICMPFrag, link: fragLink, classid: ClassStop,
				sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoICMP), dstKey(x.dst))},
			// No ARP classifier: ARP stays with the host; containers get
			// their neighbours from the host's table (package neighsync),
			// so no ARP frame is ever copied to a container.
		)
	}
	return ns
}

// tableNodes are the fixed nodes inside our own tables.
func (x *HostDemux) tableNodes() []node {
	ns := []node{{
		prio: PrioIP, handle: MakeU32Handle(TableL, 0, nodeL), link: TableH1,
		sel: hashOn(sel(0), 0, 0x0000ff00), // dport high byte
	}}
	if x.dst != nil {
		ns = append(ns, icmpTableNodes(x.echo == nil)...)
	}
	return ns
}

type tableSpec struct {
	kind          string
	prio          uint16
	htid, divisor uint32
}

func (x *HostDemux) tables() []tableSpec {
	ts := []tableSpec{
		{KindIP, PrioIP, TableL, 1},
		{KindIP, PrioIP, TableH1, 256},
	}
	if x.dst != nil {
		ts = append(ts,
			tableSpec{KindICMP, PrioIP, TableICMP, 1},
			tableSpec{KindICMP, PrioIP, TableICMPFn, 1},
			tableSpec{KindICMP, PrioIP, TablePort, 256},
		)
	}
	return ts
}

func h2Link(b uint8) node {
	return node{
		prio: PrioIP, handle: MakeU32Handle(TableH1, uint32(b), nodeH2Link), link: TableH2Base + uint32(b),
		sel: hashOn(sel(0), 0, 0x000000f0), // dport bits 4..7
	}
}

// rangeNodes are the nodes that route r: one per 256-port chunk in H1 for
// ranges of 256 ports or more, one per 16-port chunk in H2_b for ranges of
// 16..128, one node in its H2_b bucket for smaller ones.
func rangeNodes(slot uint16, target int, r ephemeral.Range) []node {
	id := RangeNodeID(r)
	mk := func(htid, bkt uint32) node {
		return node{
			prio: PrioIP, handle: MakeU32Handle(htid, bkt, id), classid: ClassID(slot),
			sel: sel(nl.TC_U32_TERMINAL, dportKey(r)), act: actRedirect, target: target,
		}
	}
	var ns []node
	switch size := r.Size(); {
	case size >= 256:
		for c := uint32(r.Begin >> 8); c <= uint32(r.End>>8); c++ {
			ns = append(ns, mk(TableH1, c))
		}
	default:
		hi := uint32(r.Begin >> 8)
		for s := uint32(r.Begin>>4) & 15; s <= uint32(r.End>>4)&15; s++ {
			ns = append(ns, mk(TableH2Base+hi, s))
		}
	}
	return ns
}

// isSmall reports whether a node handle lives in an H2 table, and which.
func h2Of(handle uint32) (uint8, bool) {
	htid := handle >> 20
	if htid >= TableH2Base && htid < TableH2Base+256 {
		return uint8(htid - TableH2Base), true
	}
	return 0, false
}

func chunks(r ephemeral.Range) (first, last int) { return int(r.Begin >> 8), int(r.End >> 8) }

// ---- Init ----

// Init makes the device ready: clsact qdisc, the fixed tables (L, H1 and,
// on eth0, the ICMP and ARP fan-out tables), the root and link nodes; then
// it reads back everything of ours to rebuild the in-memory index, repairs
// a half-done structure left by a crash (an H2 table with nodes but no link,
// an empty linked one, a node with the wrong keys) and keeps every
// container node it finds. It is idempotent.
func (x *HostDemux) Init() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.initLocked()
}

func (x *HostDemux) ensureReady() error {
	if x.ready {
		x.retryStale()
		return nil
	}
	return x.initLocked()
}

func (x *HostDemux) initLocked() error {
	x.ready = false
	if err := EnsureClsact(x.d.h, x.d.ifindex); err != nil {
		return fmt.Errorf("%s: %w", x.d.label, err)
	}
	for _, t := range x.tables() {
		if err := x.d.addTable(t.kind, t.prio, t.htid, t.divisor); err != nil {
			return err
		}
	}
	// One dump of the ingress hook serves the whole start-up (with 1,000
	// containers each dump of eth0 costs tens of milliseconds): the ARP
	// layout check, the echo programs' lookup, and the index. It is taken
	// again only when the ARP check changed nodes; the echo programs are
	// cls_bpf filters and leave the u32 nodes as they are.
	all, err := x.d.dumpIngress()
	if err != nil {
		return err
	}
	if x.dst != nil {
		changed, err := x.dropARP(ours(all))
		if err != nil {
			return err
		}
		if changed {
			if all, err = x.d.dumpIngress(); err != nil {
				return err
			}
		}
		x.initDump = all
		x.initEcho()
		x.initDump = nil
	}
	fs := ours(all)
	if err := syncFixed(x.d, append(x.rootNodes(), x.tableNodes()...), fs); err != nil {
		return err
	}
	x.index(fs)
	if x.dst != nil {
		// ICMP nodes of an older layout, the ARP fan-out table of an
		// older version (unlinked by syncFixed), TablePort nodes.
		if err := x.pruneTable(fs, PrioIP, TableICMP, icmpTableNodes(x.echo == nil)); err != nil {
			return err
		}
		if err := x.repairPorts(fs); err != nil {
			return err
		}
	}
	// Empty H2 tables left unlinked (a crash between unlinking and
	// deleting) are invisible in dumps: sweep their ids once.
	// (Not reported to the observer: most of these ids do not exist.)
	var sweep []tableRef
	for b := 0; b < 256; b++ {
		if t := TableH2Base + uint32(b); !x.h2Linked[b] && x.h2[b] == 0 && !x.isStale(t) {
			sweep = append(sweep, tableRef{KindIP, PrioIP, t})
		}
	}
	quiet := x.d
	quiet.obs = nil
	busy, _ := quiet.delTables(sweep, 0)
	for _, t := range busy {
		x.addStale(t)
	}
	x.retryStale()
	// Repairs.
	for b := 0; b < 256; b++ {
		switch {
		case x.h2[b] > 0 && !x.h2Linked[b]:
			if err := x.linkH2(uint8(b)); err != nil {
				return err
			}
		case x.h2[b] == 0 && x.h2Linked[b]:
			x.releaseH2([]uint8{uint8(b)})
		}
	}
	x.ready = true
	return nil
}

// kindOf is the metrics kind of the node or table with this handle.
func kindOf(prio uint16, handle uint32) string {
	htid, _, nid := SplitU32Handle(handle)
	switch {
	case prio == PrioARP || prio == PrioVethARP:
		return KindARP
	case htid == TableICMP || htid == TableICMPFn || htid == TablePort:
		return KindICMP
	case (htid == 0 || htid >= 0x800) && (nid == nodeRootICMP || nid == nodeRootICMPFrag):
		return KindICMP
	}
	return KindIP
}

// index rebuilds the in-memory index from a dump.
func (x *HostDemux) index(fs []*netlink.U32) {
	x.nodes = map[uint32]owned{}
	x.owners = [256][]owned{}
	x.h2 = [256]int{}
	x.h2Linked = [256]bool{}
	x.shared = map[uint16]*sharedPort{}
	x.spreadUsed = map[uint32]uint16{}
	x.fanout = map[uint16]int{}
	spread := map[uint32][]*netlink.U32{}
	seenRange := map[owned]bool{}
	for _, f := range fs {
		htid, bkt, nid := SplitU32Handle(f.Handle)
		switch {
		case f.Priority != PrioIP:
		case htid == TableH1 && nid == nodeH2Link:
			x.h2Linked[bkt] = true
		case htid >= TableSpreadFirst && htid <= TableSpreadLast:
			spread[htid] = append(spread[htid], f)
		default:
			if o, ok := decodeRange(f); ok {
				x.nodes[f.Handle] = o
				if b, small := h2Of(f.Handle); small {
					x.h2[b]++
				}
				if !seenRange[o] {
					seenRange[o] = true
					first, last := chunks(o.r)
					for c := first; c <= last; c++ {
						x.owners[c] = append(x.owners[c], o)
					}
				}
				continue
			}
			if b, small := h2Of(f.Handle); small && nid&^0xff == nodeSharedBase && f.Link != 0 {
				if p, ok := sharedPortOf(f); ok && uint8(p>>8) == b {
					x.h2[b]++
					t := f.Link >> 20
					x.shared[p] = &sharedPort{table: t}
					x.spreadUsed[t] = p
				}
			}
		}
	}
	for t, nodes := range spread {
		p, ok := x.spreadUsed[t]
		if !ok {
			// a spread table nobody links to (crash while sharing): drop it
			x.addStale(tableRef{KindIP, PrioIP, t})
			continue
		}
		indexSpread(x.shared[p], nodes)
	}
	// ICMP fan-out nodes (IP prio) complete the fan-out index
	for _, f := range fs {
		if htid, _, nid := SplitU32Handle(f.Handle); f.Priority == PrioIP && htid == TableICMPFn {
			if s, ok := slotOf(f.ClassId); ok && s == uint16(nid) {
				x.fanout[s] = mirredTarget(f)
			}
		}
	}
}

// decodeRange recognises a range node (H1 or H2) and reads its range from
// its key; the node id must match the range (RangeNodeID).
func decodeRange(f *netlink.U32) (owned, bool) {
	htid, bkt, nid := SplitU32Handle(f.Handle)
	inH1 := htid == TableH1 && nid >= 0x208 && nid <= 0x210
	_, inH2 := h2Of(f.Handle)
	inH2 = inH2 && nid >= 2 && nid <= 511
	if !inH1 && !inH2 || f.Sel == nil || len(f.Sel.Keys) != 1 || f.Link != 0 {
		return owned{}, false
	}
	k := f.Sel.Keys[0]
	if k.Off != 0 || k.Mask&0xffff0000 != 0 {
		return owned{}, false
	}
	mask := uint16(k.Mask)
	r := ephemeral.Range{Begin: uint16(k.Val) & mask, End: uint16(k.Val)&mask | ^mask}
	if !r.IsAligned() || RangeNodeID(r) != nid {
		return owned{}, false
	}
	if inH1 && (uint32(r.Begin>>8) > bkt || uint32(r.End>>8) < bkt) {
		return owned{}, false
	}
	if inH2 && (uint32(r.Begin>>8) != htid-TableH2Base || uint32(r.Begin>>4)&15 > bkt || uint32(r.End>>4)&15 < bkt) {
		return owned{}, false
	}
	s, ok := slotOf(f.ClassId)
	if !ok {
		return owned{}, false
	}
	return owned{slot: s, target: mirredTarget(f), r: r}, true
}

func sharedPortOf(f *netlink.U32) (uint16, bool) {
	if f.Sel == nil || len(f.Sel.Keys) != 1 || f.Sel.Keys[0].Off != 0 || f.Sel.Keys[0].Mask != 0xffff {
		return 0, false
	}
	return uint16(f.Sel.Keys[0].Val), true
}

// sameNode compares what we would add with what the kernel holds.
func sameNode(want, got *netlink.U32) bool {
	if got.Sel == nil || want.Link != got.Link || want.ClassId != got.ClassId {
		return false
	}
	a, b := want.Sel, got.Sel
	if a.Flags != b.Flags || a.Offshift != b.Offshift || a.Offmask != b.Offmask || a.Off != b.Off ||
		a.Offoff != b.Offoff || a.Hoff != b.Hoff || a.Hmask != b.Hmask || len(a.Keys) != len(b.Keys) {
		return false
	}
	for i := range a.Keys {
		ka, kb := a.Keys[i], b.Keys[i]
		if ka.Mask != kb.Mask || ka.Val&ka.Mask != kb.Val&kb.Mask || ka.Off != kb.Off || ka.OffMask != kb.OffMask {
			return false
		}
	}
	if mirredTarget(want) != mirredTarget(got) || len(want.Actions) != len(got.Actions) {
		return false
	}
	return true
}

// ---- H2 tables ----

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
// and Flush, Init and Clear wait for it.
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

// retryStale makes one attempt at deleting tables that were still busy.
func (x *HostDemux) retryStale() {
	if len(x.stale) == 0 {
		return
	}
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

// ---- ranges ----

// AddRanges routes the aligned ranges rs to target (the host-side veth of
// container slot). The ports must not be routed to another slot (ErrOverlap;
// the same slot may hold overlapping ranges for a moment, while an update
// adds the new ranges before removing the old ones). A range the slot has
// already is kept (and follows target if that changed), so re-adding is
// harmless. It is all or nothing: on error every node it added is removed
// again and every target it changed is put back.
func (x *HostDemux) AddRanges(slot uint16, target int, rs []ephemeral.Range) error {
	if err := checkSlot(slot); err != nil {
		return err
	}
	if target <= 0 {
		return fmt.Errorf("target ifindex %d: must be positive", target)
	}
	if err := checkRanges(rs); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return err
	}
	for _, r := range rs {
		if err := x.checkFree(slot, r); err != nil {
			return err
		}
	}
	var (
		added    []uint32
		replaced []owned // previous owners of nodes whose target changed
		repH     []uint32
		newH2    []uint8
		addErr   error
	)
add:
	for _, r := range rs {
		for _, n := range x.demuxNodes(slot, target, r) {
			if o, ok := x.nodes[n.handle]; ok && o.slot == slot && o.r == r {
				// the slot has this range already: keep it, follow a new target
				if o.target != target {
					if err := x.d.replace(KindIP, n); err != nil {
						addErr = fmt.Errorf("range %s: %w", r, err)
						break add
					}
					replaced, repH = append(replaced, o), append(repH, n.handle)
					x.nodes[n.handle] = owned{slot: slot, target: target, r: r}
				}
				continue
			}
			b, small := h2Of(n.handle)
			if small && !x.h2Linked[b] {
				if err := x.linkH2(b); err != nil {
					newH2 = append(newH2, b)
					addErr = err
					break add
				}
				newH2 = append(newH2, b)
			}
			if err := x.d.add(KindIP, n); err != nil {
				addErr = fmt.Errorf("range %s: %w", r, err)
				break add
			}
			added = append(added, n.handle)
			x.nodes[n.handle] = owned{slot: slot, target: target, r: r}
			if small {
				x.h2[b]++
			}
		}
	}
	if addErr != nil {
		for i := len(added) - 1; i >= 0; i-- {
			h := added[i]
			if err := x.d.del(KindIP, PrioIP, h); err != nil && !errors.Is(err, unix.ENOENT) {
				addErr = errors.Join(addErr, fmt.Errorf("rollback: %w", err))
				continue
			}
			delete(x.nodes, h)
			if b, small := h2Of(h); small {
				x.h2[b]--
			}
		}
		for i, o := range replaced {
			for _, n := range x.demuxNodes(o.slot, o.target, o.r) {
				if n.handle != repH[i] {
					continue
				}
				if err := x.d.replace(KindIP, n); err != nil {
					addErr = errors.Join(addErr, fmt.Errorf("rollback: %w", err))
				} else {
					x.nodes[n.handle] = o
				}
			}
		}
		x.releaseH2(newH2)
		return addErr
	}
	for _, r := range rs {
		o := owned{slot: slot, target: target, r: r}
		first, last := chunks(r)
		for c := first; c <= last; c++ {
			x.owners[c] = slices.DeleteFunc(x.owners[c], func(p owned) bool { return p.slot == slot && p.r == r })
			x.owners[c] = append(x.owners[c], o)
		}
	}
	return nil
}

// checkFree fails if r meets ports routed to another slot or a shared port
// (unless slot alone holds that port: see SetSpread).
func (x *HostDemux) checkFree(slot uint16, r ephemeral.Range) error {
	first, last := chunks(r)
	for c := first; c <= last; c++ {
		for _, o := range x.owners[c] {
			if o.slot != slot && o.r.Overlaps(r) {
				return fmt.Errorf("range %s meets %s of slot %d: %w", r, o.r, o.slot, ErrOverlap)
			}
		}
	}
	return x.sharedConflict(slot, r)
}

// DelRanges removes the nodes of slot's ranges rs. It is tolerant: nodes
// already gone are counted in missing, not reported as errors. A range whose
// nodes belong to another slot is left alone and reported. H2 tables left
// empty are unlinked and deleted.
func (x *HostDemux) DelRanges(slot uint16, rs []ephemeral.Range) (missing int, err error) {
	if err := checkSlot(slot); err != nil {
		return 0, err
	}
	for _, r := range rs {
		if !r.IsAligned() {
			return 0, fmt.Errorf("range %s: %w", r, ErrNotAligned)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return 0, err
	}
	var (
		errs    []error
		touched []uint8
	)
next:
	for _, r := range rs {
		ns := x.demuxNodes(slot, 0, r)
		for _, n := range ns {
			if o, ok := x.nodes[n.handle]; ok && o.slot != slot {
				errs = append(errs, fmt.Errorf("range %s is routed to slot %d, not %d", r, o.slot, slot))
				continue next
			}
		}
		for _, n := range ns {
			err := x.d.del(KindIP, PrioIP, n.handle)
			switch {
			case errors.Is(err, unix.ENOENT) && n.handle>>20 == TablePort:
				// counted by its dport node (TablePort nodes are a copy)
			case errors.Is(err, unix.ENOENT):
				missing++
			case err != nil:
				errs = append(errs, err)
				continue
			}
			if _, ok := x.nodes[n.handle]; ok {
				delete(x.nodes, n.handle)
				if b, small := h2Of(n.handle); small {
					x.h2[b]--
					touched = append(touched, b)
				}
			}
		}
		first, last := chunks(r)
		for c := first; c <= last; c++ {
			x.owners[c] = slices.DeleteFunc(x.owners[c], func(o owned) bool { return o.slot == slot && o.r == r })
		}
	}
	x.releaseH2(touched)
	return missing, errors.Join(errs...)
}

// ---- fan-out ----

func fanNode(slot uint16, target int) node {
	return node{prio: PrioIP, handle: MakeU32Handle(TableICMPFn, 0, uint32(slot)), classid: ClassID(slot),
		sel: sel(nl.TC_U32_TERMINAL), act: actMirror, target: target}
}

// AddFanout makes the ICMP that cannot be attributed to one container (echo
// replies whose identifier is in no container's ports, errors about such
// echo requests, non-first ICMP fragments) also reach target: one mirror
// node per container in TableICMPFn (node id = slot), so adding a container
// is O(1). ARP is never copied (see neighsync), ICMP errors about TCP/UDP
// go to the one owner of the quoted source port. It is idempotent and
// replaces an older target.
func (x *HostDemux) AddFanout(slot uint16, target int) error {
	if x.dst == nil {
		return fmt.Errorf("%s: %w", x.d.label, ErrNoFanout)
	}
	if err := checkSlot(slot); err != nil {
		return err
	}
	if target <= 0 {
		return fmt.Errorf("target ifindex %d: must be positive", target)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return err
	}
	if err := x.d.replace(KindICMP, fanNode(slot, target)); err != nil {
		return err
	}
	x.fanout[slot] = target
	return nil
}

// DelFanout removes slot's ICMP mirror node; missing counts the nodes that
// were already gone (0 or 1).
func (x *HostDemux) DelFanout(slot uint16) (missing int, err error) {
	if x.dst == nil {
		return 0, fmt.Errorf("%s: %w", x.d.label, ErrNoFanout)
	}
	if err := checkSlot(slot); err != nil {
		return 0, err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return 0, err
	}
	err = x.d.del(KindICMP, PrioIP, fanNode(slot, 0).handle)
	switch {
	case errors.Is(err, unix.ENOENT):
		missing++
	case err != nil:
		return 0, err
	}
	delete(x.fanout, slot)
	return missing, nil
}

// ---- listing and clearing ----

// Entries lists everything of ours on the device, read from the kernel
// (not from the in-memory index): ranges, shared-port holders, ARP and
// ICMP fan-out nodes, sorted by kind, slot and port.
func (x *HostDemux) Entries() ([]Entry, error) {
	fs, err := x.d.list()
	if err != nil {
		return nil, err
	}
	links := map[uint32]uint16{} // spread table -> port
	for _, f := range fs {
		if _, small := h2Of(f.Handle); small && f.Priority == PrioIP && f.Handle&0xf00 == nodeSharedBase && f.Link != 0 {
			if p, ok := sharedPortOf(f); ok {
				links[f.Link>>20] = p
			}
		}
	}
	var out []Entry
	seen := map[Entry]bool{}
	addOnce := func(e Entry) {
		k := e
		k.Handle = 0
		if !seen[k] {
			seen[k] = true
			out = append(out, e)
		}
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].Handle < fs[j].Handle })
	for _, f := range fs {
		htid, _, nid := SplitU32Handle(f.Handle)
		switch {
		case f.Priority == PrioARP && htid == TableARPFan:
			if s, ok := slotOf(f.ClassId); ok {
				addOnce(Entry{Kind: EntryARP, Slot: s, Target: mirredTarget(f), Handle: f.Handle})
			}
		case f.Priority != PrioIP:
		case htid == TableICMPFn:
			if s, ok := slotOf(f.ClassId); ok {
				addOnce(Entry{Kind: EntryICMP, Slot: s, Target: mirredTarget(f), Handle: f.Handle})
			}
		case htid >= TableSpreadFirst && htid <= TableSpreadLast:
			p, linked := links[htid]
			s, ok := slotOf(f.ClassId)
			if _, bkt, _ := SplitU32Handle(f.Handle); linked && ok && isSpreadNode(bkt, nid) {
				addOnce(Entry{Kind: EntryShared, Slot: s, Target: mirredTarget(f),
					Range: ephemeral.Range{Begin: p, End: p}, Handle: f.Handle})
			}
		default:
			if o, ok := decodeRange(f); ok {
				addOnce(Entry{Kind: EntryRange, Slot: o.slot, Target: o.target, Range: o.r, Handle: f.Handle})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Slot != b.Slot {
			return a.Slot < b.Slot
		}
		return a.Range.Begin < b.Range.Begin
	})
	return out, nil
}

// Clear removes all our filters and tables from the device, in an order
// the kernel accepts: the root nodes (which unlink every table), our tables
// from the top down (deleting a table deletes its nodes; each level waits
// out the EBUSY of the links just removed), then both priorities. The qdisc
// stays. It is meant for tests and for undoing host preparation.
func (x *HostDemux) Clear() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.ready = false
	if x.dst != nil {
		x.dropEcho()
	}
	fs, err := x.d.list()
	if err != nil {
		return err
	}
	var errs []error
	h2 := map[uint32]bool{}
	spread := map[uint32]bool{}
	for _, t := range x.stale {
		switch {
		case t.htid >= TableSpreadFirst:
			spread[t.htid] = true
		case t.htid >= TableH2Base:
			h2[t.htid] = true
		}
	}
	x.stale = nil
	for _, f := range fs {
		htid, _, _ := SplitU32Handle(f.Handle)
		switch {
		case htid >= 0x800:
			if err := x.d.del(kindOf(f.Priority, f.Handle), f.Priority, f.Handle); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
		case htid >= TableSpreadFirst && htid <= TableSpreadLast:
			spread[htid] = true
		case htid >= TableH2Base && htid < TableH2Base+256:
			h2[htid] = true
		}
		if f.Link>>20 >= TableH2Base && f.Link>>20 < TableH2Base+256 {
			h2[f.Link>>20] = true
		}
		if f.Link>>20 >= TableSpreadFirst && f.Link>>20 <= TableSpreadLast {
			spread[f.Link>>20] = true
		}
	}
	levels := [][]tableRef{
		{{KindIP, PrioIP, TableL}, {KindICMP, PrioIP, TableICMP}, {KindARP, PrioARP, TableARPFan}},
		{{KindIP, PrioIP, TableH1}, {KindICMP, PrioIP, TableICMPFn}, {KindICMP, PrioIP, TablePort}},
		nil, nil,
	}
	for _, t := range slices.Sorted(maps.Keys(h2)) {
		levels[2] = append(levels[2], tableRef{KindIP, PrioIP, t})
	}
	for _, t := range slices.Sorted(maps.Keys(spread)) {
		levels[3] = append(levels[3], tableRef{KindIP, PrioIP, t})
	}
	for _, l := range levels {
		if len(l) == 0 {
			continue
		}
		if _, err := x.d.delTables(l, tableBusyTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range []struct {
		kind string
		prio uint16
	}{{KindARP, PrioARP}, {KindIP, PrioIP}} {
		if err := x.d.delPrio(p.kind, p.prio); err != nil {
			errs = append(errs, err)
		}
	}
	x.index(nil)
	return errors.Join(errs...)
}
