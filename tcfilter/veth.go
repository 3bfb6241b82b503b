package tcfilter

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

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

// ensure creates the tables (existing ones are fine); the link node is
// one of the device's fixed nodes (syncFixed).
func (p portTable) ensure(d dev) error {
	for _, t := range p.tables() {
		if err := d.addTable(t.kind, t.prio, t.htid, t.divisor); err != nil {
			return err
		}
	}
	return nil
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
	nodes func(r ephemeral.Range) []node
}

// apply adds the nodes of add (create or replace: their keys follow from
// their handles), removing them all again if one fails, then deletes the
// nodes of del (missing ones are fine).
func (s rangeSet) apply(add, del []ephemeral.Range) error {
	var done []node
	for _, r := range add {
		for _, n := range s.nodes(r) {
			if err := s.d.replace(KindIP, n); err != nil {
				for i := len(done) - 1; i >= 0; i-- {
					if rerr := s.d.del(KindIP, PrioIP, done[i].handle); rerr != nil && !errors.Is(rerr, unix.ENOENT) {
						err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
					}
				}
				return fmt.Errorf("range %s: %w", r, err)
			}
			done = append(done, n)
		}
	}
	var errs []error
	for _, r := range del {
		for _, n := range s.nodes(r) {
			if err := s.d.del(KindIP, PrioIP, n.handle); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// VethFilters are the filters on the ingress of a container's host-side
// veth: what the container sends. ARP and ICMP go out through host eth0;
// TCP and UDP from source ports the container owns go to host lo when the
// destination is local (host IP or 127.0.0.0/8) and out through host eth0
// otherwise; anything else (a source port it does not own, another
// protocol) stops at the veth's own stack, which drops it. Non-first IPv4
// fragments carry no ports: they go to host lo when the destination is
// local, else out through eth0.
//
// With Via set (a container with an egress limit), every IP redirect goes
// to Via, the entry of the container's egress shaper, instead of host eth0
// or lo; the shaper's exit (ShaperExit) then forwards by destination the
// way these filters would have. ARP always goes to host eth0 directly.
type VethFilters struct {
	H      *netlink.Handle // host namespace
	Veth   int             // host-side veth ifindex
	Eth0   int             // host eth0 ifindex
	Lo     int             // host lo ifindex
	Via    int             // egress shaper entry ifindex; 0: none (straight to eth0/lo)
	HostIP net.IP
	Slot   uint16
	Obs    Observer
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
)

func (v VethFilters) dev() dev { return dev{h: v.H, ifindex: v.Veth, label: "veth", obs: v.Obs} }

func (v VethFilters) check() error {
	if err := checkSlot(v.Slot); err != nil {
		return err
	}
	if v.HostIP.To4() == nil {
		return fmt.Errorf("veth filters: host IP %v is not IPv4", v.HostIP)
	}
	if v.Veth <= 0 || v.Eth0 <= 0 || v.Lo <= 0 || v.Via < 0 {
		return fmt.Errorf("veth filters: ifindexes veth=%d eth0=%d lo=%d via=%d must be positive", v.Veth, v.Eth0, v.Lo, v.Via)
	}
	return nil
}

// withKinds labels the metrics kind of root nodes that have none: ip (arp
// in the ARP priority).
func withKinds(ns []node) []node {
	for i := range ns {
		if ns[i].kind == "" {
			ns[i].kind = KindIP
			if ns[i].prio == PrioARP {
				ns[i].kind = KindARP
			}
		}
	}
	return ns
}

func (v VethFilters) rootNodes() []node {
	c := ClassID(v.Slot)
	l4 := func(proto uint8, extra ...nl.TcU32Key) *nl.TcU32Sel {
		return eatIHL(sel(0, append([]nl.TcU32Key{protoKey(proto), firstFragKey()}, extra...)...))
	}
	hip := dstKey(v.HostIP)
	return withKinds([]node{
		{prio: PrioARP, handle: nodeARPRoot, classid: c, sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: v.Eth0},
		{prio: PrioIP, handle: 1, classid: c, sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoICMP)), act: actRedirect, target: v.out(), kind: KindICMP},
		{prio: PrioIP, handle: 2, sel: l4(ipprotoTCP, hip), link: vethLocal.hashTable},
		{prio: PrioIP, handle: 3, sel: l4(ipprotoUDP, hip), link: vethLocal.hashTable},
		{prio: PrioIP, handle: 4, sel: l4(ipprotoTCP, dstLoopbackKey()), link: vethLocal.hashTable},
		{prio: PrioIP, handle: 5, sel: l4(ipprotoUDP, dstLoopbackKey()), link: vethLocal.hashTable},
		{prio: PrioIP, handle: 6, sel: l4(ipprotoTCP), link: vethOut.hashTable},
		{prio: PrioIP, handle: 7, sel: l4(ipprotoUDP), link: vethOut.hashTable},
		// first fragments (and unfragmented packets) that got here come
		// from a port the container does not own, or are another protocol
		{prio: PrioIP, handle: 8, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, firstFragKey())},
		// non-first fragments
		{prio: PrioIP, handle: 9, classid: c, sel: sel(nl.TC_U32_TERMINAL, hip), act: actRedirect, target: v.local()},
		{prio: PrioIP, handle: 10, classid: c, sel: sel(nl.TC_U32_TERMINAL, dstLoopbackKey()), act: actRedirect, target: v.local()},
		{prio: PrioIP, handle: 11, classid: c, sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: v.out()},
	})
}

