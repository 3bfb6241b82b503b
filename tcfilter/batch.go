package tcfilter

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/nlbatch"
)

// batch is a list of tc requests (qdiscs and filters, on one or more
// devices of one namespace) sent together: through an nlbatch.Conn, many to a
// sendmsg; without one, one at a time through each device's handle. Both
// ways send the same requests, built from the same netlink structs, in
// the same order; every request is tried (the kernel goes on after a
// failed one, so a request that depends on a failed one fails too), and
// each gets its own answer, so a caller knows exactly what was done.
type batch struct {
	c    *nlbatch.Conn // nil: one request at a time through the handles
	reqs []request
}

// request is one tc request of a batch.
type request struct {
	nlbatch.Request
	d    dev
	op   string     // metrics op (observed when kind is set)
	kind string     // metrics kind; "": not observed
	fine unix.Errno // an answer that counts as success (0: none)
	wrap func(error) error
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
	b.push(request{d: d, Request: nlbatch.Request{Cmd: unix.RTM_NEWTFILTER, Flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, Filter: d.build(n)},
		op: OpAdd, kind: kind, wrap: func(err error) error { return d.wrap(OpAdd, kind, n.handle, err) }})
}

// addKeep creates a node; an existing one is fine.
func (b *batch) addKeep(d dev, kind string, n node) {
	b.add(d, kind, n)
	b.reqs[len(b.reqs)-1].fine = unix.EEXIST
}

// replace creates a node or replaces its class and actions (dev.replace).
func (b *batch) replace(d dev, kind string, n node) {
	b.push(request{d: d, Request: nlbatch.Request{Cmd: unix.RTM_NEWTFILTER, Flags: unix.NLM_F_CREATE, Filter: d.build(n)},
		op: OpUpdate, kind: kind, wrap: func(err error) error { return d.wrap(OpUpdate, kind, n.handle, err) }})
}

// del deletes one node or table by handle; with missingOK a missing one
// counts as deleted.
func (b *batch) del(d dev, kind string, prio uint16, handle uint32, missingOK bool) {
	r := request{d: d, Request: nlbatch.Request{Cmd: unix.RTM_DELTFILTER, Filter: &netlink.U32{FilterAttrs: d.attrs(prio, handle)}},
		op: OpRemove, kind: kind, wrap: func(err error) error { return d.wrap(OpRemove, kind, handle, err) }}
	if missingOK {
		r.fine = unix.ENOENT
	}
	b.push(r)
}

// addTable creates hash table htid; an existing table is fine.
func (b *batch) addTable(d dev, kind string, prio uint16, htid, divisor uint32) {
	b.push(request{d: d, Request: nlbatch.Request{Cmd: unix.RTM_NEWTFILTER, Flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL,
		Filter: &netlink.U32{FilterAttrs: d.attrs(prio, MakeU32Handle(htid, 0, 0)), Divisor: divisor}},
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
	b.push(request{d: d, Request: nlbatch.Request{Cmd: unix.RTM_NEWQDISC, Flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, Qdisc: q}, fine: unix.EEXIST,
		wrap: func(err error) error { return fmt.Errorf("add %s qdisc on ifindex %d: %w", q.Type(), d.ifindex, err) }})
}

// attachBPF adds the cls_bpf filter f (bpfFilter.attach).
func (b *batch) attachBPF(d dev, f bpfFilter) error {
	bf, err := f.filter(d.ifindex)
	if err != nil {
		return err
	}
	b.push(request{d: d, Request: nlbatch.Request{Cmd: unix.RTM_NEWTFILTER, Flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, Filter: bf},
		wrap: func(err error) error { return fmt.Errorf("attach bpf %s to ifindex %d: %w", f.name, d.ifindex, err) }})
	return nil
}

// run sends the requests and returns the answer to each (in order) and
// the errors of those that failed, joined. Every request is reported to
// its device's observer.
func (b *batch) run() ([]result, error) {
	answers := make([]error, len(b.reqs))
	if b.c != nil {
		// One buffer for all: Conn.Exchange numbers the requests in place.
		msgs := make([][]byte, len(b.reqs))
		ends := make([]int, len(b.reqs))
		buf := make([]byte, 0, 256*len(b.reqs))
		var encErr error
		for i, r := range b.reqs {
			if buf, encErr = r.AppendTo(buf); encErr != nil {
				break
			}
			ends[i] = len(buf)
		}
		for i, start := 0, 0; encErr == nil && i < len(msgs); i++ {
			msgs[i], start = buf[start:ends[i]:ends[i]], ends[i]
		}
		if encErr == nil {
			answers, _ = b.c.Exchange(msgs)
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
	case r.Qdisc != nil:
		return h.QdiscAdd(r.Qdisc)
	case r.Cmd == unix.RTM_DELTFILTER:
		return h.FilterDel(r.Filter)
	case r.Flags&unix.NLM_F_EXCL != 0:
		return h.FilterAdd(r.Filter)
	}
	return h.FilterReplace(r.Filter)
}
