package tcfilter

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// batch is a list of tc requests (qdiscs and filters, on one or more
// devices of one namespace) sent together: through a Conn, many to a
// sendmsg; without one, one at a time through each device's handle. Both
// ways send the same requests, built from the same netlink structs, in
// the same order; every request is tried (the kernel goes on after a
// failed one, so a request that depends on a failed one fails too), and
// each gets its own answer, so a caller knows exactly what was done.
type batch struct {
	c    *Conn // nil: one request at a time through the handles
	reqs []request
}

// request is one tc request of a batch.
type request struct {
	d     dev
	cmd   int // RTM_NEWTFILTER, RTM_DELTFILTER or RTM_NEWQDISC
	flags int // NLM_F_CREATE, NLM_F_EXCL
	f     netlink.Filter
	q     netlink.Qdisc
	op    string     // metrics op (observed when kind is set)
	kind  string     // metrics kind; "": not observed
	fine  unix.Errno // an answer that counts as success (0: none)
	wrap  func(error) error
}

// result is the answer to request i of a batch.
type result struct {
	i   int
	err error // wrapped; nil for success (including the fine answer)
	raw error // the kernel's answer
}

func (b *batch) push(r request) { b.reqs = append(b.reqs, r) }

// add creates a node; EEXIST is an error.
func (b *batch) add(d dev, kind string, n node) {
	b.push(request{d: d, cmd: unix.RTM_NEWTFILTER, flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, f: d.build(n),
		op: OpAdd, kind: kind, wrap: func(err error) error { return d.wrap(OpAdd, kind, n.handle, err) }})
}

// addKeep creates a node; an existing one is fine.
func (b *batch) addKeep(d dev, kind string, n node) {
	b.add(d, kind, n)
	b.reqs[len(b.reqs)-1].fine = unix.EEXIST
}

// replace creates a node or replaces its class and actions (dev.replace).
func (b *batch) replace(d dev, kind string, n node) {
	b.push(request{d: d, cmd: unix.RTM_NEWTFILTER, flags: unix.NLM_F_CREATE, f: d.build(n),
		op: OpUpdate, kind: kind, wrap: func(err error) error { return d.wrap(OpUpdate, kind, n.handle, err) }})
}

// del deletes one node or table by handle; with missingOK a missing one
// counts as deleted.
func (b *batch) del(d dev, kind string, prio uint16, handle uint32, missingOK bool) {
	r := request{d: d, cmd: unix.RTM_DELTFILTER, f: &netlink.U32{FilterAttrs: d.attrs(prio, handle)},
		op: OpRemove, kind: kind, wrap: func(err error) error { return d.wrap(OpRemove, kind, handle, err) }}
	if missingOK {
		r.fine = unix.ENOENT
	}
	b.push(r)
}

// addTable creates hash table htid; an existing table is fine.
func (b *batch) addTable(d dev, kind string, prio uint16, htid, divisor uint32) {
	b.push(request{d: d, cmd: unix.RTM_NEWTFILTER, flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL,
		f:  &netlink.U32{FilterAttrs: d.attrs(prio, MakeU32Handle(htid, 0, 0)), Divisor: divisor},
		op: OpAdd, kind: kind, fine: unix.EEXIST, wrap: func(err error) error {
			return fmt.Errorf("%s: add %s table %x: (divisor %d): %w", d.label, kind, htid, divisor, err)
		}})
}

// addTables creates the tables ts on d (existing ones are fine).
func (b *batch) addTables(d dev, ts []tableSpec) {
	for _, t := range ts {
		b.addTable(d, t.kind, t.prio, t.htid, t.divisor)
	}
}

// addIngress adds an ingress qdisc to a device that has no ingress hook
// yet (EnsureIngress without the check: an existing ingress or clsact
// qdisc, the only kinds at that parent, is fine).
func (b *batch) addIngress(d dev) {
	q := &netlink.Ingress{QdiscAttrs: ingressHookAttrs(d.ifindex)}
	b.push(request{d: d, cmd: unix.RTM_NEWQDISC, flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, q: q, fine: unix.EEXIST,
		wrap: func(err error) error { return fmt.Errorf("add %s qdisc on ifindex %d: %w", q.Type(), d.ifindex, err) }})
}

// attachBPF adds the cls_bpf filter f (bpfFilter.attach).
func (b *batch) attachBPF(d dev, f bpfFilter) error {
	bf, err := f.filter(d.ifindex)
	if err != nil {
		return err
	}
	b.push(request{d: d, cmd: unix.RTM_NEWTFILTER, flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, f: bf,
		wrap: func(err error) error { return fmt.Errorf("attach bpf %s to ifindex %d: %w", f.name, d.ifindex, err) }})
	return nil
}

