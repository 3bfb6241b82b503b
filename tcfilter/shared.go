package tcfilter

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
)

// Holder is one container holding a shared port.
type Holder struct {
	Slot   uint16
	Target int // ifindex of its host-side veth
}

// sharedPort is the index entry of one shared port: its spread table and
// the holder of each virtual bucket.
type sharedPort struct {
	table   uint32
	buckets [SpreadBuckets]Holder
	present [SpreadBuckets]bool
}

// MaxHolders is the largest number of containers that can share a port:
// each holder gets at least one of the SpreadBuckets virtual buckets.
const MaxHolders = SpreadBuckets

// score is the rendezvous weight of holder slot for bucket b of port.
func score(port uint16, b int, slot uint16) uint64 {
	z := uint64(port)<<32 | uint64(b)<<16 | uint64(slot)
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
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
	if len(holders) == 0 {
		return out, errors.New("no holders")
	}
	if len(holders) > MaxHolders {
		return out, fmt.Errorf("%d holders for port %d: at most %d", len(holders), port, MaxHolders)
	}
	hs := slices.Clone(holders)
	slices.SortFunc(hs, func(a, b Holder) int { return int(a.Slot) - int(b.Slot) })
	for i := 1; i < len(hs); i++ {
		if hs[i].Slot == hs[i-1].Slot {
			return out, fmt.Errorf("port %d: slot %d listed twice", port, hs[i].Slot)
		}
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

func spreadNode(table uint32, b int, h Holder) node {
	return node{
		prio: PrioIP, handle: MakeU32Handle(table, uint32(b), nodeSpread), classid: ClassID(h.Slot),
		sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: h.Target,
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

// SetShared makes port a shared port whose flows are spread over holders,
// or, with no holders, stops sharing it. The port gets a node in its H2
// bucket linking to its own spread table, hashed on source-port bits 1..6
// into SpreadBuckets buckets, each one redirect node to the holder chosen
// by Assign. Changing the holders replaces only the buckets whose holder
// changes (a replace keeps the match-all key, which is what we want). It is
// idempotent. The port must not lie in a range routed by AddRanges.
func (x *HostDemux) SetShared(port uint16, holders []Holder) error {
	if port == 0 {
		return errors.New("shared port 0 is not a port")
	}
	for _, h := range holders {
		if err := checkSlot(h.Slot); err != nil {
			return fmt.Errorf("shared port %d: %w", port, err)
		}
		if h.Target <= 0 {
			return fmt.Errorf("shared port %d: slot %d: target ifindex %d must be positive", port, h.Slot, h.Target)
		}
	}
	var want [SpreadBuckets]Holder
	if len(holders) > 0 {
		var err error
		if want, err = Assign(port, holders); err != nil {
			return err
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return err
	}
	sp := x.shared[port]
	switch {
	case len(holders) == 0 && sp == nil:
		return nil
	case len(holders) == 0:
		return x.unshare(port, sp)
	case sp != nil:
		return x.reassign(sp, want)
	}
	for _, o := range x.owners[port>>8] {
		if o.r.Contains(port) {
			return fmt.Errorf("shared port %d lies in range %s of slot %d: %w", port, o.r, o.slot, ErrOverlap)
		}
	}
	return x.share(port, want)
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

func (x *HostDemux) share(port uint16, want [SpreadBuckets]Holder) error {
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
	for b, h := range want {
		// replace, not add: a table left behind by a crash may hold nodes
		if err := x.d.replace(KindIP, spreadNode(t, b, h)); err != nil {
			return drop(err)
		}
		sp.buckets[b], sp.present[b] = h, true
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

func (x *HostDemux) reassign(sp *sharedPort, want [SpreadBuckets]Holder) error {
	var done []int
	old := sp.buckets
	oldPresent := sp.present
	for b, h := range want {
		if sp.present[b] && sp.buckets[b] == h {
			continue
		}
		if err := x.d.replace(KindIP, spreadNode(sp.table, b, h)); err != nil {
			for _, d := range done { // best effort: put the old holders back
				if oldPresent[d] && x.d.replace(KindIP, spreadNode(sp.table, d, old[d])) == nil {
					sp.buckets[d] = old[d]
				}
			}
			return err
		}
		sp.buckets[b], sp.present[b] = h, true
		done = append(done, b)
	}
	return nil
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
		for b := range SpreadBuckets {
			if err := x.d.del(KindIP, PrioIP, MakeU32Handle(sp.table, uint32(b), nodeSpread)); err != nil && !errors.Is(err, unix.ENOENT) {
				break // the table delete will take the rest
			}
		}
		x.addStale(t)
	}
	x.releaseH2([]uint8{hb})
	return nil
}
