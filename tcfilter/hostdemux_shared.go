package tcfilter

// Shared ports (SetSpread, Unshare): the port's node in its H2 bucket
// links to a spread table of its own, hashed on source-port bits 1..8
// into spread.Buckets buckets; each bucket ends with one redirect to its
// holder and may hold pins (one node per pinned client: its address and
// source port, hostdemux_pin.go).
// Changes add pins, then replace bucket nodes, then delete pins, so a
// pinned flow never meets its moved bucket unpinned. Which holder gets
// which bucket is package spread's (pure). Unsharing unlinks the port's
// node, then deletes the table (or leaves it empty on the stale list).
// Why the source address is not hashed: docs/datapath.md, "Host demux".

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
)

// checkSpread validates a spread to install for port.
func checkSpread(port uint16, s *spread.Spread) error {
	perBucket := map[int]int{}
	// Buckets go to the host (spread.Refuse) only all together: every
	// holder of the port drains.
	refuse := 0
	for _, h := range s.Buckets {
		if h == spread.Refuse {
			refuse++
		}
	}
	if refuse > 0 && refuse < spread.Buckets {
		return fmt.Errorf("shared port %d: %d buckets have no holder", port, refuse)
	}
	check := func(what string, h spread.Holder) error {
		if h == spread.Refuse && refuse > 0 && what[0] == 'b' {
			return nil // a bucket of a port whose holders all drain: the host
		}
		if err := checkSlot(h.Slot); err != nil {
			return fmt.Errorf("shared port %d: %s: %w", port, what, err)
		}
		if h.Target <= 0 {
			return fmt.Errorf("shared port %d: %s: slot %d: target ifindex %d must be positive", port, what, h.Slot, h.Target)
		}
		return nil
	}
	slotTarget := map[uint16]int{}
	same := func(h spread.Holder) error {
		if t, ok := slotTarget[h.Slot]; ok && t != h.Target {
			return fmt.Errorf("shared port %d: slot %d has two targets (%d and %d)", port, h.Slot, t, h.Target)
		}
		slotTarget[h.Slot] = h.Target
		return nil
	}
	for b, h := range s.Buckets {
		if err := check(fmt.Sprintf("bucket %d", b), h); err != nil {
			return err
		}
		if h == spread.Refuse {
			continue
		}
		if err := same(h); err != nil {
			return err
		}
	}
	for s := range s.Draining {
		if err := checkSlot(s); err != nil {
			return fmt.Errorf("shared port %d: draining: %w", port, err)
		}
	}
	for p, h := range s.Pins {
		if err := checkFlow(p); err != nil {
			return fmt.Errorf("shared port %d: %w", port, err)
		}
		if err := check(fmt.Sprintf("pin of client %s", p), h); err != nil {
			return err
		}
		if err := same(h); err != nil {
			return err
		}
		b := spread.Bucket(p.Port())
		if perBucket[b]++; perBucket[b] > spread.MaxPinsPerBucket {
			return fmt.Errorf("shared port %d: bucket %d has more than %d pins", port, b, spread.MaxPinsPerBucket)
		}
	}
	if len(slotTarget) > spread.MaxHolders {
		return fmt.Errorf("%d holders for port %d: at most %d", len(slotTarget), port, spread.MaxHolders)
	}
	return nil
}

// sharedPort is the index entry of one shared port: its spread table and
// what each of its nodes steers where.
type sharedPort struct {
	table   uint32
	buckets [spread.Buckets]spread.Holder
	present [spread.Buckets]bool
	pins    map[spread.Flow]spread.Holder
	pinIDs  map[spread.Flow]uint32 // each pin's node id in its bucket (newPinID)
	strays  []uint32               // pin-range nodes that are no pin (older layout, duplicates): the next change deletes them
	drain   map[uint16]bool        // draining holders: their marker nodes (hostdemux_drain.go)
}

// soleHolder reports whether every node of the port goes to slot.
func (sp *sharedPort) soleHolder(slot uint16) bool {
	for b, h := range sp.buckets {
		if sp.present[b] && h.Slot != slot {
			return false
		}
	}
	for _, h := range sp.pins {
		if h.Slot != slot {
			return false
		}
	}
	return true
}

