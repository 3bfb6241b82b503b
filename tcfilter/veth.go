package tcfilter

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/isolatord/isolatord/ephemeral"
)

// portTable is a two-level port lookup behind an IHL eat: hashTable
// (divisor 1) holds one match-all node that hashes the port's high byte
// into table (divisor 256), whose buckets hold one node per aligned range
// (node id RangeNodeID, one node per 256-port chunk for big ranges).
type portTable struct {
	hashTable, table uint32
	sport            bool // key on the source port (else the destination port)
}

func (p portTable) tables() []tableSpec {
	return []tableSpec{{KindIP, PrioIP, p.hashTable, 1}, {KindIP, PrioIP, p.table, 256}}
}

func (p portTable) linkNode() node {
	hmask := uint32(0x0000ff00)
	if p.sport {
		hmask = 0xff000000
	}
	return node{prio: PrioIP, handle: MakeU32Handle(p.hashTable, 0, 1), link: p.table, sel: hashOn(sel(0), 0, hmask)}
}

func (p portTable) nodes(r ephemeral.Range, classid uint32, act, target int) []node {
	k := dportKey(r)
	if p.sport {
		k = sportKey(r)
	}
	id := RangeNodeID(r)
	var ns []node
	for c := uint32(r.Begin >> 8); c <= uint32(r.End>>8); c++ {
		ns = append(ns, node{prio: PrioIP, handle: MakeU32Handle(p.table, c, id), classid: classid,
			sel: sel(nl.TC_U32_TERMINAL, k), act: act, target: target})
	}
	return ns
}

// rangeDiff returns the ranges of b that are not in a.
func rangeDiff(b, a []ephemeral.Range) []ephemeral.Range {
	var out []ephemeral.Range
	for _, r := range b {
		found := false
		for _, o := range a {
			if o == r {
				found = true
				break
			}
		}
		if !found {
			out = append(out, r)
		}
	}
	return out
}

// rangeSet is a set of per-range nodes on one device that can be changed
// transactionally.
type rangeSet struct {
	d     dev
	c     *Conn // batches (nil: one request at a time)
	nodes func(r ephemeral.Range) []node
}

// apply adds the nodes of add (create or replace: their keys follow from
// their handles), removing them all again if one fails, then deletes the
// nodes of del (missing ones are fine).
func (s rangeSet) apply(add, del []ephemeral.Range) error {
	b := batch{c: s.c}
	var (
		ns []node
		of []ephemeral.Range
	)
	for _, r := range add {
		for _, n := range s.nodes(r) {
			b.replace(s.d, KindIP, n)
			ns, of = append(ns, n), append(of, r)
		}
	}
	res, err := b.run()
	if err != nil {
		var errs []error
		for _, x := range res {
			if x.err != nil {
				errs = append(errs, fmt.Errorf("range %s: %w", of[x.i], x.err))
			} else {
				b.del(s.d, KindIP, PrioIP, ns[x.i].handle, true)
			}
		}
		if _, rerr := b.run(); rerr != nil {
			errs = append(errs, fmt.Errorf("rollback: %w", rerr))
		}
		return errors.Join(errs...)
	}
	for _, r := range del {
		for _, n := range s.nodes(r) {
			b.del(s.d, KindIP, PrioIP, n.handle, true)
		}
	}
	_, err = b.run()
	return err
}

