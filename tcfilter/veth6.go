package tcfilter

// The veth's IPv6 classifier (only with host IPv6 addresses; without,
// IPv6 falls to the catch-all, DropEthertype): source a host address (or
// ::1 to ::1), TCP/UDP from owned ports through the IPv4 classifier's
// port tables, ICMPv6 echo and errors about the container's own flows,
// neighbour discovery only in the host's name (else DropNDP), extension
// headers dropped (DropIPv6Ext) except the container kernel's MLD reports
// (DropMLD, mld6.go), fragments like IPv4's. docs/datapath.md,
// "Host-side veth ingress, IPv6".

import (
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Root node ids of the veth's IPv6 classifier: 1+i for host address i,
// then the loopback node and the drops.
const (
	nodeVeth6Loop   = 0x40
	nodeVeth6Source = 0x41
	nodeVeth6Header = 0x42
	nodeVeth6VLAN   = 0x43
	nodeVeth6MAC    = 0x44
)

// vethTables6 are the IPv6 classifier's fixed tables (divisor 1).
var vethTables6 = []tableSpec{
	{KindIP, PrioIP6, TableVeth6Host, 1},
	{KindIP, PrioIP6, TableVeth6Loop, 1},
	{KindICMP, PrioIP6, TableVeth6ICMP, 1},
}

// ip6Nodes are the fixed nodes of the veth's IPv6 classifier (none
// without host IPv6 addresses: IPv6 then falls to PrioVethOther and is
// dropped as DropEthertype). TCP and UDP link into the IPv4 classifier's
// source-port tables, ICMPv6 errors into its quoted-port table, so the
// container's ranges need no IPv6 node of their own. See "Host-side veth
// ingress, IPv6" in docs/datapath.md.
func (v VethFilters) ip6Nodes() []node {
	if len(v.HostIP6) == 0 {
		return nil
	}
	c := ClassID(v.Slot)
	mac := macKeys(v.MAC)
	v6 := []nl.TcU32Key{version6Key()}
	h := func(t, id uint32) uint32 { return MakeU32Handle(t, 0, id) }
	link := func(handle uint32, s *nl.TcU32Sel, t uint32) node {
		return node{prio: PrioIP6, handle: handle, sel: s, link: t}
	}
	drop := func(handle uint32, s *nl.TcU32Sel, reason string) node {
		return v.drop(node{prio: PrioIP6, handle: handle, sel: s}, reason)
	}
	out := func(handle uint32, ks ...nl.TcU32Key) node {
		return node{prio: PrioIP6, handle: handle, classid: c, sel: sel(nl.TC_U32_TERMINAL, ks...),
			act: actRedirect, target: v.out(), kind: KindICMP}
	}
	l4 := func(proto uint8, extra ...nl.TcU32Key) *nl.TcU32Sel {
		return eat40(sel(0, append([]nl.TcU32Key{nextHdrKey(proto)}, extra...)...))
	}
	var ns []node
	// root: host MAC, version 6, source a host address (or ::1 to ::1)
	for i, a := range v.HostIP6 {
		ns = append(ns, v.drop(link(uint32(1+i), sel(0, keys(mac, v6, addr6Keys(ip6Src, a))...), TableVeth6Host), DropProtocol))
	}
	lb := net.IPv6loopback
	ns = append(ns,
		v.drop(link(nodeVeth6Loop, sel(0, keys(mac, v6, addr6Keys(ip6Src, lb), addr6Keys(ip6Dst, lb))...), TableVeth6Loop), DropProtocol),
		drop(nodeVeth6Source, sel(0, keys(mac, v6)...), DropSource),
		drop(nodeVeth6Header, sel(0, mac...), DropIPHeader),
		drop(nodeVeth6VLAN, sel(0, macKeys(VLANMarkMAC)...), DropVLAN),
		drop(nodeVeth6MAC, sel(0), DropMAC),
	)
	ns = append(ns, v.mldNodes(mac, v6)...)
	// extension headers other than a fragment header
	extDrops := func(t uint32) {
		for j, e := range ip6ExtHeaders {
			if e != unix.IPPROTO_FRAGMENT {
				ns = append(ns, drop(h(t, 0x90+uint32(j)), sel(0, nextHdrKey(e)), DropIPv6Ext))
			}
		}
	}
	// Fragments (a fragment header right after the fixed header): a
	// first fragment whose transport header follows the fragment header
	// is checked as if unfragmented (eat 48); a first fragment of
	// anything else is dropped; later fragments carry no ports and go by
	// destination (their first passed the check, or nothing can
	// reassemble them; a later one cannot rewrite the ports, which lie in
	// the first 8 bytes, and IPv6 receivers drop overlapping fragments).
	// A first fragment too short to hold the ports makes u32 give up on
	// the classifier: it falls to the catch-all (DropEthertype).
	frag := func(first bool, p uint8, extra ...nl.TcU32Key) *nl.TcU32Sel {
		ks := []nl.TcU32Key{nextHdrKey(unix.IPPROTO_FRAGMENT)}
		switch {
		case first && p != 0:
			ks = append(ks, key(ip6HeaderLen, 0xff00fff8, uint32(p)<<24))
		case first:
			ks = append(ks, key(ip6HeaderLen, 0x0000fff8, 0))
		}
		return sel(0, append(ks, extra...)...)
	}
	fragNodes := func(t uint32, local []net.IP, lo bool) {
		for i, a := range local {
			dst := addr6Keys(ip6Dst, a)
			ns = append(ns,
				v.drop(link(h(t, 0x100+2*uint32(i)), fixedOffsetEat(frag(true, ipprotoTCP, dst...), ip6HeaderLen+8), vethLocal.hashTable), DropPort),
				v.drop(link(h(t, 0x101+2*uint32(i)), fixedOffsetEat(frag(true, ipprotoUDP, dst...), ip6HeaderLen+8), vethLocal.hashTable), DropPort))
		}
		restTarget := v.out()
		if lo {
			// first fragments to ::1: the loopback ports (loopback.go)
			restTarget = v.local()
			ns = append(ns,
				v.toLoopPorts(PrioIP6, h(t, 0x140), fixedOffsetEat(frag(true, ipprotoTCP), ip6HeaderLen+8)),
				v.toLoopPorts(PrioIP6, h(t, 0x141), fixedOffsetEat(frag(true, ipprotoUDP), ip6HeaderLen+8)))
		} else {
			ns = append(ns,
				v.drop(link(h(t, 0x140), fixedOffsetEat(frag(true, ipprotoTCP), ip6HeaderLen+8), vethOut.hashTable), DropPort),
				v.drop(link(h(t, 0x141), fixedOffsetEat(frag(true, ipprotoUDP), ip6HeaderLen+8), vethOut.hashTable), DropPort))
		}
		if !lo {
			ns = append(ns, v.drop(node{prio: PrioIP6, handle: h(t, 0x142), link: TableVeth6ICMP, kind: KindICMP,
				sel: fixedOffsetEat(frag(true, ipprotoICMPv6), ip6HeaderLen+8)}, DropICMP))
		}
		ns = append(ns, drop(h(t, 0x143), frag(true, 0), DropIPv6Ext))
		for i, a := range local {
			ns = append(ns, node{prio: PrioIP6, handle: h(t, 0x150+uint32(i)), classid: c,
				sel: sel(nl.TC_U32_TERMINAL, frag(false, 0, addr6Keys(ip6Dst, a)...).Keys...), act: actRedirect, target: v.local()})
		}
		ns = append(ns, node{prio: PrioIP6, handle: h(t, 0x160), classid: c,
			sel: sel(nl.TC_U32_TERMINAL, frag(false, 0).Keys...), act: actRedirect, target: restTarget})
	}
	// source = a host address: TCP/UDP to a host address -> host lo,
	// elsewhere -> eth0, by owned source port; ICMPv6 by type
	for i, a := range v.HostIP6 {
		dst := addr6Keys(ip6Dst, a)
		ns = append(ns,
			v.drop(link(h(TableVeth6Host, 0x10+2*uint32(i)), l4(ipprotoTCP, dst...), vethLocal.hashTable), DropPort),
			v.drop(link(h(TableVeth6Host, 0x11+2*uint32(i)), l4(ipprotoUDP, dst...), vethLocal.hashTable), DropPort))
	}
	ns = append(ns,
		v.drop(link(h(TableVeth6Host, 0x80), l4(ipprotoTCP), vethOut.hashTable), DropPort),
		v.drop(link(h(TableVeth6Host, 0x81), l4(ipprotoUDP), vethOut.hashTable), DropPort),
		v.drop(node{prio: PrioIP6, handle: h(TableVeth6Host, 0x82), sel: l4(ipprotoICMPv6), link: TableVeth6ICMP, kind: KindICMP}, DropICMP),
	)
	extDrops(TableVeth6Host)
	fragNodes(TableVeth6Host, v.HostIP6, false)
	// ::1 to ::1: TCP and UDP to an allowed destination port
	// (loopback.go), then host lo
	ns = append(ns,
		v.toLoopPorts(PrioIP6, h(TableVeth6Loop, 1), l4(ipprotoTCP)),
		v.toLoopPorts(PrioIP6, h(TableVeth6Loop, 2), l4(ipprotoUDP)),
	)
	extDrops(TableVeth6Loop)
	fragNodes(TableVeth6Loop, nil, true)

	// ICMPv6 (offsets from the ICMPv6 header, 40 bytes after the IPv6
	// header: the payload length is at -36)
	plen := func(n uint16) nl.TcU32Key { return key(4-ip6HeaderLen, 0xffff0000, uint32(n)<<16) }
	lladdr := func(opt uint8) []nl.TcU32Key { // option at +24: type, length 1 (8 bytes), the host MAC
		return []nl.TcU32Key{
			key(24, 0xffffffff, uint32(opt)<<24|1<<16|uint32(v.MAC[0])<<8|uint32(v.MAC[1])),
			key(28, 0xffffffff, uint32(v.MAC[2])<<24|uint32(v.MAC[3])<<16|uint32(v.MAC[4])<<8|uint32(v.MAC[5])),
		}
	}
	ns = append(ns,
		out(h(TableVeth6ICMP, 1), icmp6TypeKey(icmp6EchoRequest)),
		out(h(TableVeth6ICMP, 2), icmp6TypeKey(icmp6EchoReply)),
		// neighbour solicitations (the source is a host address, checked
		// at the root): no option, or the host MAC as source link-layer
		// address
		out(h(TableVeth6ICMP, 0x40), icmp6TypeKey(icmp6NS), plen(24)),
		out(h(TableVeth6ICMP, 0x41), keys([]nl.TcU32Key{icmp6TypeKey(icmp6NS), plen(32)}, lladdr(1))...),
	)
	for i, a := range v.HostIP6 {
		// an error about a packet sent to host address a: the quoted
		// IPv6 header at +8 (version, next header at +12, destination at
		// +32), its ports at +48; on to the quoted destination port lookup
		// with a code an end host sends about its own sockets
		// (icmpstate.go): port unreachable (0x10..), administratively
		// prohibited (0x80..)
		for _, e := range []struct {
			base uint32
			code uint8
		}{{0x10, icmp6PortUnreach}, {0x80, icmp6AdminProhibited}} {
			base, code := e.base, e.code
			for k, p := range []uint8{ipprotoTCP, ipprotoUDP} {
				s := fixedOffsetEat(sel(0, keys([]nl.TcU32Key{icmp6UnreachKey(code), key(8, 0xf0000000, 0x60000000),
					key(8+4, 0x0000ff00, uint32(p)<<8)}, addr6Keys(8+ip6Dst, a))...), 8+ip6HeaderLen)
				ns = append(ns, v.drop(node{prio: PrioIP6, handle: h(TableVeth6ICMP, base+2*uint32(i)+uint32(k)), sel: s,
					link: vethErr.hashTable, kind: KindICMP}, DropICMP))
			}
		}
		// neighbour advertisements for a host address only (target at
		// +8), with no option or the host MAC as target link-layer address
		tgt := addr6Keys(8, a)
		ns = append(ns,
			out(h(TableVeth6ICMP, 0x50+2*uint32(i)), keys([]nl.TcU32Key{icmp6TypeKey(icmp6NA), plen(24)}, tgt)...),
			out(h(TableVeth6ICMP, 0x51+2*uint32(i)), keys([]nl.TcU32Key{icmp6TypeKey(icmp6NA), plen(32)}, tgt, lladdr(2))...))
	}
	// every other neighbour discovery message (router solicitations and
	// advertisements, redirects, forged solicitations and advertisements)
	for j, t := range []uint8{icmp6RS, icmp6RA, icmp6NS, icmp6NA, icmp6Redirect} {
		ns = append(ns, v.drop(node{prio: PrioIP6, handle: h(TableVeth6ICMP, 0x70+uint32(j)),
			sel: sel(0, key(0, 0xff000000, uint32(t)<<24)), kind: KindICMP}, DropNDP))
	}
	return append(ns, v.icmp6StateDrops()...)
}

// addTables6 adds to b the creation of the IPv6 classifier's tables
// (existing ones are fine); none without host IPv6 addresses.
func (v VethFilters) addTables6(b *batch, d dev) {
	if len(v.HostIP6) > 0 {
		b.addTables(d, vethTables6)
	}
}

// clear6 removes the IPv6 classifier of a veth whose filters no longer
// have host IPv6 addresses (syncFixed deleted its root nodes): its tables,
// then the priority. fs is the dump taken before syncFixed.
func (v VethFilters) clear6(d dev, fs []*netlink.U32) error {
	if len(v.HostIP6) > 0 || !slices.ContainsFunc(fs, func(f *netlink.U32) bool { return f.Priority == PrioIP6 }) {
		return nil
	}
	var ts []tableRef
	for _, t := range vethTables6 {
		ts = append(ts, tableRef{t.kind, t.prio, t.htid})
	}
	if _, err := d.delTables(ts, tableBusyTimeout); err != nil {
		return err
	}
	return d.delPrio(KindIP, PrioIP6)
}
