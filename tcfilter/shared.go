package tcfilter

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
)

// Holder is one container holding a shared port.
type Holder struct {
	Slot   uint16
	Target int // ifindex of its host-side veth
}

// MaxHolders is the largest number of containers that can share a port:
// each holder gets at least one of the SpreadBuckets virtual buckets.
const MaxHolders = SpreadBuckets

// MaxPinsPerBucket bounds the pinned source ports in one spread bucket, and
// so the extra key checks a packet of that bucket can meet before the
// bucket's own node.
const MaxPinsPerBucket = 16

// SpreadBucket is the virtual bucket of a shared port that the flows from
// client source port srcPort fall into: source-port bits 1..8, exactly what
// the spread table hashes.
func SpreadBucket(srcPort uint16) int { return int(srcPort>>1) & (SpreadBuckets - 1) }

// pinID is the node id of the pin of srcPort inside its bucket (1..0x100):
// the source ports of one bucket differ only in bits 0 and 9..15.
func pinID(srcPort uint16) uint32 { return 1 + (uint32(srcPort>>9)<<1 | uint32(srcPort&1)) }

// Spread is how a shared port's flows are steered. Each of the
// SpreadBuckets virtual buckets (SpreadBucket of the client's source port)
// goes to one holder; a pinned source port goes to its pin's holder
// whatever its bucket. Pins keep established flows on the holder that has
// their sockets while their bucket moves to another holder (see PlanSpread).
type Spread struct {
	Buckets [SpreadBuckets]Holder
	Pins    map[uint16]Holder // client source port -> holder
}

// Holder returns where a packet from client source port srcPort goes.
func (s *Spread) Holder(srcPort uint16) Holder {
	if h, ok := s.Pins[srcPort]; ok {
		return h
	}
	return s.Buckets[SpreadBucket(srcPort)]
}

// Equal reports whether s and o steer every source port the same way.
func (s *Spread) Equal(o *Spread) bool {
	return s.Buckets == o.Buckets && maps.Equal(s.Pins, o.Pins)
}

// Clone returns a deep copy of s.
func (s *Spread) Clone() Spread {
	return Spread{Buckets: s.Buckets, Pins: maps.Clone(s.Pins)}
}

// Settled reports whether s is the consistent assignment want with no pins.
func (s *Spread) Settled(want *[SpreadBuckets]Holder) bool {
	return len(s.Pins) == 0 && s.Buckets == *want
}

