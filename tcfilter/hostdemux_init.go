package tcfilter

// Start-up: Init builds the fixed structure, rebuilds the in-memory index
// from one dump of the device and repairs what a crash left half done.

import (
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/ephemeral"
)

// Init makes the device ready: clsact qdisc, the fixed tables (L, H1 and,
// on eth0, the ICMP tables), the root and link nodes; then
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
	// containers each dump of eth0 costs tens of milliseconds): the echo
	// programs' lookup and the index (the echo programs are cls_bpf
	// filters and leave the u32 nodes as they are).
	all, err := x.d.dumpIngress()
	if err != nil {
		return err
	}
	if x.dst != nil {
		x.initDump = all
		x.initEcho()
		x.syncEcho6()
		x.initDump = nil
	}
	fs := ours(all)
	if err := syncFixed(nil, x.d, append(x.rootNodes(), x.tableNodes()...), fs); err != nil {
		return err
	}
	x.index(fs)
	if x.dst != nil {
		// ICMP nodes of the other layout (with or without the echo
		// programs), TablePort nodes.
		if err := x.pruneTable(fs, PrioIP, TableICMP, icmpTableNodes(x.echo == nil)); err != nil {
			return err
		}
		if err := x.repairPorts(fs); err != nil {
			return err
		}
	}
	if err := x.finish6(prio6(fs)); err != nil {
		return err
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
	// Pin-range nodes of spread tables that are no pin (the port-only
	// pins of an older daemon) would steer every client's source port.
	for _, sp := range x.shared {
		x.dropStrays(sp)
	}
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
	return mirredIndex(want) == 0 || mirredIndex(want) == mirredIndex(got)
}
