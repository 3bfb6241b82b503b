package tcfilter

import "github.com/vishvananda/netlink/nl"

// ICMP a container may send is what an end host sends about its own
// flows: echo requests and replies, and "destination unreachable" with a
// code an end host's own stack or firewall emits for its own sockets,
// quoting a packet one of the container's ports received:
//
//   - port unreachable (3): the stack's answer to a datagram for a port
//     nobody listens on;
//   - communication administratively prohibited (13) and host
//     administratively prohibited (10): what the container's own firewall
//     sends when it rejects (iptables/nftables REJECT, firewalld's
//     default). Peers apply them to the quoted socket only.
//
// Every other error is about the path or the address, not one socket, and
// is dropped as DropICMPState: a peer acts on it for every flow to the
// shared host IP. Fragmentation needed (3/4) lowers the peer's cached
// path MTU of the host IP for ten minutes (every container's and the
// host's new connections from that peer then get a small MSS); source
// quench, redirects, time exceeded and parameter problems are a router's
// or concern the whole address; net/host/protocol unreachable and the
// other codes of 3 are a router's (protocol unreachable never quotes TCP
// or UDP, the only protocols a container may speak). The container's
// kernel sends none of them about its own flows except time exceeded
// after a failed reassembly, whose loss costs nothing (the sender
// retransmits or times out).
//
// IPv6 the same way (veth6.go): destination unreachable with code 4
// (port unreachable) or 1 (administratively prohibited) only; packet too
// big (2), time exceeded (3), parameter problem (4) and the other codes
// of 1 are DropICMPState (redirects are DropNDP).
const (
	icmpPortUnreach     = 3
	icmpHostProhibited  = 10
	icmpAdminProhibited = 13

	icmp6Unreach          = 1 // types
	icmp6PacketTooBig     = 2
	icmp6TimeExceeded     = 3
	icmp6ParamProblem     = 4
	icmp6AdminProhibited  = 1 // codes of icmp6Unreach
	icmp6PortUnreach      = 4
	nodeVethICMPStateBase = 0x10 // TableVethICMP: icmp_state drops, after the allowed errors
)

// icmpUnreachKey matches ICMP destination unreachable with code code.
func icmpUnreachKey(code uint8) nl.TcU32Key { return key(0, 0xffff0000, 3<<24|uint32(code)<<16) }

// icmpStateDrops are the nodes of TableVethICMP after the allowed errors:
// an allowed code that did not quote a plain TCP/UDP header sent to the
// host IP -> DropICMP (as before); every other destination unreachable,
// source quench, redirect, time exceeded and parameter problem ->
// DropICMPState. (An allowed error quoting another container's port is
// DropICMP too: the default of its link node.)
func (v VethFilters) icmpStateDrops() []node {
	h := func(id uint32) uint32 { return MakeU32Handle(TableVethICMP, 0, id) }
	var ns []node
	for i, c := range []uint8{icmpPortUnreach, icmpAdminProhibited, icmpHostProhibited} {
		ns = append(ns, v.drop(node{prio: PrioIP, handle: h(9 + uint32(i)), sel: sel(0, icmpUnreachKey(c)), kind: KindICMP}, DropICMP))
	}
	for i, t := range []uint8{3, 4, 5, 11, 12} {
		ns = append(ns, v.drop(node{prio: PrioIP, handle: h(nodeVethICMPStateBase + uint32(i)),
			sel: sel(0, icmpTypeKey(t)), kind: KindICMP}, DropICMPState))
	}
	return ns
}

// icmp6UnreachKey matches ICMPv6 destination unreachable with code code.
func icmp6UnreachKey(code uint8) nl.TcU32Key {
	return key(0, 0xffff0000, icmp6Unreach<<24|uint32(code)<<16)
}

// icmp6StateDrops are the nodes of TableVeth6ICMP after the allowed
// errors (handles 0x10..0x2f and 0x80..0x9f, by host address): an allowed code not about
// an own flow -> DropICMP; every other error type (1..4) -> DropICMPState.
func (v VethFilters) icmp6StateDrops() []node {
	h := func(id uint32) uint32 { return MakeU32Handle(TableVeth6ICMP, 0, id) }
	var ns []node
	for i, c := range []uint8{icmp6PortUnreach, icmp6AdminProhibited} {
		ns = append(ns, v.drop(node{prio: PrioIP6, handle: h(0xa0 + uint32(i)), sel: sel(0, icmp6UnreachKey(c)), kind: KindICMP}, DropICMP))
	}
	for i, t := range []uint8{icmp6Unreach, icmp6PacketTooBig, icmp6TimeExceeded, icmp6ParamProblem} {
		ns = append(ns, v.drop(node{prio: PrioIP6, handle: h(0xa2 + uint32(i)),
			sel: sel(0, key(0, 0xff000000, uint32(t)<<24)), kind: KindICMP}, DropICMPState))
	}
	return ns
}