// score is the rendezvous weight of holder slot for bucket b of port.
func score(port uint16, b int, slot uint16) uint64 {
	z := uint64(port)<<32 | uint64(b)<<16 | uint64(slot)
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// checkHolders validates a holder list and returns it sorted by slot.
func checkHolders(port uint16, holders []Holder) ([]Holder, error) {
	if len(holders) == 0 {
		return nil, errors.New("no holders")
	}
	if len(holders) > MaxHolders {
		return nil, fmt.Errorf("%d holders for port %d: at most %d", len(holders), port, MaxHolders)
	}
	hs := slices.Clone(holders)
	slices.SortFunc(hs, func(a, b Holder) int { return int(a.Slot) - int(b.Slot) })
	for i := 1; i < len(hs); i++ {
		if hs[i].Slot == hs[i-1].Slot {
			return nil, fmt.Errorf("port %d: slot %d listed twice", port, hs[i].Slot)
		}
	}
	return hs, nil
}

// Assign maps each of the SpreadBuckets virtual buckets of port to a holder
// by rendezvous hashing on (port, bucket, slot): the result depends only on
// the set of slots, adding a holder moves about 1/(n+1) of the buckets (all
// to the new holder) and removing one moves only its own buckets. Holders
// that would get no bucket then take, one by one in slot order, the bucket
// they rank highest among those of holders with more than one bucket, so
// every holder receives traffic and shows up in the kernel.
func Assign(port uint16, holders []Holder) ([SpreadBuckets]Holder, error) {
	var out [SpreadBuckets]Holder
	hs, err := checkHolders(port, holders)
	if err != nil {
		return out, err
	}
	count := map[uint16]int{}
	for b := range out {
		best, bestScore := 0, uint64(0)
		for i, h := range hs {
			if s := score(port, b, h.Slot); i == 0 || s > bestScore {
				best, bestScore = i, s
			}
		}
		out[b] = hs[best]
		count[hs[best].Slot]++
	}
	for _, h := range hs {
		if count[h.Slot] > 0 {
			continue
		}
		best, bestScore := -1, uint64(0)
		for b := range out {
			if count[out[b].Slot] < 2 {
				continue
			}
			if s := score(port, b, h.Slot); best < 0 || s > bestScore {
				best, bestScore = b, s
			}
		}
		count[out[best].Slot]--
		out[best] = h
		count[h.Slot]++
	}
	return out, nil
}

// FlowSource reports the live flows of a shared port in one holder's
// namespace: the client (remote) source ports of its connected sockets on
// the port. ok is false when they could not be read.
type FlowSource func(slot uint16) (srcPorts []uint16, ok bool)

// PlanSpread returns the spread for port with holders, moving from cur (nil
// when the port is not shared yet) towards Assign(port, holders) without
// breaking a live flow of a holder that stays:
//
//   - a bucket whose holder left goes to its assigned holder at once (the
//     leaver's flows break anyway), and pins of holders that left go;
//   - a bucket whose holder stays but is assigned to another holder moves
//     if its holder has no live flow in it; if it has at most
//     MaxPinsPerBucket distinct source ports there, the bucket moves and
//     those ports are pinned to its holder; with more, the bucket stays
//     (a later call moves it as its flows end);
//   - a pin stays while its holder is still a holder, is not the holder of
//     its bucket, and has a live flow from that source port.
//
// flows is asked only about holders that have a bucket to move or pins;
// when it cannot tell (ok false), that holder keeps its buckets and pins.
// The result depends only on holders, cur and the flows, so calling it
// again with the same inputs changes nothing.
func PlanSpread(port uint16, holders []Holder, cur *Spread, flows FlowSource) (Spread, error) {
	want, err := Assign(port, holders)
	if err != nil {
		return Spread{}, err
	}
	out := Spread{Buckets: want}
	if cur == nil {
		return out, nil
	}
	byslot := make(map[uint16]Holder, len(holders))
	for _, h := range holders {
		byslot[h.Slot] = h
	}
	type known struct {
		ports map[int][]uint16 // bucket -> distinct source ports
		has   map[uint16]bool
		ok    bool
	}
	cache := map[uint16]*known{}
	live := func(slot uint16) *known {
		if k, ok := cache[slot]; ok {
			return k
		}
		k := &known{ports: map[int][]uint16{}, has: map[uint16]bool{}}
		if flows != nil {
			var ps []uint16
			ps, k.ok = flows(slot)
			for _, p := range ps {
				if !k.has[p] {
					k.has[p] = true
					b := SpreadBucket(p)
					k.ports[b] = append(k.ports[b], p)
				}
			}
		}
		cache[slot] = k
		return k
	}
	pins := map[uint16]Holder{}
	for b := range out.Buckets {
		old := cur.Buckets[b]
		h, stays := byslot[old.Slot]
		if !stays || old.Slot == want[b].Slot {
			continue
		}
		k := live(old.Slot)
		switch ps := k.ports[b]; {
		case !k.ok || len(ps) > MaxPinsPerBucket:
			out.Buckets[b] = h
		default:
			for _, p := range ps {
				pins[p] = h
			}
		}
	}
	for p, ph := range cur.Pins {
		h, stays := byslot[ph.Slot]
		if !stays || out.Buckets[SpreadBucket(p)].Slot == h.Slot {
			continue
		}
		if k := live(h.Slot); !k.ok || k.has[p] {
			pins[p] = h
		}
	}
	// A bucket never carries more than MaxPinsPerBucket pins: if the pins
	// kept from before and those of a bucket moving now exceed it, the
	// bucket stays with its holder this time (whose new pins then go; the
	// kept ones were within the bound already).
	perBucket := map[int]int{}
	for p, h := range pins {
		if b := SpreadBucket(p); out.Buckets[b].Slot != h.Slot {
			perBucket[b]++
		}
	}
	for b, n := range perBucket {
		if old := cur.Buckets[b]; n > MaxPinsPerBucket {
			if h, stays := byslot[old.Slot]; stays {
				out.Buckets[b] = h
			}
		}
	}
	for p, h := range pins {
		if out.Buckets[SpreadBucket(p)].Slot != h.Slot {
			if out.Pins == nil {
				out.Pins = map[uint16]Holder{}
			}
			out.Pins[p] = h
		}
	}
	return out, nil
}

// PinLate returns s with pins added for flows that began while s was being
// installed: for every bucket that s moved away from a holder that is still
// in holders (prev is what was there before), the holder's flows in that
// bucket (asked of flows now) that s does not pin yet, as long as the
// bucket stays within MaxPinsPerBucket. The flows PlanSpread saw were read
// before the move; a connection whose first packet reached the old holder
// in between is caught here if its next packet has not arrived yet. changed
// reports whether any pin was added. Only holders that lost a bucket are
// asked.
func PinLate(prev, s *Spread, holders []Holder, flows FlowSource) (next Spread, changed bool) {
	next = s.Clone()
	byslot := make(map[uint16]Holder, len(holders))
	for _, h := range holders {
		byslot[h.Slot] = h
	}
	perBucket := map[int]int{}
	for p := range next.Pins {
		perBucket[SpreadBucket(p)]++
	}
	lost := map[uint16][]int{} // slot -> buckets it lost
	for b := range s.Buckets {
		old := prev.Buckets[b]
		if _, stays := byslot[old.Slot]; stays && old.Slot != s.Buckets[b].Slot {
			lost[old.Slot] = append(lost[old.Slot], b)
		}
	}
	for _, slot := range slices.Sorted(maps.Keys(lost)) {
		ps, ok := flows(slot)
		if !ok {
			continue
		}
		moved := map[int]bool{}
		for _, b := range lost[slot] {
			moved[b] = true
		}
		for _, p := range ps {
			b := SpreadBucket(p)
			if _, pinned := next.Pins[p]; pinned || !moved[b] || perBucket[b] >= MaxPinsPerBucket {
				continue
			}
			if next.Pins == nil {
				next.Pins = map[uint16]Holder{}
			}
			next.Pins[p] = byslot[slot]
			perBucket[b]++
			changed = true
		}
	}
	return next, changed
}

// checkSpread validates a spread to install for port.
func checkSpread(port uint16, s *Spread) error {
	perBucket := map[int]int{}
	check := func(what string, h Holder) error {
		if err := checkSlot(h.Slot); err != nil {
			return fmt.Errorf("shared port %d: %s: %w", port, what, err)
		}
		if h.Target <= 0 {
			return fmt.Errorf("shared port %d: %s: slot %d: target ifindex %d must be positive", port, what, h.Slot, h.Target)
		}
		return nil
	}
	slotTarget := map[uint16]int{}
	same := func(h Holder) error {
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
		if err := same(h); err != nil {
			return err
		}
	}
	for p, h := range s.Pins {
		if err := check(fmt.Sprintf("pin of source port %d", p), h); err != nil {
			return err
		}
		if err := same(h); err != nil {
			return err
		}
		b := SpreadBucket(p)
		if perBucket[b]++; perBucket[b] > MaxPinsPerBucket {
			return fmt.Errorf("shared port %d: bucket %d has more than %d pins", port, b, MaxPinsPerBucket)
		}
	}
	if len(slotTarget) > MaxHolders {
		return fmt.Errorf("%d holders for port %d: at most %d", len(slotTarget), port, MaxHolders)
	}
	return nil
}

// sharedPort is the index entry of one shared port: its spread table and
// what each of its nodes steers where.
type sharedPort struct {
	table   uint32
	buckets [SpreadBuckets]Holder
	present [SpreadBuckets]bool
	pins    map[uint16]Holder
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

func spreadNode(table uint32, b int, h Holder) node {
	return node{
		prio: PrioIP, handle: MakeU32Handle(table, uint32(b), nodeSpread), classid: ClassID(h.Slot),
		sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: h.Target,
	}
}

func pinNode(table uint32, srcPort uint16, h Holder) node {
	return node{
		prio: PrioIP, handle: MakeU32Handle(table, uint32(SpreadBucket(srcPort)), pinID(srcPort)), classid: ClassID(h.Slot),
		sel: sel(nl.TC_U32_TERMINAL, sportKey(ephemeral.Range{Begin: srcPort, End: srcPort})), act: actRedirect, target: h.Target,
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
	return bkt < SpreadBuckets && (nid == nodeSpread || nid >= 1 && nid <= 0x100)
}

// indexSpread records the nodes found in the spread table of sp.
func indexSpread(sp *sharedPort, nodes []*netlink.U32) {
	for _, f := range nodes {
		_, bkt, nid := SplitU32Handle(f.Handle)
		s, ok := slotOf(f.ClassId)
		if !ok || !isSpreadNode(bkt, nid) {
			continue
		}
		h := Holder{Slot: s, Target: mirredTarget(f)}
		if nid == nodeSpread {
			sp.buckets[bkt] = h
			sp.present[bkt] = true
			continue
		}
		if f.Sel == nil || len(f.Sel.Keys) != 1 || f.Sel.Keys[0].Off != 0 || f.Sel.Keys[0].Mask != 0xffff0000 {
			continue
		}
		p := uint16(f.Sel.Keys[0].Val >> 16)
		if uint32(SpreadBucket(p)) != bkt || pinID(p) != nid {
			continue
		}
		if sp.pins == nil {
			sp.pins = map[uint16]Holder{}
		}
		sp.pins[p] = h
	}
}

// SetShared makes port a shared port whose flows are spread over holders
// by the consistent assignment (Assign), without pins, or, with no holders,
// stops sharing it. It does not look at live flows: see PlanSpread and
// SetSpread for changes that keep them. It is idempotent.
func (x *HostDemux) SetShared(port uint16, holders []Holder) error {
	if len(holders) == 0 {
		return x.Unshare(port)
	}
	for _, h := range holders {
		if err := checkSlot(h.Slot); err != nil {
			return fmt.Errorf("shared port %d: %w", port, err)
		}
	}
	want, err := Assign(port, holders)
	if err != nil {
		return err
	}
	return x.SetSpread(port, Spread{Buckets: want})
}

// SetSpread makes port a shared port steered by s. The port gets a node in
// its H2 bucket linking to its own spread table, hashed on source-port
// bits 1..8 into SpreadBuckets buckets; each bucket holds its pins (a key
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
func (x *HostDemux) SetSpread(port uint16, s Spread) error {
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
func (x *HostDemux) Spread(port uint16) (Spread, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	sp := x.shared[port]
	if sp == nil {
		return Spread{}, false
	}
	return Spread{Buckets: sp.buckets, Pins: maps.Clone(sp.pins)}, true
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

func (x *HostDemux) share(port uint16, want *Spread) error {
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
	if err := x.d.addTable(KindIP, PrioIP, t, SpreadBuckets); err != nil {
		return err
	}
	sp := &sharedPort{table: t}
	// replace, not add: a table left behind by a crash may hold nodes
	for p, h := range want.Pins {
		if err := x.d.replace(KindIP, pinNode(t, p, h)); err != nil {
			return drop(err)
		}
	}
	for b, h := range want.Buckets {
		if err := x.d.replace(KindIP, spreadNode(t, b, h)); err != nil {
			return drop(err)
		}
		sp.buckets[b], sp.present[b] = h, true
	}
	sp.pins = maps.Clone(want.Pins)
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
func (x *HostDemux) reassign(sp *sharedPort, want *Spread) (err error) {
	type undo struct {
		n   node
		del bool // the node was added: delete it
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
					for p := range sp.pins {
						if uint32(SpreadBucket(p)) == bkt && pinID(p) == nid {
							delete(sp.pins, p)
						}
					}
				}
				continue
			}
			if x.d.replace(KindIP, u.n) != nil {
				continue
			}
			h := Holder{Slot: uint16(u.n.classid & 0xffff), Target: u.n.target}
			if nid == nodeSpread {
				sp.buckets[bkt], sp.present[bkt] = h, true
			} else if p, ok := pinPort(u.n); ok {
				sp.pins[p] = h
			}
		}
	}()
	if sp.pins == nil {
		sp.pins = map[uint16]Holder{}
	}
	for _, p := range slices.Sorted(maps.Keys(want.Pins)) {
		h := want.Pins[p]
		old, had := sp.pins[p]
		if had && old == h {
			continue
		}
		if err := x.d.replace(KindIP, pinNode(sp.table, p, h)); err != nil {
			return err
		}
		if had {
			undos = append(undos, undo{n: pinNode(sp.table, p, old)})
		} else {
			undos = append(undos, undo{n: pinNode(sp.table, p, h), del: true})
		}
		sp.pins[p] = h
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
	for _, p := range slices.Sorted(maps.Keys(sp.pins)) {
		if _, keep := want.Pins[p]; keep {
			continue
		}
		old := sp.pins[p]
		if err := x.d.del(KindIP, PrioIP, pinNode(sp.table, p, old).handle); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		undos = append(undos, undo{n: pinNode(sp.table, p, old)})
		delete(sp.pins, p)
	}
	return nil
}

// pinPort reads the source port of a pin node description.
func pinPort(n node) (uint16, bool) {
	if n.sel == nil || len(n.sel.Keys) != 1 || n.sel.Keys[0].Mask != 0xffff0000 {
		return 0, false
	}
	return uint16(n.sel.Keys[0].Val >> 16), true
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
		for p := range sp.pins {
			hs = append(hs, MakeU32Handle(sp.table, uint32(SpreadBucket(p)), pinID(p)))
		}
		for b := range SpreadBuckets {
			hs = append(hs, MakeU32Handle(sp.table, uint32(b), nodeSpread))
		}
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
