package tcfilter

// The IPv6 classifier of a host demux (PrioIP6): root nodes per host
// address match TCP, UDP (transport header right after the fixed 40 bytes)
// and ICMPv6, eat 40 and link into the IPv4 classifier's port tables, so
// one set of per-container nodes serves both families. Packets with
// extension headers stay with the host, counted on eth0 by a mirror to
// the sink (IPv6ToHost). ICMPv6 errors go by quoted source port through
// TablePort; echo replies by identifier. docs/datapath.md, "IPv6".

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// IPv6Demux is the IPv6 part of a host demux (see "IPv6" in docs/datapath.md).
type IPv6Demux struct {
	// Addrs are the host's IPv6 addresses (global and link-local) matched
	// as destination on eth0; ignored on lo, where every local TCP/UDP
	// packet is demultiplexed as for IPv4.
	Addrs []net.IP
	// Sink, when not 0, is the drop sink: a packet for a host address
	// that the demux does not look into (extension headers, fragments,
	// other next headers) is counted by a mirror to it before it goes on
	// to the host stack (the mirror's copy is dropped there).
	Sink int
}

// Root node ids of the host demux's IPv6 classifier: per host address i
// (eth0) TCP 1+3i, UDP 2+3i, ICMPv6 3+3i (on lo only TCP 1 and UDP 2
// without an address); then the counting node of each address.
const (
	nodeRoot6Count = 0x100 // + address index: anything else to that address -> counted, host
)

// Node ids in TableICMP6.
const (
	nodeICMP6ErrTCP = 0x10 // error quoting TCP -> TablePort by quoted sport
	nodeICMP6ErrUDP = 0x11 // error quoting UDP -> TablePort by quoted sport
	nodeICMP6Echo   = 0x20 // echo reply -> TablePort by identifier
)

