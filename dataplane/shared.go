package dataplane

// Shared ports: flow-aware changes of the holder set.
//
// d.shared records each shared port's holders; the host demuxes record how
// its flows are spread (which virtual bucket, and which pinned client
// source port, goes to which holder: spread.Spread), rebuilt from the
// kernel when a daemon restarts. Every change of a port's holders (Setup,
// SetPorts, Teardown, RemoveStrays) goes through setShared, which asks
// spread.PlanFacts for the next spread:
//
//   - the target is the consistent assignment (spread.Assign): a joining
//     holder is due about 1/(n+1) of the buckets, a leaving holder's
//     buckets go to the others at once (its connections break anyway: its
//     sockets are gone from the spread, and a TCP peer that is not the
//     socket's owner answers with a reset);
//   - a bucket that would move away from a holder that stays moves with
//     that holder's live flows in it pinned to it. A flow is live when the
//     holder's namespace lists it (nsstats.Conns: TCP sockets in every
//     state but LISTEN/TIME_WAIT/CLOSE, and connected UDP sockets, whose
//     local port is the shared port) AND the host saw traffic for it within
//     Config.SharedIdle (30 s by default): the node that steers its source
//     port (its pin, else its bucket), on eth0 or lo, steered a packet that
//     recently (tcfilter.SpreadUse: each spread node has a mirred action of
//     its own, whose last use the kernel stamps per packet anyway). The
//     socket table is the tenant's to write (thousands of connected,
//     silent UDP sockets cost it nothing); the host's filters are not;
//   - a bucket with more live flows than fit in its pins
//     (spread.MaxPinsPerBucket) may stay with its holder, at most
//     spread.MaxHeld(n) buckets per holder (16 of the 128 a joiner is due
//     with two holders) and for at most SharedIdle (d.held records since
//     when); past that it moves with the lowest source ports that fit
//     pinned, and its other flows switch holder;
//   - the same plan goes to the eth0 and lo demuxes, so traffic from the
//     outside, the host and other containers is spread alike.
//
// The holders' sockets are read before the move; right after it, the
// holders that lost buckets are read once more and flows that began in
// between are pinned too (spread.PinLate), which saves them when their
// next packet has not arrived yet.
//
// A reconciler (every Config.SharedReconcile, 5 s by default) walks the
// shared ports that are not settled (pins left, or buckets away from the
// consistent assignment), at most maxReconcilePorts per pass, reads the
// holders' flows once per namespace and pass and the spread filters' last
// use once per pass, and plans again: pins whose flows ended or carried
// nothing for SharedIdle go, held-back buckets move once their flows fit
// or their hold has lasted SharedIdle. A port settles at most SharedIdle
// after the flows that were live at the change have ended or gone quiet.
//
// Limits. A connection that carried nothing for SharedIdle when its
// bucket moves (an idle keep-alive connection) switches holder and breaks
// at its next packet. A holder whose clients really send traffic from
// many source ports (a client it controls) keeps at most MaxHeld buckets
// for SharedIdle and MaxPinsPerBucket of each moved bucket's 256 source
// ports while the traffic lasts. Unconnected UDP sockets (the usual
// UDP server) show no flows, so a UDP flow in a bucket that moves to a
// joining holder switches holder
// (datagram protocols re-establish; a QUIC server that connects its
// per-client sockets is seen and kept). A TCP connection whose SYN reaches
// the old holder in the few milliseconds between the first reading of its
// sockets and the move of its bucket, and whose next packet arrives before
// the second reading has pinned it, is reset (the client sees a refused
// handshake and may retry). A holder whose sockets cannot be read keeps its
// buckets for at most SharedIdle, and its pins while the host sees their
// traffic.
//
// Cost. Per packet nothing changes (a spread node's action is its own
// instead of the veth's; mirred stamps its last use either way). Each
// shared port has 2 x (256 + pins) mirred actions of its own on the
// machine-wide list the kernel walks when a device is unregistered: on
// the development VM (2 busy CPUs) making a port's 256 bucket nodes took
// 8-16 ms instead of 6-7 ms, and deleting a veth took 17-29 ms with 40
// shared ports (10,240 such actions) as without them (noise). A change
// that asks about flows, and each reconciler pass, dumps eth0's and lo's
// ingress filters once (~7 ms with 16 containers: use-ms of
// BenchmarkSharedJoinLeave; it grows with the containers). A change moves ~256/(n+1) bucket nodes on each of eth0 and lo
// (~25 us each on the development VM) and reads each holder that loses
// buckets twice (before and after the move; up to maxParallelReads at a
// time). A read is four sock_diag dumps; the TCP ones walk the kernel's
// established-socket hash table, which all namespaces share unless the
// namespace was created with its own (net.ipv4.tcp_child_ehash_entries set
// in the namespace that creates the containers'), so a read costs ~1 ms on
// an idle VM and several ms on a host with tens of thousands of TCP
// sockets (TIME_WAIT included) elsewhere: a join with 15 holders took
// ~23 ms idle (BenchmarkSharedJoinLeave) and ~200 ms inside isobench on a
// busy machine.

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/netns/nsstats"
	"github.com/isolatord/isolatord/tcfilter"
)