// VethFilters are the filters on the ingress of a container's host-side
// veth: what the container sends. They let out only what a host process
// owning exactly the container's ports could send (see "Host-side veth
// ingress" in the package documentation); everything else is redirected to
// the drop sink of a reason by a node that names the reason (Drop*), and
// counted there per veth.
// TCP and UDP from owned source ports go to host lo when the destination is
// local (host IP or 127.0.0.0/8) and out through host eth0 otherwise; ARP
// requests, echo requests/replies and ICMP errors about the container's own
// flows go out through eth0; non-first fragments go by destination.
//
// With Via set (a container with an egress limit), every redirect that is
// not a drop, ARP included, goes to Via, the entry of the container's
// egress shaper, instead of host eth0 or lo; the shaper's exit (ShaperExit)
// then forwards by destination the way these filters would have.
type VethFilters struct {
	H      *netlink.Handle // host namespace
	Veth   int             // host-side veth ifindex
	Eth0   int             // host eth0 ifindex
	Lo     int             // host lo ifindex
	Via    int             // egress shaper entry ifindex; 0: none (straight to eth0/lo)
	Sinks  *DropSinks      // the host's drop sinks (EnsureDropSinks)
	VLAN   bool            // attach the cls_bpf VLAN check (the kernel loads our programs)
	HostIP net.IP
	// HostIP6 are the host's IPv6 addresses (global and link-local) a
	// container may send from (veth6.go); none: the container's IPv6 is
	// dropped (DropEthertype).
	HostIP6 []net.IP
	MAC     net.HardwareAddr // the host MAC (every frame's source)
	// LoopPorts are the aligned ranges of destination ports the container
	// may reach on 127.0.0.0/8 and ::1 (LoopPortRanges; loopback.go):
	// TCP/UDP there to any other port is dropped as DropLoopback.
	LoopPorts []ephemeral.Range
	Slot      uint16
	Obs       Observer
	// New: the veth was just created and has no filters; Install then
	// reads none back (each dump waits for rtnl) and sends all of them in
	// one batch.
	New bool
	// C sends the requests in batches (a Conn of the host namespace);
	// nil: one at a time through H.
	C *Conn
}

// out and local are the redirect targets of IP packets that leave the
// host and of those for the host itself (or another container).
func (v VethFilters) out() int {
	if v.Via != 0 {
		return v.Via
	}
	return v.Eth0
}

func (v VethFilters) local() int {
	if v.Via != 0 {
		return v.Via
	}
	return v.Lo
}

var (
	vethLocal = portTable{hashTable: TableVethLocalHash, table: TableVethLocal, sport: true}
	vethOut   = portTable{hashTable: TableVethOutHash, table: TableVethOut, sport: true}
	vethErr   = portTable{hashTable: TableVethErrHash, table: TableVethErr}
)

// vethTables are the veth's fixed tables (divisor 1), by priority.
var vethTables = []tableSpec{
	{KindIP, PrioIP, TableVethHost, 1},
	{KindIP, PrioIP, TableVethLoop, 1},
	{KindICMP, PrioIP, TableVethICMP, 1},
	{KindIP, PrioIP, TableVethFrag, 1},
	{KindIP, PrioIP, TableVethLoopPort, 1},
}

func (v VethFilters) dev() dev { return dev{h: v.H, ifindex: v.Veth, label: "veth", obs: v.Obs} }

func (v VethFilters) check() error {
	if err := checkSlot(v.Slot); err != nil {
		return err
	}
	if v.HostIP.To4() == nil {
		return fmt.Errorf("veth filters: host IP %v is not IPv4", v.HostIP)
	}
	if len(v.MAC) != 6 {
		return fmt.Errorf("veth filters: host MAC %v is not an Ethernet address", v.MAC)
	}
	if err := checkAddrs6("veth filters", v.HostIP6); err != nil {
		return err
	}
	if v.Veth <= 0 || v.Eth0 <= 0 || v.Lo <= 0 || v.Via < 0 {
		return fmt.Errorf("veth filters: ifindexes veth=%d eth0=%d lo=%d via=%d must be positive", v.Veth, v.Eth0, v.Lo, v.Via)
	}
	if v.Sinks == nil {
		return errors.New("veth filters: no drop sinks")
	}
	return v.checkLoopPorts()
}

// withKinds labels the metrics kind of nodes that have none: ip (arp in
// the ARP priorities).
func withKinds(ns []node) []node {
	for i := range ns {
		if ns[i].kind == "" {
			ns[i].kind = KindIP
			if ns[i].prio == PrioARP || ns[i].prio == PrioVethARP {
				ns[i].kind = KindARP
			}
		}
	}
	return ns
}

