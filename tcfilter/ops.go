package tcfilter

// One filter operation: build a node's netlink struct (fresh for every
// request: netlink's U32.RedirIndex prepends a mirred action each time a
// struct is reused), add, replace, delete, dump, each observed per op
// (Observer, for metrics); and the clsact/ingress hook of a device.
// FilterReplace keeps a node's keys, so keys are never changed in place.

import (
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/nlbatch"
)

// Op describes one filter operation, for metrics.
type Op struct {
	Op     string // add | remove | update
	Device string // device label: eth0, lo, veth, container_lo, container_eth0
	Kind   string // ip | arp | icmp
	Result string // ok | error | exists | not_found
}

// Observer is told about every filter operation (one call per netlink
// request that adds, removes or replaces a node or a hash table). It may be
// nil. It must be cheap and must not call back into this package.
type Observer func(Op)

// Op and Kind values.
const (
	OpAdd    = "add"
	OpRemove = "remove"
	OpUpdate = "update"

	KindIP   = "ip"
	KindARP  = "arp"
	KindICMP = "icmp"

	ResultOK       = "ok"
	ResultError    = "error"
	ResultExists   = "exists"
	ResultNotFound = "not_found"
)

func resultOf(err error) string {
	switch {
	case err == nil:
		return ResultOK
	case errors.Is(err, unix.EEXIST):
		return ResultExists
	case errors.Is(err, unix.ENOENT):
		return ResultNotFound
	}
	return ResultError
}

// tableBusyTimeout bounds the wait for the kernel to drop a deleted link
// node's reference to a hash table (deferred RCU work, ~10-25 ms).
const tableBusyTimeout = 2 * time.Second

// dev is one device's ingress hook seen through a netlink handle.
type dev struct {
	h       *netlink.Handle
	ifindex int
	label   string
	obs     Observer
}

func (d dev) observe(op, kind string, err error) {
	if d.obs != nil {
		d.obs(Op{Op: op, Device: d.label, Kind: kind, Result: resultOf(err)})
	}
}

// protoOf is the protocol of our u32 classifier at prio (PrioVethARP and
// PrioVethOther exist only on container veths).
func protoOf(prio uint16) uint16 {
	switch prio {
	case PrioARP, PrioVethARP:
		return unix.ETH_P_ARP
	case PrioIP6:
		return unix.ETH_P_IPV6
	case PrioVethOther:
		return unix.ETH_P_ALL
	}
	return unix.ETH_P_IP
}

func (d dev) attrs(prio uint16, handle uint32) netlink.FilterAttrs {
	return netlink.FilterAttrs{
		LinkIndex: d.ifindex,
		Parent:    netlink.HANDLE_MIN_INGRESS,
		Priority:  prio,
		Protocol:  protoOf(prio),
		Handle:    handle,
	}
}

// action kinds of a node
const (
	actNone     = iota // terminal without action ("stop here") or a link node
	actRedirect        // mirred egress redirect, stolen
	actMirror          // mirred egress mirror, continue with the next node
)

// node is the description of one u32 node; build turns it into a fresh
// netlink struct for every request (netlink mutates and prepends to the
// structs it is given, so they are never reused).
type node struct {
	prio    uint16
	handle  uint32       // htid:bucket:node; htid 0 means the priority's root table
	sel     *nl.TcU32Sel // template: copied by build
	classid uint32
	link    uint32 // table id to link to (0: none)
	act     int
	target  int    // ifindex for actRedirect / actMirror
	kind    string // metrics kind; "" means kindOf(prio, handle)
	reason  string // drop reason of a node redirecting to the drop sink
	index   uint32 // a drop's shared mirred action (dropIndex); 0 for other nodes (actionIndex)
	own     bool   // a mirred action of its own (not shared), whose last use tells the node's (SpreadUse)
}

func (n node) metricKind() string {
	if n.kind != "" {
		return n.kind
	}
	return kindOf(n.prio, n.handle)
}

func (d dev) build(n node) *netlink.U32 {
	f := &netlink.U32{FilterAttrs: d.attrs(n.prio, n.handle), ClassId: n.classid}
	htid, bkt, _ := SplitU32Handle(n.handle)
	if htid != 0 {
		f.Hash = MakeU32Handle(htid, bkt, 0)
	}
	if n.link != 0 {
		f.Link = MakeU32Handle(n.link, 0, 0)
	}
	s := *n.sel
	s.Keys = make([]nl.TcU32Key, len(n.sel.Keys))
	copy(s.Keys, n.sel.Keys)
	s.Nkeys = uint8(len(s.Keys))
	f.Sel = &s
	switch n.act {
	case actRedirect:
		f.Actions = redirect(n.target)
	case actMirror:
		f.Actions = mirrorContinue(n.target)
	}
	if idx := n.actionIndex(); idx != 0 && len(f.Actions) > 0 {
		f.Actions[0].Attrs().Index = int(idx)
	}
	return f
}