// SetIPv6 turns the IPv6 demux on (c != nil) or off (nil) and, if the
// demux is ready, makes the kernel match at once: the IPv6 classifier's
// root nodes link to the same port tables as IPv4, so every range,
// shared port and TablePort node serves both families without a node of
// its own. On eth0, c.Addrs must hold at least one address.
func (x *HostDemux) SetIPv6(c *IPv6Demux) error {
	if c != nil {
		if err := checkAddrs6(x.d.label, c.Addrs); err != nil {
			return err
		}
		if x.dst != nil && len(c.Addrs) == 0 {
			return fmt.Errorf("%s: IPv6 demux without a host IPv6 address", x.d.label)
		}
		cp := &IPv6Demux{Sink: c.Sink}
		for _, a := range c.Addrs {
			cp.Addrs = append(cp.Addrs, append(net.IP(nil), a.To16()...))
		}
		c = cp
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.ip6
	x.ip6 = c
	if !x.ready {
		return nil
	}
	if err := x.syncIPv6(); err != nil {
		x.ip6 = old
		return errors.Join(err, x.syncIPv6())
	}
	return nil
}

// syncIPv6 brings the IPv6 classifier in line with x.ip6 (x.mu held,
// demux ready).
func (x *HostDemux) syncIPv6() error {
	for _, t := range x.tables6() {
		if err := x.d.addTable(t.kind, t.prio, t.htid, t.divisor); err != nil {
			return err
		}
	}
	fs, err := x.d.list()
	if err != nil {
		return err
	}
	fs6 := prio6(fs)
	if err := syncFixed(nil, x.d, append(x.rootNodes6(), x.tableNodes6()...), fs6); err != nil {
		return err
	}
	if err := x.finish6(fs6); err != nil {
		return err
	}
	x.syncEcho6()
	return nil
}

func prio6(fs []*netlink.U32) []*netlink.U32 {
	var out []*netlink.U32
	for _, f := range fs {
		if f.Priority == PrioIP6 {
			out = append(out, f)
		}
	}
	return out
}

// finish6, after the root nodes are synced, deletes TableICMP6 nodes of
// another layout or, with IPv6 off, what is left of the IPv6 classifier:
// its table, then the priority. fs6 is the dump taken before the sync.
func (x *HostDemux) finish6(fs6 []*netlink.U32) error {
	if x.ip6 != nil {
		return x.pruneTable(fs6, PrioIP6, TableICMP6, x.tableNodes6())
	}
	if len(fs6) == 0 {
		return nil
	}
	if _, err := x.d.delTables([]tableRef{{KindICMP, PrioIP6, TableICMP6}}, tableBusyTimeout); err != nil {
		return err
	}
	return x.d.delPrio(KindIP, PrioIP6)
}

func (x *HostDemux) tables6() []tableSpec {
	if x.ip6 == nil || x.dst == nil {
		return nil
	}
	return []tableSpec{{KindICMP, PrioIP6, TableICMP6, 1}}
}

// rootNodes6 are the IPv6 classifier's root nodes. TCP and UDP with the
// transport header right after the fixed header skip it and link to L,
// the IPv4 port lookup; the link nodes are TERMINAL "stop" nodes, so a
// port nobody owns ends there (the host) and only what the demux does not
// look into reaches the counting node.
func (x *HostDemux) rootNodes6() []node {
	if x.ip6 == nil {
		return nil
	}
	l4 := func(id uint32, proto uint8, link uint32, dst []nl.TcU32Key) node {
		return node{prio: PrioIP6, handle: id, classid: ClassStop, link: link,
			sel: eat40(sel(nl.TC_U32_TERMINAL, append([]nl.TcU32Key{nextHdrKey(proto)}, dst...)...))}
	}
	if x.dst == nil {
		return append([]node{l4(1, ipprotoTCP, TableL, nil), l4(2, ipprotoUDP, TableL, nil)}, rootNodes6Frag(0, nil)...)
	}
	var ns []node
	for i, a := range x.ip6.Addrs {
		dst := addr6Keys(ip6Dst, a)
		base := uint32(1 + 3*i)
		ns = append(ns,
			l4(base, ipprotoTCP, TableL, dst),
			l4(base+1, ipprotoUDP, TableL, dst),
			withKind(l4(base+2, ipprotoICMPv6, TableICMP6, dst), KindICMP))
		ns = append(ns, rootNodes6Frag(i, a)...)
	}
	if x.ip6.Sink > 0 {
		for i, a := range x.ip6.Addrs {
			ns = append(ns, node{prio: PrioIP6, handle: nodeRoot6Count + uint32(i), classid: ClassStop,
				sel: sel(nl.TC_U32_TERMINAL, addr6Keys(ip6Dst, a)...), act: actMirror, target: x.ip6.Sink})
		}
	}
	return ns
}

func withKind(n node, kind string) node {
	n.kind = kind
	return n
}

// tableNodes6 are the nodes of TableICMP6 (eth0; offsets from the ICMPv6
// header). Errors quote the offending packet's IPv6 header at +8 and, when
// its transport header follows the fixed header, its ports at +48: the
// quoted source port is the sender's, so TablePort (keyed on the high
// half of the word) finds the container that sent it. Echo replies go by
// identifier (+4) to the container owning it as a port (ping sockets bind
// one), else stay with the host. Everything else (echo requests, neighbour
// discovery, router advertisements, MLD) matches nothing here and stays
// with the host: the root node is a TERMINAL "stop" node.
func (x *HostDemux) tableNodes6() []node {
	if x.ip6 == nil || x.dst == nil {
		return nil
	}
	mk := func(id uint32, s *nl.TcU32Sel, link uint32) node {
		n := node{prio: PrioIP6, handle: MakeU32Handle(TableICMP6, 0, id), sel: s, link: link, kind: KindICMP}
		if s.Flags&nl.TC_U32_TERMINAL != 0 {
			n.classid = ClassStop
		}
		return n
	}
	quoted := func(p uint8) []nl.TcU32Key {
		return []nl.TcU32Key{icmp6ErrorKey(), key(8, 0xf0000000, 0x60000000), key(8+4, 0x0000ff00, uint32(p)<<8)}
	}
	return []node{
		mk(nodeICMP6ErrTCP, toPorts(sel(nl.TC_U32_TERMINAL, quoted(ipprotoTCP)...), 8+ip6HeaderLen), TablePort),
		mk(nodeICMP6ErrUDP, toPorts(sel(nl.TC_U32_TERMINAL, quoted(ipprotoUDP)...), 8+ip6HeaderLen), TablePort),
		mk(nodeICMP6Echo, toPorts(sel(nl.TC_U32_TERMINAL, icmp6TypeKey(icmp6EchoReply)), icmpEchoID), TablePort),
	}
}

// IPv6ToHost reads how many IPv6 packets for the host's addresses the
// demux passed to the host without looking at their ports (extension
// headers, fragments, other next headers): the counting nodes' mirror
// counters (0 without a sink).
func (x *HostDemux) IPv6ToHost() (uint64, error) {
	fs, err := x.d.list()
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, f := range fs {
		if _, _, nid := SplitU32Handle(f.Handle); f.Priority != PrioIP6 || nid < nodeRoot6Count || nid >= nodeRoot6Count+MaxHostAddrs6 {
			continue
		}
		for _, a := range f.Actions {
			if s := a.Attrs().Statistics; s != nil && s.Basic != nil {
				n += uint64(s.Basic.Packets)
			}
		}
	}
	return n, nil
}
