package tcfilter

import (
	"errors"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
)

// ICMP to the host IP on eth0 (TableICMP, TablePort). The root node eats
// the outer IPv4 header, so offsets here are from the ICMP header. Errors
// quote the offending packet's IP header at +8 and, when that header has no
// options (IHL 5), its first L4 word at +28: for a packet a container sent,
// the source port is the container's. An echo reply carries the identifier
// at +4. Both ports sit in the high half of a 32-bit word at a 4-byte
// aligned offset, so one table, TablePort (divisor 256 on port>>8, entries
// keyed "port & mask == begin" on the high half), serves errors (link with
// eat 28) and echo (eat 4): per packet one hash and the nodes of one
// 256-port chunk. (The dport tables H1/H2 cannot be reused: they key on the
// low half of the word at the L4 header, and u32 eats only whole words, so
// no eat puts the inner source port where their keys look.)
//
//	TableICMP, in node-id order:
//	0x001 echo request                     -> stop (the host answers)
//	0x010 error, inner 45/first frag/TCP   -> TablePort by inner sport (eat 28), else stop
//	0x011 error, inner 45/first frag/UDP   -> TablePort by inner sport (eat 28), else stop
//	0x012 error, inner 45/ICMP echo req.   -> TablePort by inner echo id (eat 32)
//	0x013 error, inner 45/ICMP echo req.   -> TableICMPFn (fan-out), stop
//	0x020 echo reply                       -> TablePort by identifier (eat 4)
//	0x021 echo reply                       -> TableICMPFn (fan-out), stop
//	0x800 anything else                    -> stop (the host)
//
// "Error" is type 3 (destination unreachable, including fragmentation
// needed) or 11 (time exceeded): the one key "type & 0xf7 == 3" matches
// exactly these two.
const (
	nodeICMPErrTCP    = 0x10
	nodeICMPErrUDP    = 0x11
	nodeICMPErrEcho   = 0x12
	nodeICMPErrEchoFn = 0x13
	nodeEchoReply     = 0x20
	nodeEchoReplyFn   = 0x21
	nodeICMPHost      = 0x800
)

// Offsets from the ICMP header.
const (
	icmpInnerIP = 8                // quoted IPv4 header
	icmpInnerL4 = icmpInnerIP + 20 // quoted L4 header when the quoted IHL is 5
	icmpEchoID  = 4                // echo identifier (high half of the word)
)

func icmpErrorKey() nl.TcU32Key { return key(0, 0xf7000000, 0x03000000) } // type 3 or 11

// innerKeys match a quoted IPv4 header without options, first fragment,
// protocol p.
func innerKeys(p uint8) []nl.TcU32Key {
	return []nl.TcU32Key{
		icmpErrorKey(),
		key(icmpInnerIP, 0xff000000, 0x45000000),
		key(icmpInnerIP+4, 0x00001fff, 0),
		key(icmpInnerIP+8, 0x00ff0000, uint32(p)<<16),
	}
}

// toPorts links to TablePort, hashing the high byte of the 16-bit value at
// off (the high half of an aligned word) and eating off bytes, so that
// TablePort's keys see that value in the high half of their word 0.
func toPorts(s *nl.TcU32Sel, off uint16) *nl.TcU32Sel {
	s.Flags |= nl.TC_U32_OFFSET | nl.TC_U32_EAT
	s.Off = off
	return hashOn(s, int16(off), 0xff000000)
}

// icmpTableNodes are the fixed nodes of TableICMP (eth0 only); without
// fan-out (echo replies steered by learning, echo.go) the two fan-out links
// are left out and what TablePort cannot attribute stays with the host.
func icmpTableNodes(fanout bool) []node {
	mk := func(id uint32, s *nl.TcU32Sel, link uint32) node {
		n := node{prio: PrioIP, handle: MakeU32Handle(TableICMP, 0, id), sel: s, link: link}
		if s.Flags&nl.TC_U32_TERMINAL != 0 {
			n.classid = ClassStop
		}
		return n
	}
	echoErr := append(innerKeys(ipprotoICMP), key(icmpInnerL4, 0xff000000, 8<<24))
	ns := []node{
		mk(nodeEchoStop, sel(nl.TC_U32_TERMINAL, icmpTypeKey(8)), 0),
		mk(nodeICMPErrTCP, toPorts(sel(nl.TC_U32_TERMINAL, innerKeys(ipprotoTCP)...), icmpInnerL4), TablePort),
		mk(nodeICMPErrUDP, toPorts(sel(nl.TC_U32_TERMINAL, innerKeys(ipprotoUDP)...), icmpInnerL4), TablePort),
		mk(nodeICMPErrEcho, toPorts(sel(0, echoErr...), icmpInnerL4+icmpEchoID), TablePort),
	}
	if fanout {
		ns = append(ns, mk(nodeICMPErrEchoFn, sel(nl.TC_U32_TERMINAL, echoErr...), TableICMPFn))
	}
	ns = append(ns, mk(nodeEchoReply, toPorts(sel(0, icmpTypeKey(0)), icmpEchoID), TablePort))
	if fanout {
		ns = append(ns, mk(nodeEchoReplyFn, sel(nl.TC_U32_TERMINAL, icmpTypeKey(0)), TableICMPFn))
	}
	return append(ns, mk(nodeICMPHost, sel(nl.TC_U32_TERMINAL), 0))
}