// macKeys match the Ethernet source address (the MAC header lies before
// the network header: the source at -8..-3, the ethertype at -2..-1).
func macKeys(mac net.HardwareAddr) []nl.TcU32Key {
	return []nl.TcU32Key{
		key(-8, 0xffffffff, uint32(mac[0])<<24|uint32(mac[1])<<16|uint32(mac[2])<<8|uint32(mac[3])),
		key(-4, 0xffff0000, uint32(mac[4])<<24|uint32(mac[5])<<16),
	}
}

func plainIPv4Key() nl.TcU32Key              { return key(0, 0xff000000, 0x45000000) } // version 4, IHL 5
func srcKey(ip net.IP) nl.TcU32Key           { return key(12, 0xffffffff, ip4(ip)) }
func srcLoopbackKey() nl.TcU32Key            { return key(12, 0xff000000, 0x7f000000) }
func keys(ks ...[]nl.TcU32Key) []nl.TcU32Key { return slices.Concat(ks...) }

// fixedOffsetEat makes s move the current offset by off bytes (a multiple
// of 4) for the table it links to.
func fixedOffsetEat(s *nl.TcU32Sel, off uint16) *nl.TcU32Sel {
	s.Flags |= nl.TC_U32_OFFSET | nl.TC_U32_EAT
	s.Off = off
	return s
}

// drop is a terminal node (or the default of a terminal link node) that
// redirects to the sink of reason, through the host's action of reason.
func (v VethFilters) drop(n node, reason string) node {
	n.sel.Flags |= nl.TC_U32_TERMINAL
	n.act, n.target, n.reason = actRedirect, v.Sinks.Index(reason), reason
	n.index = hostDropIndex(slices.Index(DropReasons, reason))
	if n.classid == 0 {
		n.classid = ClassID(v.Slot)
	}
	return n
}