func spreadNode(table uint32, b int, h spread.Holder) node {
	if h == spread.Refuse {
		return refuseNode(table, b)
	}
	return node{
		prio: PrioIP, handle: MakeU32Handle(table, uint32(b), nodeSpread), classid: ClassID(h.Slot),
		sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: h.Target, own: true,
	}
}

func pinNode(table uint32, f spread.Flow, id uint32, h spread.Holder) node {
	return node{
		prio: PrioIP, handle: MakeU32Handle(table, uint32(spread.Bucket(f.Port())), id), classid: ClassID(h.Slot),
		sel: sel(nl.TC_U32_TERMINAL, pinKeys(f)...), act: actRedirect, target: h.Target, own: true,
	}
}

func sharedLink(port uint16, table uint32) node {
	return node{
		prio:   PrioIP,
		handle: MakeU32Handle(TableH2Base+uint32(port>>8), uint32(port>>4)&15, nodeSharedBase|uint32(port&0xff)),
		link:   table,
		sel:    hashOn(sel(0, dportKey(ephemeral.Range{Begin: port, End: port})), 0, spreadHmask),
	}
}

// isSpreadNode reports whether node id nid in bucket bkt of a spread table
// is one of ours (the bucket's default node or a pin).
func isSpreadNode(bkt, nid uint32) bool {
	return bkt < spread.Buckets && (nid == nodeSpread || nid >= 1 && nid <= 0x100)
}

// indexSpread records the nodes found in the spread table of sp.
func indexSpread(sp *sharedPort, nodes []*netlink.U32) {
	for _, f := range nodes {
		_, bkt, nid := SplitU32Handle(f.Handle)
		if indexDrain(sp, f, bkt, nid) {
			continue
		}
		s, ok := slotOf(f.ClassId)
		if !ok || !isSpreadNode(bkt, nid) {
			continue
		}
		h := spread.Holder{Slot: s, Target: mirredTarget(f)}
		if nid == nodeSpread {
			sp.buckets[bkt] = h
			sp.present[bkt] = true
			continue
		}
		p, ok := pinOf(f, bkt)
		if _, dup := sp.pins[p]; !ok || dup {
			sp.strays = append(sp.strays, f.Handle)
			continue
		}
		sp.setPin(p, nid, h)
	}
}

// SetSpread makes port a shared port steered by s. The port gets a node in
// its H2 bucket linking to its own spread table, hashed on source-port
// bits 1..8 into spread.Buckets buckets; each bucket holds its pins (a key
// on the source port, node id pinID) and then one match-all redirect node.
// Changing a spread adds and retargets pins first, then retargets buckets,
// then deletes pins no longer wanted, so no packet of a pinned flow ever
// meets a bucket that has moved before its pin exists. Replaced nodes keep
// their keys (the kernel keeps a node's keys on replace), which is right:
// keys follow from handles. It is idempotent.
//
// The port must not lie in a range routed by AddRanges, except one of the
// only slot s holds the whole spread (a container switching a port between
// exclusive and shared: its old and new filters coexist for a moment and
// lead to the same container).
func (x *HostDemux) SetSpread(port uint16, s spread.Spread) error {
	if port == 0 {
		return errors.New("shared port 0 is not a port")
	}
	if err := checkSpread(port, &s); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return err
	}
	for _, o := range x.owners[port>>8] {
		if !o.r.Contains(port) {
			continue
		}
		sole := true
		for _, h := range s.Buckets {
			sole = sole && h.Slot == o.slot
		}
		for _, h := range s.Pins {
			sole = sole && h.Slot == o.slot
		}
		if !sole {
			return fmt.Errorf("shared port %d lies in range %s of slot %d: %w", port, o.r, o.slot, ErrOverlap)
		}
	}
	if sp := x.shared[port]; sp != nil {
		return x.reassign(sp, &s)
	}
	return x.share(port, &s)
}

// Unshare stops sharing port: its link node goes, then its spread table.
// Unsharing a port that is not shared does nothing.
func (x *HostDemux) Unshare(port uint16) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return err
	}
	sp := x.shared[port]
	if sp == nil {
		return nil
	}
	return x.unshare(port, sp)
}