// DefaultSharedReconcile is how often the reconciler looks at the shared
// ports whose spread is not settled (Config.SharedReconcile 0).
const DefaultSharedReconcile = 5 * time.Second

// maxReconcilePorts bounds the ports one reconciler pass plans (each costs
// a few filter changes; the namespaces are read once per pass).
const maxReconcilePorts = 64

// DefaultSharedIdle is Config.SharedIdle's default: how long a flow may go
// without traffic the host sees and keep its holder through a change, and
// how long a holder may keep back a bucket.
const DefaultSharedIdle = 30 * time.Second

func (d *DataPlane) sharedIdle() time.Duration {
	if d.cfg.SharedIdle > 0 {
		return d.cfg.SharedIdle
	}
	return DefaultSharedIdle
}

// spreadUses is the last use of shared ports' spread nodes on each host
// demux (eth0, lo); a nil map: that demux could not be read.
type spreadUses [2]map[uint16]*tcfilter.SpreadUse

// spreadUse reads the last use of the spread nodes of ports on eth0 and lo
// (one dump each). Call with d.mu held.
func (d *DataPlane) spreadUse(ports ...uint16) spreadUses {
	var u spreadUses
	for i, x := range []*tcfilter.HostDemux{d.eth0, d.lo} {
		m, err := x.SpreadUse(ports...)
		if err != nil {
			d.log.Warn("shared port: cannot read the last use of its filters; every flow its holders list counts", "err", err)
			continue
		}
		u[i] = m
	}
	return u
}

// facts are the host's facts about port for spread.PlanFacts: a flow is
// seen when the node that steers its source port (its pin, else its
// bucket) on eth0 or lo steered a packet within SharedIdle; a bucket may
// be held back until SharedIdle after its hold began. Call with d.mu held.
func (d *DataPlane) facts(port uint16, uses spreadUses, flows spread.FlowSource) spread.Facts {
	idle := d.sharedIdle()
	f := spread.Facts{Flows: d.cutFlows(port, flows), Draining: d.drain[port]}
	if uses[0] != nil && uses[1] != nil {
		eth0, lo := uses[0][port], uses[1][port]
		f.Seen = func(src spread.Flow) bool {
			for _, u := range []*tcfilter.SpreadUse{eth0, lo} {
				if u == nil {
					return true // not shared there: nothing to tell
				}
				age, ok := u.Pins[src]
				if !ok {
					age = u.Buckets[spread.Bucket(src.Port())]
				}
				if age < idle {
					return true
				}
			}
			return false
		}
	}
	now := time.Now()
	held := d.held[port]
	f.MayHold = func(b int) bool {
		since, ok := held[b]
		return !ok || now.Sub(since) < idle
	}
	return f
}

// noteHeld records which buckets of port plan holds back from their
// assigned holders, and since when. Call with d.mu held.
func (d *DataPlane) noteHeld(port uint16, hs []spread.Holder, plan *spread.Spread) {
	want, err := spread.AssignDraining(port, hs, d.drain[port])
	if err != nil {
		return
	}
	old, now := d.held[port], time.Now()
	cur := map[int]time.Time{}
	for b := range plan.Buckets {
		if plan.Buckets[b].Slot == want[b].Slot {
			continue
		}
		if since, ok := old[b]; ok {
			cur[b] = since
		} else {
			cur[b] = now
		}
	}
	if len(cur) == 0 {
		delete(d.held, port)
		return
	}
	if d.held == nil {
		d.held = map[uint16]map[int]time.Time{}
	}
	d.held[port] = cur
}