func (d dev) wrap(op, kind string, h uint32, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %s %s node %s: %w", d.label, op, kind, FormatHandle(h), err)
}

// add creates a node; EEXIST is an error (wrapping unix.EEXIST).
func (d dev) add(kind string, n node) error {
	err := d.h.FilterAdd(d.build(n))
	d.observe(OpAdd, kind, err)
	return d.wrap(OpAdd, kind, n.handle, err)
}

// replace creates a node or replaces its class and actions (the kernel keeps
// an existing node's keys; every caller derives keys from the handle, so
// they are the same anyway).
func (d dev) replace(kind string, n node) error {
	err := d.h.FilterReplace(d.build(n))
	d.observe(OpUpdate, kind, err)
	return d.wrap(OpUpdate, kind, n.handle, err)
}

// del deletes one node or table by handle; a missing one wraps unix.ENOENT.
func (d dev) del(kind string, prio uint16, handle uint32) error {
	err := d.h.FilterDel(&netlink.U32{FilterAttrs: d.attrs(prio, handle)})
	d.observe(OpRemove, kind, err)
	return d.wrap(OpRemove, kind, handle, err)
}

// addTable creates hash table htid; an existing table is fine (exists is
// reported to the observer, nil returned).
func (d dev) addTable(kind string, prio uint16, htid, divisor uint32) error {
	err := d.h.FilterAdd(&netlink.U32{
		FilterAttrs: d.attrs(prio, MakeU32Handle(htid, 0, 0)),
		Divisor:     divisor,
	})
	d.observe(OpAdd, kind, err)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: add %s table %x: (divisor %d): %w", d.label, kind, htid, divisor, err)
	}
	return nil
}

type tableRef struct {
	kind string
	prio uint16
	htid uint32
}

// delTables deletes hash tables whose link nodes are already gone. The
// kernel drops a deleted link node's reference in deferred RCU work, so a
// table stays EBUSY for a few milliseconds: retry until timeout. Missing
// tables count as deleted. It returns the tables still busy at the deadline.
func (d dev) delTables(ts []tableRef, timeout time.Duration) ([]tableRef, error) {
	deadline := time.Now().Add(timeout)
	var errs []error
	sleep := time.Millisecond
	for len(ts) > 0 {
		var busy []tableRef
		for _, t := range ts {
			err := d.h.FilterDel(&netlink.U32{FilterAttrs: d.attrs(t.prio, MakeU32Handle(t.htid, 0, 0))})
			switch {
			case err == nil:
				d.observe(OpRemove, t.kind, nil)
			case errors.Is(err, unix.EBUSY):
				busy = append(busy, t)
			case errors.Is(err, unix.ENOENT):
				d.observe(OpRemove, t.kind, unix.ENOENT)
			default:
				d.observe(OpRemove, t.kind, err)
				errs = append(errs, fmt.Errorf("%s: remove %s table %x: %w", d.label, t.kind, t.htid, err))
			}
		}
		ts = busy
		if len(ts) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(sleep)
		if sleep < 8*time.Millisecond {
			sleep *= 2
		}
	}
	for _, t := range ts {
		d.observe(OpRemove, t.kind, unix.EBUSY)
	}
	if len(ts) > 0 {
		errs = append(errs, fmt.Errorf("%s: %d hash table(s) still busy after %v", d.label, len(ts), timeout))
	}
	return ts, errors.Join(errs...)
}

// delPrio deletes a whole classifier priority (its root table and nodes).
func (d dev) delPrio(kind string, prio uint16) error {
	err := d.h.FilterDel(&netlink.U32{FilterAttrs: d.attrs(prio, 0)})
	d.observe(OpRemove, kind, err)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s: remove %s priority %d: %w", d.label, kind, prio, err)
	}
	return nil
}

// list dumps the u32 nodes of our priorities under the ingress hook (hash
// tables themselves are not returned by netlink). A dump interrupted by a
// concurrent change is retried.
func (d dev) list() ([]*netlink.U32, error) {
	fs, err := d.dumpIngress()
	if err != nil {
		return nil, err
	}
	return ours(fs), nil
}

// dumpIngress dumps every filter under the ingress hook, retrying a dump
// interrupted by a concurrent change.
func (d dev) dumpIngress() ([]netlink.Filter, error) {
	var (
		fs  []netlink.Filter
		err error
	)
	for try := 0; try < 5; try++ {
		fs, err = d.h.FilterList(linkRef(d.ifindex), netlink.HANDLE_MIN_INGRESS)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: list filters: %w", d.label, err)
	}
	return fs, nil
}