// fixedNodes are every node of the veth that does not depend on the
// container's ports: the root nodes of the IP, ARP and catch-all
// priorities, the nodes of the divisor-1 tables and the port tables' hash
// nodes. Root nodes (table id 0) are matched by node id.
func (v VethFilters) fixedNodes() []node {
	c := ClassID(v.Slot)
	mac := macKeys(v.MAC)
	hip := dstKey(v.HostIP)
	hostIP := v.HostIP.To4()
	h := func(t, id uint32) uint32 { return MakeU32Handle(t, 0, id) }
	l4 := func(proto uint8, extra ...nl.TcU32Key) *nl.TcU32Sel {
		return eatIHL(sel(0, append([]nl.TcU32Key{protoKey(proto), firstFragKey()}, extra...)...))
	}
	to := func(prio uint16, handle uint32, s *nl.TcU32Sel, target int) node {
		s.Flags |= nl.TC_U32_TERMINAL
		return node{prio: prio, handle: handle, classid: c, sel: s, act: actRedirect, target: target}
	}
	link := func(handle uint32, s *nl.TcU32Sel, t uint32) node {
		return node{prio: PrioIP, handle: handle, sel: s, link: t}
	}
	// An ICMP error quoting a TCP or UDP packet (inner IHL 5) sent to the
	// host IP: the quoted header starts 8 bytes into the ICMP message, its
	// protocol byte is at 8+9, its destination at 8+16; eating 28 bytes
	// puts the quoted ports at offset 0 for the port lookup.
	icmpErr := func(id uint32, code, proto uint8) node {
		s := fixedOffsetEat(sel(0, icmpUnreachKey(code), key(8, 0xff000000, 0x45000000),
			key(16, 0x00ff0000, uint32(proto)<<16), key(24, 0xffffffff, ip4(hostIP))), 28)
		return v.drop(node{prio: PrioIP, handle: h(TableVethICMP, id), sel: s, link: vethErr.hashTable, kind: KindICMP}, DropICMP)
	}
	arpReq := sel(0, keys(mac, []nl.TcU32Key{
		key(0, 0xffffffff, 0x00010800), // Ethernet, IPv4
		key(4, 0xffffffff, 0x06040001), // 6, 4, request
		key(8, 0xffffffff, uint32(v.MAC[0])<<24|uint32(v.MAC[1])<<16|uint32(v.MAC[2])<<8|uint32(v.MAC[3])),
		key(12, 0xffffffff, uint32(v.MAC[4])<<24|uint32(v.MAC[5])<<16|uint32(hostIP[0])<<8|uint32(hostIP[1])),
		key(16, 0xffff0000, uint32(hostIP[2])<<24|uint32(hostIP[3])<<16),
	})...)
	return withKinds(slices.Concat([]node{
		// root of the IP priority
		v.drop(link(1, sel(0, keys(mac, []nl.TcU32Key{plainIPv4Key(), srcKey(v.HostIP)})...), TableVethHost), DropProtocol),
		v.drop(link(2, sel(0, keys(mac, []nl.TcU32Key{plainIPv4Key(), srcLoopbackKey(), dstLoopbackKey()})...), TableVethLoop), DropProtocol),
		v.drop(node{prio: PrioIP, handle: 3, sel: sel(0, keys(mac, []nl.TcU32Key{plainIPv4Key()})...)}, DropSource),
		v.drop(node{prio: PrioIP, handle: 4, sel: sel(0, mac...)}, DropIPHeader),
		v.drop(node{prio: PrioIP, handle: 5, sel: sel(0, macKeys(VLANMarkMAC)...)}, DropVLAN),
		v.drop(node{prio: PrioIP, handle: 6, sel: sel(0)}, DropMAC),

		// source = host IP, by protocol
		v.drop(link(h(TableVethHost, 1), l4(ipprotoTCP, hip), vethLocal.hashTable), DropPort),
		v.drop(link(h(TableVethHost, 2), l4(ipprotoUDP, hip), vethLocal.hashTable), DropPort),
		v.toLoopPorts(PrioIP, h(TableVethHost, 3), l4(ipprotoTCP, dstLoopbackKey())),
		v.toLoopPorts(PrioIP, h(TableVethHost, 4), l4(ipprotoUDP, dstLoopbackKey())),
		v.drop(link(h(TableVethHost, 5), l4(ipprotoTCP), vethOut.hashTable), DropPort),
		v.drop(link(h(TableVethHost, 6), l4(ipprotoUDP), vethOut.hashTable), DropPort),
		v.drop(node{prio: PrioIP, handle: h(TableVethHost, 7), sel: l4(ipprotoICMP), link: TableVethICMP, kind: KindICMP}, DropICMP),
		// what is left of TCP, UDP and ICMP are non-first fragments
		link(h(TableVethHost, 8), sel(0, protoKey(ipprotoTCP)), TableVethFrag),
		link(h(TableVethHost, 9), sel(0, protoKey(ipprotoUDP)), TableVethFrag),
		link(h(TableVethHost, 10), sel(0, protoKey(ipprotoICMP)), TableVethFrag),

		// source and destination in 127.0.0.0/8: TCP and UDP to an
		// allowed destination port (loopback.go), then host lo
		v.toLoopPorts(PrioIP, h(TableVethLoop, 1), l4(ipprotoTCP)),
		v.toLoopPorts(PrioIP, h(TableVethLoop, 2), l4(ipprotoUDP)),
		link(h(TableVethLoop, 3), sel(0, protoKey(ipprotoTCP)), TableVethFrag),
		link(h(TableVethLoop, 4), sel(0, protoKey(ipprotoUDP)), TableVethFrag),

		// ICMP (offset: the ICMP header)
		{prio: PrioIP, handle: h(TableVethICMP, 1), classid: c, sel: sel(nl.TC_U32_TERMINAL, icmpTypeKey(8)), act: actRedirect, target: v.out(), kind: KindICMP},
		{prio: PrioIP, handle: h(TableVethICMP, 2), classid: c, sel: sel(nl.TC_U32_TERMINAL, icmpTypeKey(0)), act: actRedirect, target: v.out(), kind: KindICMP},
		// destination unreachable with a code an end host's stack or
		// firewall sends about its own sockets (icmpstate.go)
		icmpErr(3, icmpPortUnreach, ipprotoTCP),
		icmpErr(4, icmpPortUnreach, ipprotoUDP),
		icmpErr(5, icmpAdminProhibited, ipprotoTCP),
		icmpErr(6, icmpAdminProhibited, ipprotoUDP),
		icmpErr(7, icmpHostProhibited, ipprotoTCP),
		icmpErr(8, icmpHostProhibited, ipprotoUDP),
	}, v.icmpStateDrops(), v.loopPortNodes(), []node{
		// non-first fragments: they carry no ports
		to(PrioIP, h(TableVethFrag, 1), sel(0, hip), v.local()),
		to(PrioIP, h(TableVethFrag, 2), sel(0, dstLoopbackKey()), v.local()),
		to(PrioIP, h(TableVethFrag, 3), sel(0), v.out()),

		vethLocal.linkNode(), vethOut.linkNode(), vethErr.linkNode(),

		// ARP: requests in the host's name only (the host answers for its IP)
		to(PrioVethARP, nodeARPRoot, arpReq, v.out()),
		v.drop(node{prio: PrioVethARP, handle: 2, sel: sel(0, macKeys(VLANMarkMAC)...)}, DropVLAN),
		v.drop(node{prio: PrioVethARP, handle: 3, sel: sel(0)}, DropARP),

		// neither IPv4, ARP nor IPv6 (or too short to read)
		v.drop(node{prio: PrioVethOther, handle: 1, sel: sel(0, macKeys(VLANMarkMAC)...)}, DropVLAN),
		v.drop(node{prio: PrioVethOther, handle: 2, sel: sel(0)}, DropEthertype),
	}, v.ip6Nodes()))
}