// portNodes are the TablePort nodes of range r (eth0 only): one per 256-port
// chunk the range meets, with the range's node id (RangeNodeID), keyed on
// the high half of the word the link ate to.
func portNodes(slot uint16, target int, r ephemeral.Range) []node {
	var ns []node
	for c := uint32(r.Begin >> 8); c <= uint32(r.End>>8); c++ {
		ns = append(ns, node{
			prio: PrioIP, handle: MakeU32Handle(TablePort, c, RangeNodeID(r)), classid: ClassID(slot),
			sel: sel(nl.TC_U32_TERMINAL, sportKey(r)), act: actRedirect, target: target,
		})
	}
	return ns
}

// decodePortNode recognises a TablePort node and reads its range.
func decodePortNode(f *netlink.U32) (owned, bool) {
	htid, bkt, nid := SplitU32Handle(f.Handle)
	if htid != TablePort || f.Sel == nil || len(f.Sel.Keys) != 1 || f.Link != 0 {
		return owned{}, false
	}
	k := f.Sel.Keys[0]
	if k.Off != 0 || k.Mask&0xffff != 0 {
		return owned{}, false
	}
	mask := uint16(k.Mask >> 16)
	r := ephemeral.Range{Begin: uint16(k.Val>>16) & mask, End: uint16(k.Val>>16)&mask | ^mask}
	if !r.IsAligned() || RangeNodeID(r) != nid || uint32(r.Begin>>8) > bkt || uint32(r.End>>8) < bkt {
		return owned{}, false
	}
	s, ok := slotOf(f.ClassId)
	if !ok {
		return owned{}, false
	}
	return owned{slot: s, target: mirredTarget(f), r: r}, true
}

// demuxNodes are all nodes of a range on this device: its dport nodes and,
// on eth0, its TablePort nodes.
func (x *HostDemux) demuxNodes(slot uint16, target int, r ephemeral.Range) []node {
	ns := rangeNodes(slot, target, r)
	if x.dst != nil {
		ns = append(ns, portNodes(slot, target, r)...)
	}
	return ns
}

// repairPorts, after index, adds the TablePort nodes missing for ranges that
// have their dport nodes (a crash between the two, or a demux from before
// TablePort existed) and deletes TablePort nodes whose range has no dport
// node left. Called with x.mu held, on eth0 only.
func (x *HostDemux) repairPorts(fs []*netlink.U32) error {
	have := map[uint32]owned{}
	for _, f := range fs {
		if o, ok := decodePortNode(f); ok {
			have[f.Handle] = o
		}
	}
	main := map[owned]bool{}
	for _, o := range x.nodes {
		main[o] = true
	}
	for o := range main {
		for _, n := range portNodes(o.slot, o.target, o.r) {
			if h, ok := have[n.handle]; ok && h == o {
				x.nodes[n.handle] = o
				continue
			}
			if _, ok := have[n.handle]; ok {
				if err := x.d.del(KindICMP, PrioIP, n.handle); err != nil {
					return err
				}
			}
			if err := x.d.add(KindICMP, n); err != nil {
				return err
			}
			have[n.handle] = o
			x.nodes[n.handle] = o
		}
	}
	for h, o := range have {
		if !main[o] {
			if err := x.d.del(KindICMP, PrioIP, h); err != nil {
				return err
			}
		}
	}
	return nil
}

// pruneTable deletes the nodes of our fixed table htid that are not in want
// (nodes of an older layout); syncFixed does this for root tables only.
func (x *HostDemux) pruneTable(fs []*netlink.U32, prio uint16, htid uint32, want []node) error {
	keep := map[uint32]bool{}
	for _, n := range want {
		keep[n.handle] = true
	}
	for _, f := range fs {
		if t, _, _ := SplitU32Handle(f.Handle); f.Priority == prio && t == htid && !keep[f.Handle] {
			if err := x.d.del(kindOf(prio, f.Handle), prio, f.Handle); err != nil {
				return err
			}
		}
	}
	return nil
}

// dropARP removes the ARP classifier of an older layout from eth0 (a root
// node linking to the ARP fan-out table TableARPFan, one mirror per
// container): root nodes, then the table, then the priority, so that no
// orphaned table is left (see "Kernel behaviour" in docs/datapath.md).
// With x.mu held.
func (x *HostDemux) dropARP(fs []*netlink.U32) (changed bool, err error) {
	found := false
	for _, f := range fs {
		if f.Priority != PrioARP {
			continue
		}
		found = true
		if htid, _, _ := SplitU32Handle(f.Handle); htid >= 0x800 {
			if err := x.d.del(KindARP, PrioARP, f.Handle); err != nil && !errors.Is(err, unix.ENOENT) {
				return true, err
			}
		}
	}
	if !found {
		return false, nil
	}
	if _, err := x.d.delTables([]tableRef{{KindARP, PrioARP, TableARPFan}}, tableBusyTimeout); err != nil {
		return true, err
	}
	return true, x.d.delPrio(KindARP, PrioARP)
}
