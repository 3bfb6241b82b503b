package tcfilter

// The container's own lo and eth0, IPv6 twins of the IPv4 nodes
// (ContainerFilters).

import (
	"net"

	"github.com/vishvananda/netlink/nl"
)

// loRoot6 are the container lo's IPv6 root nodes (none without host IPv6
// addresses), the twin of loRoot: ICMPv6 to a host address or ::1 stays
// local; TCP/UDP (transport header right after the fixed header) to a
// host address or ::1 with an own destination port stays local (link to
// the IPv4 classifier's own-port table, whose nodes stop); other such
// TCP/UDP goes out through eth0 to the host (its processes or another
// container). Everything else stays local.
func (c ContainerFilters) loRoot6() []node {
	if len(c.HostIP6) == 0 {
		return nil
	}
	dsts := append(append([]net.IP(nil), c.HostIP6...), net.IPv6loopback)
	var ns []node
	id := uint32(1)
	next := func() uint32 { id++; return id - 1 }
	for _, a := range dsts {
		ns = append(ns, node{prio: PrioIP6, handle: next(), classid: ClassStop, kind: KindICMP,
			sel: sel(nl.TC_U32_TERMINAL, append([]nl.TcU32Key{nextHdrKey(ipprotoICMPv6)}, addr6Keys(ip6Dst, a)...)...)})
	}
	for _, a := range dsts {
		for _, p := range []uint8{ipprotoTCP, ipprotoUDP} {
			ns = append(ns, node{prio: PrioIP6, handle: next(), link: ctrLo.hashTable,
				sel: eat40(sel(0, append([]nl.TcU32Key{nextHdrKey(p)}, addr6Keys(ip6Dst, a)...)...))})
		}
	}
	for _, a := range dsts {
		for _, p := range []uint8{ipprotoTCP, ipprotoUDP} {
			ns = append(ns, node{prio: PrioIP6, handle: next(), classid: ClassStop, act: actRedirect, target: c.Eth0,
				sel: sel(nl.TC_U32_TERMINAL, append([]nl.TcU32Key{nextHdrKey(p)}, addr6Keys(ip6Dst, a)...)...)})
		}
	}
	return append(withKinds(ns), c.loFragNodes6(id)...)
}

// eth0Root6 is the twin of eth0Root: TCP/UDP to ::1 with an own
// destination port (from the host's lo) is redirected to lo (a packet to
// ::1 arriving on eth0 would be dropped by the stack).
func (c ContainerFilters) eth0Root6() []node {
	if len(c.HostIP6) == 0 {
		return nil
	}
	l4 := func(p uint8) *nl.TcU32Sel {
		return eat40(sel(0, append([]nl.TcU32Key{nextHdrKey(p)}, addr6Keys(ip6Dst, net.IPv6loopback)...)...))
	}
	return withKinds([]node{
		{prio: PrioIP6, handle: 1, sel: l4(ipprotoTCP), link: ctrEth0.hashTable},
		{prio: PrioIP6, handle: 2, sel: l4(ipprotoUDP), link: ctrEth0.hashTable},
	})
}