func (v VethFilters) rangeSet() rangeSet {
	c := ClassID(v.Slot)
	return rangeSet{d: v.dev(), c: v.C, nodes: func(r ephemeral.Range) []node {
		return slices.Concat(vethLocal.nodes(r, c, actRedirect, v.local()), vethOut.nodes(r, c, actRedirect, v.out()),
			vethErr.nodes(r, c, actRedirect, v.out()))
	}}
}

// VethLayout numbers the layout of the veth filters Install builds. A
// data plane records it next to the veth (its alias) so that a restart can
// tell a veth that needs no upgrade without dumping its filters; bump it
// whenever Install would change an existing veth's nodes.
//
// Layout 4: redirects and drops share their mirred actions (actindex.go).
// Layout 5: drops go through the host's action of their reason to the
// reason's sink, counted in the sinks' map (dropsinks.go). Upgrading a
// veth of an older layout moves the counts of its old drop actions into
// the map.
//
// Layout 6: ICMP errors only with the codes an end host sends
// (icmpstate.go, DropICMPState); TCP/UDP to 127/8 and ::1 only to the
// loopback ports (loopback.go, DropLoopback).
const VethLayout = 6

// Install adds the ingress qdisc (EnsureIngress) and every veth filter for the container's
// ranges rs. Existing nodes are kept or updated, so it can be re-run (also
// on a veth of an older layout, which it brings up to date). On error the
// caller removes the veth, which removes all of it.
func (v VethFilters) Install(rs []ephemeral.Range) error {
	if err := v.check(); err != nil {
		return err
	}
	if err := checkRanges(rs); err != nil {
		return err
	}
	d := v.dev()
	if v.New {
		return v.installNew(d, rs)
	}
	// A veth with our nodes has its ingress (or, made by an older version, clsact) qdisc (checking costs a dump of
	// every qdisc of the host, which recovery must not pay per container).
	fs, err := d.list()
	fresh := err != nil || len(fs) == 0
	if fresh {
		if err := EnsureIngress(v.H, v.Veth); err != nil {
			return err
		}
	}
	if v.VLAN {
		// Older layouts had the ARP classifier at priority 1, where the
		// VLAN check goes now.
		if slices.ContainsFunc(fs, func(f *netlink.U32) bool { return f.Priority == PrioARP }) {
			if err := d.delPrio(KindARP, PrioARP); err != nil {
				return err
			}
		}
		attach := noVLANFilter.ensure
		if fresh {
			attach = noVLANFilter.attach
		}
		if err := attach(v.H, v.Veth); err != nil {
			return err
		}
	}
	b := batch{c: v.C}
	v.addTables(&b, d)
	if _, err := b.run(); err != nil {
		return err
	}
	if !fresh {
		if err := v.migrateOther(d); err != nil {
			return err
		}
	}
	// after migrateOther: an older layout's catch-all held PrioIP6
	v.addTables6(&b, d)
	if _, err := b.run(); err != nil {
		return err
	}
	if err := v.rangeSet().apply(rs, nil); err != nil {
		return err
	}
	// The range nodes just added lie in the port tables, which syncFixed
	// leaves alone: a veth without filters before has none of its nodes.
	if err == nil && len(fs) == 0 {
		fs = nil
	} else if fs, err = d.list(); err != nil {
		return err
	}
	if err := syncFixed(v.C, d, v.fixedNodes(), fs); err != nil {
		return err
	}
	b = batch{c: v.C}
	v.staleLoopPorts(&b, d, fs)
	if _, err := b.run(); err != nil {
		return err
	}
	return v.clear6(d, fs)
}