// ours keeps the u32 nodes of our priorities.
func ours(fs []netlink.Filter) []*netlink.U32 {
	out := make([]*netlink.U32, 0, len(fs))
	for _, f := range fs {
		u, ok := f.(*netlink.U32)
		if !ok || u.Priority < PrioARP || u.Priority > PrioVethOther || u.Protocol != protoOf(u.Priority) {
			continue
		}
		out = append(out, u)
	}
	return out
}

func linkRef(ifindex int) netlink.Link {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
}

// EnsureClsact makes sure the device has a qdisc with an ingress hook: an
// existing clsact or ingress qdisc is accepted, otherwise a clsact qdisc is
// added. Filters go under parent ffff:fff2, which both kinds accept.
func EnsureClsact(h *netlink.Handle, ifindex int) error {
	return ensureIngressHook(h, ifindex, &netlink.Clsact{QdiscAttrs: ingressHookAttrs(ifindex)})
}

// EnsureIngress is EnsureClsact for a device that needs no egress hook:
// it adds an ingress qdisc (an existing clsact or ingress one is
// accepted). Every qdisc with a filter block joins a machine-wide list
// that the kernel walks each time such a qdisc is added or removed
// (flow_indr_dev_setup_offload); clsact brings two blocks (ingress and
// egress), ingress one, so the walks are half as many and half as long.
func EnsureIngress(h *netlink.Handle, ifindex int) error {
	return ensureIngressHook(h, ifindex, &netlink.Ingress{QdiscAttrs: ingressHookAttrs(ifindex)})
}

func ingressHookAttrs(ifindex int) netlink.QdiscAttrs {
	return netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}
}

// ensureIngressHook adds q (a clsact or ingress qdisc), accepting either
// kind already on the device.
func ensureIngressHook(h *netlink.Handle, ifindex int, q netlink.Qdisc) error {
	has := func() (bool, error) {
		qs, err := h.QdiscList(linkRef(ifindex))
		if err != nil {
			return false, fmt.Errorf("list qdiscs of ifindex %d: %w", ifindex, err)
		}
		for _, q := range qs {
			if q.Attrs().LinkIndex == ifindex && q.Attrs().Parent == netlink.HANDLE_INGRESS &&
				(q.Type() == "clsact" || q.Type() == "ingress") {
				return true, nil
			}
		}
		return false, nil
	}
	// Add first and list only on EEXIST: the kernel's qdisc dump is not
	// filtered by device, so listing costs O(all qdiscs on the host), and
	// the common case (a new veth) has none yet.
	err := h.QdiscAdd(q)
	if errors.Is(err, unix.EEXIST) {
		if ok, lerr := has(); lerr == nil && ok {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("add %s qdisc on ifindex %d: %w", q.Type(), ifindex, err)
	}
	return nil
}

// syncFixed makes the fixed (infrastructure) nodes want exist as described,
// given a dump fs of the device: missing ones are added, ones that differ
// only in their actions replaced, other different ones deleted and re-added
// (a replace would keep the old keys), and unknown
// nodes in the root tables of our priorities are deleted. Root nodes are
// matched by priority and node id, because their table id (800:, 801:, ...)
// is chosen by the kernel; adding a root node that exists already fails with
// ENOSPC, not EEXIST, so they must never be added blindly. The requests go
// in one batch through c (nil: one at a time), deletions and replacements
// first.
func syncFixed(c *nlbatch.Conn, d dev, want []node, fs []*netlink.U32) error {
	type key struct {
		prio   uint16
		handle uint32 // node id only for root nodes
	}
	byKey := map[key]node{}
	for _, n := range want {
		byKey[key{n.prio, n.handle}] = n
	}
	b := batch{c: c}
	seen := map[key]bool{}
	for _, f := range fs {
		htid, _, nid := SplitU32Handle(f.Handle)
		k := key{f.Priority, f.Handle}
		root := htid >= 0x800
		if root {
			k.handle = nid
		}
		n, ok := byKey[k]
		switch {
		case !ok && root:
			b.del(d, kindOf(f.Priority, f.Handle), f.Priority, f.Handle, true)
		case !ok:
		case sameNode(d.build(n), f):
			seen[k] = true
		case sameMatch(d.build(n), f):
			// only the actions differ: a replace keeps the node matching
			n.handle = f.Handle
			b.replace(d, n.metricKind(), n)
			seen[k] = true
		default:
			b.del(d, n.metricKind(), n.prio, f.Handle, true)
		}
	}
	for _, n := range want {
		if !seen[key{n.prio, n.handle}] {
			b.add(d, n.metricKind(), n)
		}
	}
	_, err := b.run()
	return err
}