// flowCache reads the live flows of holders on a set of local ports, one
// sock_diag read per holder namespace, and remembers the answers.
type flowCache struct {
	d      *DataPlane
	ports  []uint16
	got    map[uint16]map[uint16][]spread.Flow // slot -> local port -> clients
	failed map[uint16]bool
	reads  int
}

func (d *DataPlane) newFlowCache(ports ...uint16) *flowCache {
	return &flowCache{d: d, ports: ports, got: map[uint16]map[uint16][]spread.Flow{}, failed: map[uint16]bool{}}
}

// maxParallelReads bounds the holders' namespaces read at the same time.
const maxParallelReads = 4

// asked returns the holders a planning function will ask about: the set
// does not depend on the answers (spread.Plan and spread.PinLate ask about
// holders losing buckets or having pins), so a dry run finds it.
func asked(plan func(spread.FlowSource)) []uint16 {
	seen := map[uint16]bool{}
	plan(func(slot uint16) ([]spread.Flow, bool) { seen[slot] = true; return nil, false })
	return slices.Sorted(maps.Keys(seen))
}

// prefetch reads the flows of slots that are not known yet, up to
// maxParallelReads namespaces at a time (each read is the kernel walking
// its socket hash tables). Call with d.mu held.
func (fc *flowCache) prefetch(slots []uint16) {
	type result struct {
		slot uint16
		m    map[uint16][]spread.Flow
		err  error
	}
	var todo []uint16
	paths := map[uint16]string{}
	for _, s := range slots {
		if _, ok := fc.got[s]; ok || fc.failed[s] {
			continue
		}
		if paths[s] = fc.d.nsPathOfSlot(s); paths[s] == "" {
			continue // source() reports it
		}
		todo = append(todo, s)
	}
	if len(todo) < 2 {
		return // source() reads a single one
	}
	results := make(chan result, len(todo))
	sem := make(chan struct{}, maxParallelReads)
	for _, s := range todo {
		sem <- struct{}{}
		go func(slot uint16, path string) {
			defer func() { <-sem }()
			cs, err := nsstats.Conns(path, fc.ports...)
			results <- result{slot, clientsOf(cs), err}
		}(s, paths[s])
	}
	for range todo {
		r := <-results
		fc.reads++
		if r.err != nil {
			fc.d.log.Warn("shared port: cannot read a holder's sockets; its buckets stay", "slot", r.slot, "err", r.err)
			fc.failed[r.slot] = true
			continue
		}
		fc.got[r.slot] = r.m
	}
}

// source is the spread.FlowSource of port. Call with d.mu held.
func (fc *flowCache) source(port uint16) spread.FlowSource {
	return func(slot uint16) ([]spread.Flow, bool) {
		if fc.failed[slot] {
			return nil, false
		}
		m, ok := fc.got[slot]
		if !ok {
			path := fc.d.nsPathOfSlot(slot)
			if path == "" {
				fc.d.log.Warn("shared port: holder's namespace unknown; its buckets stay", "slot", slot, "port", port)
				fc.failed[slot] = true
				return nil, false
			}
			fc.reads++
			cs, err := nsstats.Conns(path, fc.ports...)
			if err != nil {
				fc.d.log.Warn("shared port: cannot read the holder's sockets; its buckets stay", "slot", slot, "port", port, "err", err)
				fc.failed[slot] = true
				return nil, false
			}
			m = clientsOf(cs)
			fc.got[slot] = m
		}
		return m[port], true
	}
}

// listed reports whether the holder in slot listed a flow from client
// src on port when fc read it. Call with d.mu held.
func (fc *flowCache) listed(port uint16) func(slot uint16, src spread.Flow) bool {
	return func(slot uint16, src spread.Flow) bool {
		return slices.Contains(fc.got[slot][port], src)
	}
}

// clientsOf maps the local ports of a holder's connections to their
// clients, as pins match them: the remote address (an IPv4 client of a
// dual-stack socket as plain IPv4, no zone) and port.
func clientsOf(cs []nsstats.Conn) map[uint16][]spread.Flow {
	m := map[uint16][]spread.Flow{}
	for _, c := range cs {
		a := c.Remote.Addr().Unmap().WithZone("")
		if !a.IsValid() || a.IsUnspecified() {
			continue
		}
		p := c.Local.Port()
		m[p] = append(m[p], netip.AddrPortFrom(a, c.Remote.Port()))
	}
	return m
}