// Spread returns how port is steered now, from the in-memory index (which
// Init rebuilds from the kernel), and whether it is shared.
func (x *HostDemux) Spread(port uint16) (spread.Spread, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	sp := x.shared[port]
	if sp == nil {
		return spread.Spread{}, false
	}
	return spread.Spread{Buckets: sp.buckets, Pins: maps.Clone(sp.pins), Draining: maps.Clone(sp.drain)}, true
}

// sharedConflict fails if r contains a shared port that some slot other
// than slot holds (any bucket or pin).
func (x *HostDemux) sharedConflict(slot uint16, r ephemeral.Range) error {
	for p, sp := range x.shared {
		if r.Contains(p) && !sp.soleHolder(slot) {
			return fmt.Errorf("range %s contains shared port %d: %w", r, p, ErrOverlap)
		}
	}
	return nil
}

func (x *HostDemux) allocSpread() (uint32, error) {
	busy := map[uint32]bool{}
	for _, t := range x.stale {
		busy[t.htid] = true
	}
	for t := uint32(TableSpreadFirst); t <= TableSpreadLast; t++ {
		if _, used := x.spreadUsed[t]; !used && !busy[t] {
			return t, nil
		}
	}
	return 0, fmt.Errorf("no free spread table (%d shared ports)", len(x.spreadUsed))
}

func (x *HostDemux) share(port uint16, want *spread.Spread) error {
	t, err := x.allocSpread()
	if err != nil {
		return err
	}
	drop := func(cause error) error {
		if _, derr := x.d.delTables([]tableRef{{KindIP, PrioIP, t}}, tableBusyTimeout); derr != nil {
			cause = errors.Join(cause, fmt.Errorf("rollback: %w", derr))
		}
		return cause
	}
	if err := x.d.addTable(KindIP, PrioIP, t, spread.Buckets); err != nil {
		return err
	}
	sp := &sharedPort{table: t}
	// replace, not add: a table left behind by a crash may hold nodes
	for _, p := range slices.SortedFunc(maps.Keys(want.Pins), cmpFlow) {
		id, h := sp.newPinID(p), want.Pins[p]
		if err := x.d.replace(KindIP, pinNode(t, p, id, h)); err != nil {
			return drop(err)
		}
		sp.setPin(p, id, h)
	}
	for b, h := range want.Buckets {
		if err := x.d.replace(KindIP, spreadNode(t, b, h)); err != nil {
			return drop(err)
		}
		sp.buckets[b], sp.present[b] = h, true
	}
	if err := x.setDrain(port, sp, want.Draining); err != nil {
		return drop(err)
	}
	hb := uint8(port >> 8)
	newH2 := false
	if !x.h2Linked[hb] {
		if err := x.linkH2(hb); err != nil {
			x.releaseH2([]uint8{hb})
			return drop(err)
		}
		newH2 = true
	}
	if err := x.d.add(KindIP, sharedLink(port, t)); err != nil {
		if newH2 {
			x.releaseH2([]uint8{hb})
		}
		return drop(fmt.Errorf("shared port %d: %w", port, err))
	}
	x.h2[hb]++
	x.shared[port] = sp
	x.spreadUsed[t] = port
	return nil
}