// run sends the requests and returns the answer to each (in order) and
// the errors of those that failed, joined. Every request is reported to
// its device's observer.
func (b *batch) run() ([]result, error) {
	answers := make([]error, len(b.reqs))
	if b.c != nil {
		// One buffer for all: Conn.exchange numbers the requests in place.
		msgs := make([][]byte, len(b.reqs))
		ends := make([]int, len(b.reqs))
		buf := make([]byte, 0, 256*len(b.reqs))
		var encErr error
		for i, r := range b.reqs {
			if buf, encErr = r.appendTo(buf); encErr != nil {
				break
			}
			ends[i] = len(buf)
		}
		for i, start := 0, 0; encErr == nil && i < len(msgs); i++ {
			msgs[i], start = buf[start:ends[i]:ends[i]], ends[i]
		}
		if encErr == nil {
			answers, _ = b.c.exchange(msgs)
		} else { // nothing sent
			for i := range answers {
				answers[i] = fmt.Errorf("not sent: %w", encErr)
			}
		}
	} else {
		for i, r := range b.reqs {
			answers[i] = r.send()
		}
	}
	res := make([]result, len(b.reqs))
	var errs []error
	for i, r := range b.reqs {
		raw := answers[i]
		if r.kind != "" {
			r.d.observe(r.op, r.kind, raw)
		}
		res[i] = result{i: i, raw: raw}
		if raw != nil && !(r.fine != 0 && errors.Is(raw, r.fine)) {
			res[i].err = r.wrap(raw)
			errs = append(errs, res[i].err)
		}
	}
	b.reqs = nil
	return res, errors.Join(errs...)
}

// send makes the request through its device's handle.
func (r request) send() error {
	h := r.d.h
	switch {
	case r.q != nil:
		return h.QdiscAdd(r.q)
	case r.cmd == unix.RTM_DELTFILTER:
		return h.FilterDel(r.f)
	case r.flags&unix.NLM_F_EXCL != 0:
		return h.FilterAdd(r.f)
	}
	return h.FilterReplace(r.f)
}

// encode serializes the request (appendTo).
func (r request) encode() ([]byte, error) { return r.appendTo(nil) }

// encodeNL serializes the request exactly as vishvananda/netlink's
// filterModify and qdiscModify do for the kinds used here (u32, cls_bpf,
// ingress), with NLM_F_ACK.
func (r request) encodeNL() ([]byte, error) {
	req := &nl.NetlinkRequest{NlMsghdr: unix.NlMsghdr{
		Type:  uint16(r.cmd),
		Flags: uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK | r.flags),
	}}
	if r.q != nil {
		a := r.q.Attrs()
		req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(a.LinkIndex), Handle: a.Handle, Parent: a.Parent})
		req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated(r.q.Type())))
		req.AddData(nl.NewRtAttr(nl.TCA_OPTIONS, nil))
		return req.Serialize(), nil
	}
	a := r.f.Attrs()
	req.AddData(&nl.TcMsg{
		Family:  nl.FAMILY_ALL,
		Ifindex: int32(a.LinkIndex),
		Handle:  a.Handle,
		Parent:  a.Parent,
		Info:    netlink.MakeHandle(a.Priority, nl.Swap16(a.Protocol)),
	})
	req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated(r.f.Type())))
	opts := nl.NewRtAttr(nl.TCA_OPTIONS, nil)
	switch f := r.f.(type) {
	case *netlink.U32:
		encodeU32(opts, f)
		if err := netlink.EncodeActions(opts.AddRtAttr(nl.TCA_U32_ACT, nil), f.Actions); err != nil {
			return nil, err
		}
	case *netlink.BpfFilter:
		if f.ClassId != 0 {
			opts.AddRtAttr(nl.TCA_BPF_CLASSID, nl.Uint32Attr(f.ClassId))
		}
		if f.Fd >= 0 {
			opts.AddRtAttr(nl.TCA_BPF_FD, nl.Uint32Attr(uint32(f.Fd)))
		}
		if f.Name != "" {
			opts.AddRtAttr(nl.TCA_BPF_NAME, nl.ZeroTerminated(f.Name))
		}
		var flags uint32
		if f.DirectAction {
			flags |= nl.TCA_BPF_FLAG_ACT_DIRECT
		}
		opts.AddRtAttr(nl.TCA_BPF_FLAGS, nl.Uint32Attr(flags))
	default:
		return nil, fmt.Errorf("batch: filter kind %s not supported", r.f.Type())
	}
	req.AddData(opts)
	return req.Serialize(), nil
}

// encodeU32 adds f's u32 options but its actions: the selector (keys
// and masks to network order), class, divisor, hash and link.
func encodeU32(opts *nl.RtAttr, f *netlink.U32) {
	s := f.Sel
	if s == nil { // match all
		s = &nl.TcU32Sel{Flags: nl.TC_U32_TERMINAL, Keys: []nl.TcU32Key{{}}}
	}
	c := *s
	c.Keys = make([]nl.TcU32Key, len(s.Keys))
	for i, k := range s.Keys {
		c.Keys[i] = nl.TcU32Key{Mask: nl.Swap32(k.Mask), Val: nl.Swap32(k.Val), Off: k.Off, OffMask: k.OffMask}
	}
	c.Offmask = nl.Swap16(s.Offmask)
	c.Hmask = nl.Swap32(s.Hmask)
	c.Nkeys = uint8(len(c.Keys))
	opts.AddRtAttr(nl.TCA_U32_SEL, c.Serialize())
	if f.ClassId != 0 {
		opts.AddRtAttr(nl.TCA_U32_CLASSID, nl.Uint32Attr(f.ClassId))
	}
	if f.Divisor != 0 {
		opts.AddRtAttr(nl.TCA_U32_DIVISOR, nl.Uint32Attr(f.Divisor))
	}
	if f.Hash != 0 {
		opts.AddRtAttr(nl.TCA_U32_HASH, nl.Uint32Attr(f.Hash))
	}
	if f.Link != 0 {
		opts.AddRtAttr(nl.TCA_U32_LINK, nl.Uint32Attr(f.Link))
	}
}
