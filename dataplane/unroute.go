package dataplane

// Cutting the paths to containers being torn down, combined.
//
// A teardown first removes everything that leads to its container: its
// neighbour requests, its echo origins, the host demux nodes of its
// exclusive ranges (eth0 and lo), its ICMP fan-out node and its holdings
// of shared ports; all of it under d.mu. Teardowns that arrive while
// another one does this queue their requests; the next to take the turn
// does every queued one in one pass: one hold of d.mu, one
// HostDemux.Unroute per device (every node of every request, the emptied
// H2 tables released once). Each caller returns only once its own request
// is done, whoever did it: its ports then lead nowhere (the veth is muted
// next, by the caller).

import (
	"fmt"
	"sync"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/tcfilter"
)

// unrouter queues the requests of the teardowns waiting for a pass.
type unrouter struct {
	mu    sync.Mutex
	queue []*unrouteReq
	// turn holds a token while a teardown does a pass.
	turn chan struct{}
	// passes counts the passes done (guarded by turn; for tests).
	passes int
}

// unrouteReq is one teardown's request and, once done is closed, its
// outcome.
type unrouteReq struct {
	c    plane.Container // as the caller knows it; the record's once done
	veth int             // the host veth's ifindex the record knows (0: none)
	pin  nspin.Pin
	// shaper: the egress shaper entry's ifindex (0: none), or why it could
	// not be looked up (shaperErr).
	shaper    int
	shaperErr error
	// missing: objects already gone (TeardownReport.Missing); errs: what
	// failed; err: the request was not done at all (not prepared, closed).
	missing []string
	errs    []error
	err     error
	done    chan struct{}
}

func (u *unrouteReq) miss(format string, args ...any) {
	u.missing = append(u.missing, fmt.Sprintf(format, args...))
}

// unroute cuts the paths to c (see above) and returns when that is done,
// by this call or by another teardown's pass.
func (d *DataPlane) unroute(c plane.Container) *unrouteReq {
	u := &unrouteReq{c: c, done: make(chan struct{})}
	// The egress shaper's entry, looked up before the pass (a request
	// that waits for rtnl, not to be made under d.mu): only a SetLimits of
	// this container makes or deletes it, and the caller orders the calls
	// of one container.
	entry, _ := ShaperNames(c.ID)
	u.shaper, u.shaperErr = d.linkIndex(entry)
	q := &d.unrouting
	q.mu.Lock()
	q.queue = append(q.queue, u)
	q.mu.Unlock()
	for {
		select {
		case <-u.done:
			return u
		case q.turn <- struct{}{}:
		}
		// u is still queued, or was done by the pass that held the turn.
		q.mu.Lock()
		reqs := q.queue
		q.queue = nil
		q.mu.Unlock()
		if len(reqs) > 0 {
			q.passes++
			d.unroutePass(reqs)
			for _, r := range reqs {
				close(r.done)
			}
		}
		<-q.turn
	}
}

// unroutePass does the requests reqs under one hold of d.mu.
func (d *DataPlane) unroutePass(reqs []*unrouteReq) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rootQdiscs = nil // qdiscs may change: the recovery cache ends
	if err := d.ready(); err != nil {
		for _, u := range reqs {
			u.err = err
		}
		return
	}
	// The requests whose host filters are theirs to remove, with their
	// exclusive ranges.
	type cut struct {
		u    *unrouteReq
		excl []ephemeral.Range
	}
	var cuts []cut
	for _, u := range reqs {
		if rec, ok := d.ctrs[u.c.ID]; ok {
			u.c, u.veth, u.pin = rec.c, rec.veth, rec.pin
		} else {
			u.pin = d.pinOf(u.c)
		}
		c := u.c
		d.dropNeigh(c.ID)
		// (a pair goes as a whole: no entry, no exit)
		d.dropEchoOrigins(c.ID, u.veth, u.shaper != 0 || u.shaperErr != nil)
		// Host filters are tagged by slot; never touch those of a slot
		// that now belongs to another (known) container.
		if other, ok := d.slots[c.Slot]; ok && other != c.ID {
			u.miss("host filters of slot %d (the slot belongs to container %s)", c.Slot, other)
			continue
		}
		if c.Slot < 1 || c.Slot > plane.MaxSlot {
			continue
		}
		var excl []ephemeral.Range
		if c.Ephemeral.Size() > 0 {
			excl = exclusiveRanges(c.Ephemeral, c.Ports)
		}
		cuts = append(cuts, cut{u, excl})
	}

	// eth0: ranges and fan-out; lo: ranges.
	var eth0, lo []tcfilter.Unroute
	var onLo []cut
	for _, k := range cuts {
		// The fan-out node the demux's index has (made by this data plane
		// with the fan-out in use, or found by Init: left by an earlier
		// run, maybe one without the echo programs). A
		// container plumbed without one (the echo programs steered then)
		// has nothing to remove and nothing missing.
		_, fan := d.eth0.FanoutTarget(k.u.c.Slot)
		eth0 = append(eth0, tcfilter.Unroute{Slot: k.u.c.Slot, Ranges: k.excl, Fanout: fan})
		if len(k.excl) > 0 {
			lo = append(lo, tcfilter.Unroute{Slot: k.u.c.Slot, Ranges: k.excl})
			onLo = append(onLo, k)
		}
	}
	note := func(ks []cut, device string, out []tcfilter.Unrouted) {
		for i, o := range out {
			k := ks[i]
			if o.Err != nil {
				k.u.errs = append(k.u.errs, fmt.Errorf("%s demux: %w", device, o.Err))
			}
			if o.MissingRanges > 0 {
				k.u.miss("%d of %d %s demux ranges", o.MissingRanges, len(k.excl), device)
			}
			if o.MissingFanout > 0 {
				k.u.miss("fan-out entries (%d)", o.MissingFanout)
			}
		}
	}
	note(cuts, d.links.Eth0, d.eth0.Unroute(eth0))
	note(onLo, d.links.Lo, d.lo.Unroute(lo))

	// Shared ports: each container's holdings leave their spreads.
	for _, k := range cuts {
		c := k.u.c
		for _, port := range c.Shared.Ports() {
			prev := d.shared[port]
			next := holdersWithout(prev, c.Slot)
			if len(next) == len(prev) {
				k.u.miss("shared port %d holder", port)
				continue
			}
			if err := d.setShared(port, next); err != nil {
				k.u.errs = append(k.u.errs, err)
			}
		}
	}
}