// reassign changes the nodes of a shared port from what sp records to
// want: new and retargeted pins, then buckets, then stale pins. On error it
// puts back what it changed (best effort) and the index follows the kernel.
func (x *HostDemux) reassign(sp *sharedPort, want *spread.Spread) (err error) {
	type undo struct {
		n   node
		pin spread.Flow // the pin n is (when it is one)
		del bool        // the node was added: delete it
	}
	var undos []undo
	defer func() {
		if err == nil {
			return
		}
		for i := len(undos) - 1; i >= 0; i-- {
			u := undos[i]
			_, bkt, nid := SplitU32Handle(u.n.handle)
			if u.del {
				if x.d.del(KindIP, PrioIP, u.n.handle) == nil {
					sp.dropPin(u.pin)
				}
				continue
			}
			if x.d.replace(KindIP, u.n) != nil {
				continue
			}
			h := spread.Holder{Slot: uint16(u.n.classid & 0xffff), Target: u.n.target}
			if nid == nodeSpread {
				sp.buckets[bkt], sp.present[bkt] = h, true
			} else {
				sp.setPin(u.pin, nid, h)
			}
		}
	}()
	oldDrain := maps.Clone(sp.drain)
	if err := x.setDrain(x.spreadUsed[sp.table], sp, want.Draining); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = x.setDrain(x.spreadUsed[sp.table], sp, oldDrain)
		}
	}()
	for _, p := range slices.SortedFunc(maps.Keys(want.Pins), cmpFlow) {
		h := want.Pins[p]
		old, had := sp.pins[p]
		if had && old == h {
			continue
		}
		id := sp.newPinID(p)
		if had {
			id = sp.pinIDs[p]
		}
		if err := x.d.replace(KindIP, pinNode(sp.table, p, id, h)); err != nil {
			return err
		}
		if had {
			undos = append(undos, undo{n: pinNode(sp.table, p, id, old), pin: p})
		} else {
			undos = append(undos, undo{n: pinNode(sp.table, p, id, h), pin: p, del: true})
		}
		sp.setPin(p, id, h)
	}
	for b, h := range want.Buckets {
		if sp.present[b] && sp.buckets[b] == h {
			continue
		}
		if err := x.d.replace(KindIP, spreadNode(sp.table, b, h)); err != nil {
			return err
		}
		if sp.present[b] {
			undos = append(undos, undo{n: spreadNode(sp.table, b, sp.buckets[b])})
		}
		sp.buckets[b], sp.present[b] = h, true
	}
	for _, p := range slices.SortedFunc(maps.Keys(sp.pins), cmpFlow) {
		if _, keep := want.Pins[p]; keep {
			continue
		}
		old, id := sp.pins[p], sp.pinIDs[p]
		if err := x.d.del(KindIP, PrioIP, pinNode(sp.table, p, id, old).handle); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		undos = append(undos, undo{n: pinNode(sp.table, p, id, old), pin: p})
		sp.dropPin(p)
	}
	x.dropStrays(sp)
	return nil
}

// dropStrays deletes the nodes of sp's table in the pin range that are no
// pin the index knows (a pin keyed on the source port alone, from an older
// daemon, or a second node for one client): they would steer packets the
// planner does not know of (newPinID never reuses their ids). Best
// effort: what fails stays listed.
func (x *HostDemux) dropStrays(sp *sharedPort) {
	var left []uint32
	for _, h := range sp.strays {
		if err := x.d.del(KindIP, PrioIP, h); err != nil && !errors.Is(err, unix.ENOENT) {
			left = append(left, h)
		}
	}
	sp.strays = left
}

func (x *HostDemux) unshare(port uint16, sp *sharedPort) error {
	err := x.d.del(KindIP, PrioIP, sharedLink(port, sp.table).handle)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	hb := uint8(port >> 8)
	delete(x.shared, port)
	delete(x.spreadUsed, sp.table)
	x.h2[hb]--
	// The table is unreachable now. If the kernel still holds it busy, empty
	// it (so no node tagged with a slot outlives the sharing) and leave the
	// empty table to the stale list.
	t := tableRef{KindIP, PrioIP, sp.table}
	if busy, _ := x.d.delTables([]tableRef{t}, 0); len(busy) > 0 {
		var hs []uint32
		for p, id := range sp.pinIDs {
			hs = append(hs, MakeU32Handle(sp.table, uint32(spread.Bucket(p.Port())), id))
		}
		for b := range spread.Buckets {
			hs = append(hs, MakeU32Handle(sp.table, uint32(b), nodeSpread))
		}
		for s := range sp.drain {
			hs = append(hs, drainHandle(sp.table, s))
		}
		hs = append(hs, sp.strays...)
		for _, h := range hs {
			if err := x.d.del(KindIP, PrioIP, h); err != nil && !errors.Is(err, unix.ENOENT) {
				break // the table delete will take the rest
			}
		}
		x.addStale(t)
	}
	x.releaseH2([]uint8{hb})
	return nil
}