// addTables adds to b the creation of the veth's IPv4 tables (existing
// ones are fine): the port tables and the fixed tables.
func (v VethFilters) addTables(b *batch, d dev) {
	for _, p := range []portTable{vethLocal, vethOut, vethErr} {
		b.addTables(d, p.tables())
	}
	b.addTables(d, vethTables)
}

// installNew installs the filters of a veth created by the caller (no
// qdisc, no filter yet) in one batch, without reading anything back: the
// ingress qdisc, the VLAN check, the tables, the nodes of the ranges rs and
// the fixed nodes. On error the caller deletes the veth.
func (v VethFilters) installNew(d dev, rs []ephemeral.Range) error {
	b := batch{c: v.C}
	b.addIngress(d)
	if v.VLAN {
		if err := b.attachBPF(d, noVLANFilter); err != nil {
			return err
		}
	}
	v.addTables(&b, d)
	v.addTables6(&b, d)
	set := v.rangeSet()
	for _, r := range rs {
		for _, n := range set.nodes(r) {
			b.replace(d, KindIP, n)
		}
	}
	for _, n := range v.fixedNodes() {
		b.add(d, n.metricKind(), n)
	}
	_, err := b.run()
	return err
}

// SetRanges changes the container's ranges from old to new: it adds the
// new ones first (removing them again if one fails), then removes the old
// ones that are not in new, so traffic on ports in both never stops.
func (v VethFilters) SetRanges(old, new []ephemeral.Range) error {
	if err := v.check(); err != nil {
		return err
	}
	if err := checkRanges(new); err != nil {
		return err
	}
	for _, r := range old {
		if !r.IsAligned() {
			return fmt.Errorf("old range %s: %w", r, ErrNotAligned)
		}
	}
	return v.rangeSet().apply(rangeDiff(new, old), rangeDiff(old, new))
}