func (v VethFilters) rangeSet() rangeSet {
	c := ClassID(v.Slot)
	return rangeSet{d: v.dev(), nodes: func(r ephemeral.Range) []node {
		return append(vethLocal.nodes(r, c, actRedirect, v.local()), vethOut.nodes(r, c, actRedirect, v.out())...)
	}}
}

// Install adds the clsact qdisc and every veth filter for the container's
// ranges rs. Existing nodes are kept or updated, so it can be re-run. On
// error the caller removes the veth, which removes all of it.
func (v VethFilters) Install(rs []ephemeral.Range) error {
	if err := v.check(); err != nil {
		return err
	}
	if err := checkRanges(rs); err != nil {
		return err
	}
	d := v.dev()
	if err := EnsureClsact(v.H, v.Veth); err != nil {
		return err
	}
	for _, p := range []portTable{vethLocal, vethOut} {
		if err := p.ensure(d); err != nil {
			return err
		}
	}
	if err := v.rangeSet().apply(rs, nil); err != nil {
		return err
	}
	fs, err := d.list()
	if err != nil {
		return err
	}
	return syncFixed(d, append(v.rootNodes(), vethLocal.linkNode(), vethOut.linkNode()), fs)
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

// Retarget points every IP redirect of the veth (its fixed nodes and the
// nodes of the container's ranges rs) where v says: host eth0/lo, or v.Via.
// It only replaces actions (FilterReplace keeps a node's keys and handle),
// so a packet is never unmatched: it takes the old path or the new one.
// Nodes already pointing right are left alone.
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
	have := map[uint32]*netlink.U32{}
	root := map[uint32]*netlink.U32{} // root nodes by node id
	for _, f := range fs {
		if f.Priority != PrioIP {
			continue
		}
		htid, _, nid := SplitU32Handle(f.Handle)
		if htid >= 0x800 {
			root[nid] = f
		} else {
			have[f.Handle] = f
		}
	}
	var errs []error
	for _, r := range rs {
		for _, n := range v.rangeSet().nodes(r) {
			if f, ok := have[n.handle]; ok && sameNode(d.build(n), f) {
				continue
			}
			if err := d.replace(KindIP, n); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, n := range v.rootNodes() {
		f, ok := root[n.handle]
		if n.prio != PrioIP || n.act != actRedirect || !ok {
			continue
		}
		n.handle = f.Handle // the kernel's 80x: table id
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
	Obs    Observer // optional
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
	return withKinds([]node{
		{prio: PrioIP, handle: 1, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoICMP), hip), kind: KindICMP},
		{prio: PrioIP, handle: 2, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoICMP), dstLoopbackKey()), kind: KindICMP},
		{prio: PrioIP, handle: 3, sel: l4(ipprotoTCP, hip), link: ctrLo.hashTable},
		{prio: PrioIP, handle: 4, sel: l4(ipprotoUDP, hip), link: ctrLo.hashTable},
		{prio: PrioIP, handle: 5, sel: l4(ipprotoTCP, dstLoopbackKey()), link: ctrLo.hashTable},
		{prio: PrioIP, handle: 6, sel: l4(ipprotoUDP, dstLoopbackKey()), link: ctrLo.hashTable},
		{prio: PrioIP, handle: 7, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, firstFragKey(), hip), act: actRedirect, target: c.Eth0},
		{prio: PrioIP, handle: 8, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, firstFragKey(), dstLoopbackKey()), act: actRedirect, target: c.Eth0},
	})
}

func (c ContainerFilters) eth0Root() []node {
	l4 := func(proto uint8) *nl.TcU32Sel {
		return eatIHL(sel(0, protoKey(proto), firstFragKey(), dstLoopbackKey()))
	}
	return withKinds([]node{
		{prio: PrioIP, handle: 1, sel: l4(ipprotoTCP), link: ctrEth0.hashTable},
		{prio: PrioIP, handle: 2, sel: l4(ipprotoUDP), link: ctrEth0.hashTable},
	})
}

func (c ContainerFilters) sets() []rangeSet {
	return []rangeSet{
		{d: c.lo(), nodes: func(r ephemeral.Range) []node { return ctrLo.nodes(r, ClassStop, actNone, 0) }},
		{d: c.eth0(), nodes: func(r ephemeral.Range) []node { return ctrEth0.nodes(r, ClassStop, actRedirect, c.Lo) }},
	}
}

// Install adds the clsact qdiscs and the lo and eth0 filters for the
// container's own ranges rs. It can be re-run; on error the caller tears
// the namespace down.
func (c ContainerFilters) Install(rs []ephemeral.Range) error {
	if err := c.check(); err != nil {
		return err
	}
	if err := checkRanges(rs); err != nil {
		return err
	}
	for _, x := range []struct {
		d    dev
		p    portTable
		root []node
	}{{c.lo(), ctrLo, c.loRoot()}, {c.eth0(), ctrEth0, c.eth0Root()}} {
		if err := EnsureClsact(c.H, x.d.ifindex); err != nil {
			return err
		}
		if err := x.p.ensure(x.d); err != nil {
			return err
		}
	}
	for _, s := range c.sets() {
		if err := s.apply(rs, nil); err != nil {
			return err
		}
	}
	for _, x := range []struct {
		d    dev
		want []node
	}{{c.lo(), append(c.loRoot(), ctrLo.linkNode())}, {c.eth0(), append(c.eth0Root(), ctrEth0.linkNode())}} {
		fs, err := x.d.list()
		if err != nil {
			return err
		}
		if err := syncFixed(x.d, x.want, fs); err != nil {
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
