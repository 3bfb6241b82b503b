package tcfilter

import (
	"net"

	"github.com/vishvananda/netlink/nl"
)

// IPv6 first fragments in the host demux. A datagram's first fragment
// carries its ports right after a fragment header, which the root nodes
// of TCP and UDP (next header at 6) do not look past: these nodes match a
// fragment header right after the fixed header (next header 44) whose
// fragment offset is 0 and whose next header is TCP or UDP, eat 48 bytes
// and link to L, so the first fragment goes to the container owning its
// destination port like an unfragmented packet (an atomic fragment, M
// clear, too). Later fragments carry no ports: package fragbpf's steer
// program, in front of tc, sends them after their first fragment. A
// fragment header behind other extension headers is not looked into (the
// datagram stays with the host, counted on eth0 as before).
//
// Node ids: 0x40+2i (TCP) and 0x41+2i (UDP) for host address i on eth0,
// 0x40 and 0x41 on lo; after the unfragmented nodes, before the counting
// nodes (0x100+i).
const nodeRoot6Frag = 0x40

// nextHdrFragment is IPv6's fragment header.
const nextHdrFragment = 44

// frag6FirstKey matches a fragment header at the end of the fixed header
// whose next header is p and whose fragment offset is 0 (M either way).
func frag6FirstKey(p uint8) nl.TcU32Key {
	return key(ip6HeaderLen, 0xff00fff8, uint32(p)<<24)
}

// rootNodes6Frag are the first-fragment nodes for one destination (nil
// dst: lo, any destination), i the address's index.
func rootNodes6Frag(i int, dst net.IP) []node {
	var dk []nl.TcU32Key
	if dst != nil {
		dk = addr6Keys(ip6Dst, dst)
	}
	mk := func(id uint32, p uint8) node {
		keys := append([]nl.TcU32Key{nextHdrKey(nextHdrFragment), frag6FirstKey(p)}, dk...)
		return node{prio: PrioIP6, handle: id, classid: ClassStop, link: TableL,
			sel: fixedOffsetEat(sel(nl.TC_U32_TERMINAL, keys...), ip6HeaderLen+8)}
	}
	base := uint32(nodeRoot6Frag + 2*i)
	return []node{mk(base, ipprotoTCP), mk(base+1, ipprotoUDP)}
}