// Retarget points every redirect of the veth that is not a drop (its
// fixed nodes and the nodes of the container's ranges rs) where v says:
// host eth0/lo, or v.Via. It only replaces actions (FilterReplace keeps a
// node's keys and handle), so a packet is never unmatched: it takes the old
// path or the new one. Nodes already pointing right are left alone.
func (v VethFilters) Retarget(rs []ephemeral.Range) error {
	if err := v.check(); err != nil {
		return err
	}
	if err := checkRanges(rs); err != nil {
		return err
	}
	d := v.dev()
	fs, err := d.list()
	if err != nil {
		return err
	}
	have := map[nodeKey]*netlink.U32{}
	for _, f := range fs {
		have[keyOf(f)] = f
	}
	want := v.fixedNodes()
	for _, r := range rs {
		want = append(want, v.rangeSet().nodes(r)...)
	}
	var errs []error
	for _, n := range want {
		f, ok := have[nodeKey{n.prio, n.handle}]
		if n.act != actRedirect || n.reason != "" || !ok {
			continue
		}
		n.handle = f.Handle // a root node's table id is the kernel's 80x:
		if sameNode(d.build(n), f) {
			continue
		}
		if err := d.replace(n.metricKind(), n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ContainerFilters are the filters inside the container's namespace (H is
// a handle opened there). On lo: ICMP to the host IP or 127.0.0.0/8 stays
// local, TCP/UDP to the container's own ports stays local, and every other
// first fragment to the host IP or 127.0.0.0/8 is redirected to eth0, out
// to the host (and from there to the host's processes or another
// container). Non-first fragments stay local. On eth0: TCP/UDP to
// 127.0.0.0/8 and an own port (coming back from the host) is redirected to
// lo.
type ContainerFilters struct {
	H      *netlink.Handle // container namespace
	Lo     int             // container lo ifindex
	Eth0   int             // container eth0 ifindex
	HostIP net.IP
	// HostIP6 are the host's IPv6 addresses (container6.go); none: no
	// IPv6 filters.
	HostIP6 []net.IP
	Obs     Observer // optional
	// C sends the requests in batches (a Conn of the container's
	// namespace); nil: one at a time through H.
	C *Conn
}

var (
	ctrLo   = portTable{hashTable: TableCtrLoHash, table: TableCtrLo}
	ctrEth0 = portTable{hashTable: TableCtrEth0Hash, table: TableCtrEth0}
)

func (c ContainerFilters) lo() dev {
	return dev{h: c.H, ifindex: c.Lo, label: "container_lo", obs: c.Obs}
}
func (c ContainerFilters) eth0() dev {
	return dev{h: c.H, ifindex: c.Eth0, label: "container_eth0", obs: c.Obs}
}

func (c ContainerFilters) check() error {
	if c.HostIP.To4() == nil {
		return fmt.Errorf("container filters: host IP %v is not IPv4", c.HostIP)
	}
	if err := checkAddrs6("container filters", c.HostIP6); err != nil {
		return err
	}
	if c.Lo <= 0 || c.Eth0 <= 0 {
		return fmt.Errorf("container filters: ifindexes lo=%d eth0=%d must be positive", c.Lo, c.Eth0)
	}
	return nil
}

func (c ContainerFilters) loRoot() []node {
	hip := dstKey(c.HostIP)
	l4 := func(proto uint8, dst nl.TcU32Key) *nl.TcU32Sel {
		return eatIHL(sel(0, protoKey(proto), firstFragKey(), dst))
	}
	return append(withKinds([]node{
		{prio: PrioIP, handle: 1, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoICMP), hip), kind: KindICMP},
		{prio: PrioIP, handle: 2, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoICMP), dstLoopbackKey()), kind: KindICMP},
		{prio: PrioIP, handle: 3, sel: l4(ipprotoTCP, hip), link: ctrLo.hashTable},
		{prio: PrioIP, handle: 4, sel: l4(ipprotoUDP, hip), link: ctrLo.hashTable},
		{prio: PrioIP, handle: 5, sel: l4(ipprotoTCP, dstLoopbackKey()), link: ctrLo.hashTable},
		{prio: PrioIP, handle: 6, sel: l4(ipprotoUDP, dstLoopbackKey()), link: ctrLo.hashTable},
		{prio: PrioIP, handle: 7, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, firstFragKey(), hip), act: actRedirect, target: c.Eth0},
		{prio: PrioIP, handle: 8, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, firstFragKey(), dstLoopbackKey()), act: actRedirect, target: c.Eth0},
	}), c.loRoot6()...)
}