// nsPathOfSlot is the pinned namespace of the container in slot ("" if
// unknown). Call with d.mu held.
func (d *DataPlane) nsPathOfSlot(slot uint16) string {
	id, ok := d.slots[slot]
	if !ok {
		return ""
	}
	if rec, ok := d.ctrs[id]; ok {
		return rec.pin.Path
	}
	return ""
}

// setShared gives port the holders hs (none: the port stops being shared),
// keeping the live flows of the holders that stay (see the notes above),
// on both host demuxes, and records hs. On failure the demuxes are put back
// to the spread they had. Call with d.mu held.
func (d *DataPlane) setShared(port uint16, hs []spread.Holder) error {
	return d.reshare(port, hs, d.newFlowCache(port))
}

func (d *DataPlane) reshare(port uint16, hs []spread.Holder, fc *flowCache) error {
	old, wasShared := d.eth0.Spread(port)
	if len(hs) == 0 {
		if err := d.eth0.Unshare(port); err != nil {
			return fmt.Errorf("shared port %d on %s: %w", port, d.links.Eth0, err)
		}
		if err := d.lo.Unshare(port); err != nil {
			var rerr error
			if wasShared {
				rerr = d.eth0.SetSpread(port, old)
			}
			return errors.Join(fmt.Errorf("shared port %d on %s: %w", port, d.links.Lo, err), rerr)
		}
		delete(d.shared, port)
		delete(d.held, port)
		delete(d.drain, port)
		return nil
	}
	var (
		cur  *spread.Spread
		uses spreadUses
	)
	if wasShared {
		cur = &old
	}
	// The holders asked about do not depend on the facts: when none is (a
	// leave with no pins left), the filters' last use need not be read.
	need := asked(func(f spread.FlowSource) { spread.PlanFacts(port, hs, cur, spread.Facts{Flows: f}) })
	if len(need) > 0 {
		uses = d.spreadUse(port)
	}
	fc.prefetch(need)
	plan, err := spread.PlanFacts(port, hs, cur, d.facts(port, uses, fc.source(port)))
	if err != nil {
		return fmt.Errorf("shared port %d: %w", port, err)
	}
	if d.planned != nil {
		d.planned(port)
	}
	if err := d.installSpread(port, plan, cur); err != nil {
		return err
	}
	d.shared[port] = slices.Clone(hs)
	d.pruneDrain(port, hs)
	d.noteHeld(port, hs, &plan)
	d.pinLate(port, hs, cur, plan, fc)
	return nil
}

// pinLate re-reads, after plan was installed over prev, the sockets of the
// holders that lost buckets and pins the flows that began in between
// (spread.PinLate; flows that planning read in before were decided on
// then). A failure here is logged: the change itself is done.
func (d *DataPlane) pinLate(port uint16, hs []spread.Holder, prev *spread.Spread, plan spread.Spread, before *flowCache) {
	if prev == nil {
		return
	}
	fc := d.newFlowCache(port)
	fc.prefetch(asked(func(f spread.FlowSource) { spread.PinLate(prev, &plan, hs, f, nil) }))
	next, changed := spread.PinLate(prev, &plan, hs, fc.source(port), before.listed(port))
	if !changed {
		return
	}
	if err := d.installSpread(port, next, &plan); err != nil {
		d.log.Warn("shared port: pinning flows that began during a change failed", "port", port, "err", err)
		return
	}
	d.log.Debug("shared port: pinned flows that began during a change", "port", port, "pins", len(next.Pins)-len(plan.Pins))
}

// installSpread puts plan on eth0, then lo; if lo fails, eth0 goes back to
// old (or stops sharing the port if old is nil).
func (d *DataPlane) installSpread(port uint16, plan spread.Spread, old *spread.Spread) error {
	if err := d.eth0.SetSpread(port, plan); err != nil {
		return fmt.Errorf("shared port %d on %s: %w", port, d.links.Eth0, err)
	}
	if err := d.lo.SetSpread(port, plan); err != nil {
		var rerr error
		if old != nil {
			rerr = d.eth0.SetSpread(port, *old)
		} else {
			rerr = d.eth0.Unshare(port)
		}
		return errors.Join(fmt.Errorf("shared port %d on %s: %w", port, d.links.Lo, err), rerr)
	}
	return nil
}

// SharedState is how one shared port's flows are spread now (from the host
// eth0 demux), for diagnosis and tests.
type SharedState struct {
	Holders []spread.Holder
	Spread  spread.Spread
	Settled bool // the consistent assignment, no pins
}

