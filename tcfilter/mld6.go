package tcfilter

import (
	"net"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// MLD (multicast listener discovery) messages a container's kernel sends
// on its own: when eth0 comes up it reports membership of the
// solicited-node groups of its addresses (addrconf_join_solicit), and it
// reports leaving them. The one switch that would stop them at the source
// (IFF_NOARP on eth0, which skips the solicited-node groups) also stops
// ARP and neighbour discovery, so the container could no longer resolve a
// neighbour neighsync has not copied, nor receive solicitations for its
// addresses. They are dropped on the veth under DropMLD instead: expected
// noise, not an attack (they would tell switches on the link that the
// host listens to groups it never joined).
//
// Only the exact form the kernel sends matches (mld_newpack, igmp6_send):
// hop limit 1, a hop-by-hop header right after the fixed header and
// nothing else in it but a router alert for MLD (value 0) and a 2-byte
// PadN, ICMPv6 type 131 (report), 132 (done) or 143 (version 2 report)
// with code 0 after it, source a link-local host address or ::,
// destination in ff02::/16. Any other hop-by-hop header stays DropIPv6Ext
// (and a forged source DropSource).

// MLD message types (ICMPv6).
const (
	icmp6MLDReport   = 131
	icmp6MLDDone     = 132
	icmp6MLDv2Report = 143
)

// Root node ids of the veth's IPv6 classifier for MLD from :: (before
// nodeVeth6Source, after the host addresses' nodes 1..MaxHostAddrs6).
const nodeVeth6MLDUnspec = 0x38

// Node ids in TableVeth6Host for MLD from a link-local host address
// (before the extension header drops at 0x90).
const nodeVeth6MLDHost = 0x88

// mldKeys match an MLD message of type t from the start of the IPv6
// header (the source is matched by the caller).
func mldKeys(t uint8) []nl.TcU32Key {
	return []nl.TcU32Key{
		key(4, 0x0000ffff, uint32(unix.IPPROTO_HOPOPTS)<<8|1),   // next header hop-by-hop, hop limit 1
		key(ip6Dst, 0xffff0000, 0xff020000),                     // ff02::/16
		key(ip6HeaderLen, 0xffffffff, ipprotoICMPv6<<24|0x0502), // ICMPv6 next, 8 bytes, router alert (5), length 2
		key(ip6HeaderLen+4, 0xffffffff, 0x0000_0100),            // MLD (0), PadN (1) of length 0
		key(ip6HeaderLen+8, 0xffff0000, uint32(t)<<24),          // type, code 0
	}
}

var mldTypes = []uint8{icmp6MLDReport, icmp6MLDDone, icmp6MLDv2Report}

// mldNodes are the veth's MLD drops: from :: at the root (mac: the host
// MAC keys, v6: the version key), from a link-local host address in
// TableVeth6Host (the root matched the source against the host addresses).
func (v VethFilters) mldNodes(mac, v6 []nl.TcU32Key) []node {
	var ns []node
	unspec := addr6Keys(ip6Src, net.IPv6unspecified)
	linkLocal := []nl.TcU32Key{key(ip6Src, 0xffc00000, 0xfe800000)} // fe80::/10
	for i, t := range mldTypes {
		ns = append(ns,
			v.drop(node{prio: PrioIP6, handle: nodeVeth6MLDUnspec + uint32(i), sel: sel(0, keys(mac, v6, unspec, mldKeys(t))...)}, DropMLD),
			v.drop(node{prio: PrioIP6, handle: MakeU32Handle(TableVeth6Host, 0, nodeVeth6MLDHost+uint32(i)),
				sel: sel(0, keys(linkLocal, mldKeys(t))...)}, DropMLD))
	}
	return ns
}