func (c ContainerFilters) eth0Root() []node {
	l4 := func(proto uint8) *nl.TcU32Sel {
		return eatIHL(sel(0, protoKey(proto), firstFragKey(), dstLoopbackKey()))
	}
	return append(withKinds([]node{
		{prio: PrioIP, handle: 1, sel: l4(ipprotoTCP), link: ctrEth0.hashTable},
		{prio: PrioIP, handle: 2, sel: l4(ipprotoUDP), link: ctrEth0.hashTable},
	}), c.eth0Root6()...)
}

func (c ContainerFilters) sets() []rangeSet {
	return []rangeSet{
		{d: c.lo(), c: c.C, nodes: func(r ephemeral.Range) []node { return ctrLo.nodes(r, ClassStop, actNone, 0) }},
		{d: c.eth0(), c: c.C, nodes: func(r ephemeral.Range) []node { return ctrEth0.nodes(r, ClassStop, actRedirect, c.Lo) }},
	}
}

// Install adds the ingress qdiscs and the lo and eth0 filters for the
// container's own ranges rs. It can be re-run; on error the caller tears
// the namespace down.
func (c ContainerFilters) Install(rs []ephemeral.Range) error {
	if err := c.check(); err != nil {
		return err
	}
	if err := checkRanges(rs); err != nil {
		return err
	}
	sets := c.sets()
	devs := []struct {
		s    rangeSet
		p    portTable
		want []node
	}{{sets[0], ctrLo, append(c.loRoot(), ctrLo.linkNode())}, {sets[1], ctrEth0, append(c.eth0Root(), ctrEth0.linkNode())}}
	// A device whose ingress qdisc is added now has no filters: its nodes
	// are added blindly, without reading anything back. A device that had
	// one (the namespace was set up before) is brought in line from a dump.
	b := batch{c: c.C}
	for _, x := range devs {
		b.addIngress(x.s.d)
	}
	res, err := b.run()
	if err != nil {
		return err
	}
	for i, x := range devs {
		b.addTables(x.s.d, x.p.tables())
		for _, r := range rs {
			for _, n := range x.s.nodes(r) {
				b.replace(x.s.d, KindIP, n)
			}
		}
		if res[i].raw == nil {
			for _, n := range x.want {
				b.add(x.s.d, n.metricKind(), n)
			}
		}
	}
	if _, err := b.run(); err != nil {
		return err
	}
	for i, x := range devs {
		if res[i].raw == nil {
			continue
		}
		fs, err := x.s.d.list()
		if err != nil {
			return err
		}
		if err := syncFixed(c.C, x.s.d, x.want, fs); err != nil {
			return err
		}
	}
	return nil
}

// SetRanges changes the container's own ranges from old to new on lo and
// eth0: new ones first, then the old ones not in new. If adding fails on
// either device, both are put back as they were.
func (c ContainerFilters) SetRanges(old, new []ephemeral.Range) error {
	if err := c.check(); err != nil {
		return err
	}
	if err := checkRanges(new); err != nil {
		return err
	}
	for _, r := range old {
		if !r.IsAligned() {
			return fmt.Errorf("old range %s: %w", r, ErrNotAligned)
		}
	}
	add, del := rangeDiff(new, old), rangeDiff(old, new)
	sets := c.sets()
	if err := sets[0].apply(add, nil); err != nil {
		return err
	}
	if err := sets[1].apply(add, nil); err != nil {
		if rerr := sets[0].apply(nil, add); rerr != nil {
			err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
		}
		return err
	}
	return errors.Join(sets[0].apply(nil, del), sets[1].apply(nil, del))
}