// Shared returns the state of shared port port, and whether it is shared.
func (d *DataPlane) Shared(port uint16) (SharedState, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	hs, ok := d.shared[port]
	if !ok || d.eth0 == nil {
		return SharedState{}, false
	}
	st := SharedState{Holders: slices.Clone(hs)}
	st.Spread, _ = d.eth0.Spread(port)
	if want, err := spread.AssignDraining(port, hs, d.drain[port]); err == nil {
		st.Settled = st.Spread.Settled(&want)
	}
	return st, true
}

// reconcileShared makes one reconciler pass (see the notes above) and
// returns how many ports it changed and how many remain unsettled. Call
// with d.mu held.
func (d *DataPlane) reconcileShared() (changed, unsettled int, err error) {
	if d.closed || !d.prepared {
		return 0, 0, nil
	}
	ports := make([]uint16, 0, len(d.shared))
	for p := range d.shared {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	// Rotate so that a host with more unsettled ports than one pass takes
	// gets to all of them.
	if i, _ := slices.BinarySearch(ports, d.reconcileNext); i < len(ports) {
		ports = append(ports[i:], ports[:i]...)
	}
	var todo []uint16
	for _, p := range ports {
		cur, ok := d.eth0.Spread(p)
		want, werr := spread.AssignDraining(p, d.shared[p], d.drain[p])
		loCur, loOK := d.lo.Spread(p)
		if werr == nil && ok && loOK && cur.Settled(&want) && loCur.Equal(&cur) {
			continue
		}
		if len(todo) == maxReconcilePorts {
			d.reconcileNext = p
			break
		}
		todo = append(todo, p)
	}
	if len(todo) < maxReconcilePorts {
		d.reconcileNext = 0
	}
	fc := d.newFlowCache(todo...)
	var uses spreadUses
	if len(todo) > 0 {
		uses = d.spreadUse(todo...)
	}
	var need []uint16
	for _, p := range todo {
		if cur, ok := d.eth0.Spread(p); ok {
			need = append(need, asked(func(f spread.FlowSource) { spread.PlanFacts(p, d.shared[p], &cur, d.facts(p, uses, f)) })...)
		}
	}
	slices.Sort(need)
	fc.prefetch(slices.Compact(need))
	var errs []error
	for _, p := range todo {
		cur, ok := d.eth0.Spread(p)
		loCur, loOK := d.lo.Spread(p)
		var curp *spread.Spread
		if ok {
			curp = &cur
		}
		plan, perr := spread.PlanFacts(p, d.shared[p], curp, d.facts(p, uses, fc.source(p)))
		if perr != nil {
			errs = append(errs, fmt.Errorf("shared port %d: %w", p, perr))
			continue
		}
		if ok && loOK && plan.Equal(&cur) && loCur.Equal(&cur) {
			d.noteHeld(p, d.shared[p], &plan)
			unsettled++
			continue
		}
		if ierr := d.installSpread(p, plan, curp); ierr != nil {
			errs = append(errs, ierr)
			continue
		}
		d.noteHeld(p, d.shared[p], &plan)
		d.pinLate(p, d.shared[p], curp, plan, fc)
		changed++
		want, _ := spread.AssignDraining(p, d.shared[p], d.drain[p])
		if !plan.Settled(&want) {
			unsettled++
		} else {
			d.log.Debug("shared port settled", "port", p, "holders", len(d.shared[p]))
		}
	}
	return changed, unsettled, errors.Join(errs...)
}

// startReconciler starts the reconciler goroutine (once, after the host
// is prepared; Close stops it). Call with d.mu held.
func (d *DataPlane) startReconciler() {
	every := d.cfg.SharedReconcile
	if every == 0 {
		every = DefaultSharedReconcile
	}
	if every < 0 || d.reconcileStop != nil {
		return
	}
	d.reconcileStop = make(chan struct{})
	d.reconcileDone = make(chan struct{})
	go func(stop <-chan struct{}, done chan<- struct{}) {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			d.mu.Lock()
			changed, unsettled, err := d.reconcileShared()
			if changed > 0 || err != nil {
				d.recoveryKnown = nil // the demuxes changed: Check reads them live (knownOf)
			}
			d.mu.Unlock()
			if err != nil {
				d.log.Warn("shared port reconciler", "err", err)
			}
			if changed > 0 {
				d.log.Debug("shared port reconciler pass", "changed", changed, "unsettled", unsettled)
			}
		}
	}(d.reconcileStop, d.reconcileDone)
}
