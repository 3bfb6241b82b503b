package tcfilter

import (
	"github.com/vishvananda/netlink/nl"
)

// Fragmented datagrams inside the container (ContainerFilters). Without
// host eth0's wire guard (package wirebpf; with it lo has the loopback MTU
// and nothing to the host is fragmented) the container's lo has the
// host's MTU, so a datagram it sends to the host
// IP or a host IPv6 address that is larger is fragmented there, and later
// fragments carry no ports to tell whether the datagram is for the
// container itself or goes out. So every fragment of such a datagram
// goes out through eth0, the container's own ones too: the host's veth
// filters check it as any fragment (the first by its ports, later ones by
// destination), the host's lo demux sends the first fragment to the
// port's owner (the container itself, for its own port: it arrives on
// eth0, where the host address is local) and package fragbpf the later
// ones after it. Unfragmented packets to an own port stay local as
// before.
//
// Not to 127.0.0.0/8 or ::1: what the host sends the container there
// arrives on eth0 and is redirected to lo, where its lo filters run
// again; a fragment sent out from lo would come back and go out again.
// Fragments to 127/8 and ::1 stay local, as before (a fragmented
// datagram to another container or the host through 127.0.0.1 or ::1
// is lost).

// notFragKey matches an IPv4 packet that is not a fragment (MF clear,
// offset 0).
func notFragKey() nl.TcU32Key { return key(4, 0x00003fff, 0) }

// loFragNodes are the container lo's IPv4 nodes for fragments: after the
// first-fragment redirects (7, 8), every other fragment of TCP and UDP
// to the host IP -> eth0.
func (c ContainerFilters) loFragNodes() []node {
	return withKinds([]node{
		{prio: PrioIP, handle: 9, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoTCP), dstKey(c.HostIP)), act: actRedirect, target: c.Eth0},
		{prio: PrioIP, handle: 10, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoUDP), dstKey(c.HostIP)), act: actRedirect, target: c.Eth0},
	})
}

// loFragNodes6: a fragment header right after the fixed header, to a host
// address -> eth0 (ids after loRoot6's).
func (c ContainerFilters) loFragNodes6(first uint32) []node {
	var ns []node
	for i, a := range c.HostIP6 {
		ns = append(ns, node{prio: PrioIP6, handle: first + uint32(i), classid: ClassStop, act: actRedirect, target: c.Eth0,
			sel: sel(nl.TC_U32_TERMINAL, append([]nl.TcU32Key{nextHdrKey(nextHdrFragment)}, addr6Keys(ip6Dst, a)...)...)})
	}
	return withKinds(ns)
}
