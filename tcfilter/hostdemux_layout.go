package tcfilter

// The fixed tables and nodes of a host demux and the nodes of a range.

import (
	"github.com/vishvananda/netlink/nl"

	"github.com/isolatord/isolatord/ephemeral"
)

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
	return append(ns, x.rootNodes6()...)
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
	return append(ns, x.tableNodes6()...)
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
	return append(ts, x.tables6()...)
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
