package isolator

import (
	"fmt"
	"strings"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

// What the kernel shows as held stays held. A slot, ephemeral block or
// static port that a host-side kernel object still routes to a live
// namespace is never handed out again, even when recovery cannot attribute
// the object to a container: it is reserved under a name of its own
// ("held: <object>") and reported until an operator removes the object
// (RemoveUnattributed).

// heldClaim is what one unattributed kernel object keeps reserved.
type heldClaim struct {
	id     string // its name in the ledger
	slots  []uint16
	blocks []ephemeral.Range
}

// hold reserves what h routes: its slots, the ephemeral blocks its ports
// touch and its static ports. What a record already holds is not taken
// twice (the record's claim came first); call with s.mu held.
func (s *Isolator) hold(h plane.Held) {
	c := heldClaim{id: "held: " + h.What}
	for _, sl := range h.Slots {
		if s.slots.claim(sl) {
			c.slots = append(c.slots, sl)
		}
	}
	bs := s.alloc.BlockSize()
	pool := s.alloc.Pool()
	for _, r := range h.Ports.Intersect(pool).Ranges() {
		for b := int(r.Begin) &^ (bs - 1); b <= int(r.End); b += bs {
			blk := ephemeral.Range{Begin: uint16(b), End: uint16(b + bs - 1)}
			if s.alloc.Claim(blk) == nil {
				c.blocks = append(c.blocks, blk)
			}
		}
	}
	// static ports one by one: a port another holder has stays with it
	static := h.Ports.Subtract(pool).Intersect(s.ledger.Managed())
	excl := static
	if !static.Empty() && s.ledger.Reserve(c.id, ephemeral.Request{Exclusive: static}) != nil {
		// some are another holder's: reserve the rest (rare, bounded by
		// the object's ports)
		excl = ephemeral.Set{}
		for _, p := range static.Ports() {
			if len(s.ledger.Holders(p)) == 0 {
				excl = excl.Union(ephemeral.NewSet(ephemeral.Range{Begin: p, End: p}))
			}
		}
		if !excl.Empty() {
			_ = s.ledger.Reserve(c.id, ephemeral.Request{Exclusive: excl})
		}
	}
	s.held = append(s.held, c)
	s.log.Warn("recover: kernel object still routes to a namespace but belongs to no container; what it routes stays reserved",
		"object", h.What, "slots", fmt.Sprint(c.slots), "ephemeral_blocks", len(c.blocks), "static_ports", excl.String())
}

// releaseHeld frees every hold (the operator removed the objects); call
// with s.mu held.
func (s *Isolator) releaseHeld() {
	for _, c := range s.held {
		for _, sl := range c.slots {
			s.slots.put(sl)
		}
		for _, b := range c.blocks {
			_ = s.alloc.Release(b)
		}
		s.ledger.Release(c.id)
	}
	s.held = nil
}

// inferEphemeral finds a rebuilt container's ephemeral block when the
// veth's alias does not name it (a daemon killed before it wrote the alias):
// the one aligned block of the pool among the ranges the host routes to
// it (static ports never lie in the pool). With several, the lowest is
// taken and the rest reported; with none, the container cannot be rebuilt.
func (s *Isolator) inferEphemeral(f *plane.Found) error {
	bs := s.alloc.BlockSize()
	var blocks []ephemeral.Range
	for _, r := range f.Ports.Intersect(s.alloc.Pool()).Ranges() {
		for b := (int(r.Begin) + bs - 1) &^ (bs - 1); b+bs-1 <= int(r.End); b += bs {
			blocks = append(blocks, ephemeral.Range{Begin: uint16(b), End: uint16(b + bs - 1)})
		}
	}
	if len(blocks) == 0 {
		return fmt.Errorf("no ephemeral block of %d ports among the ranges the host routes to it (%s)", bs, f.Ports)
	}
	f.Ephemeral = blocks[0]
	f.Ports = f.Ports.Subtract(ephemeral.NewSet(blocks[0]))
	if len(blocks) > 1 || !f.Ports.Intersect(s.alloc.Pool()).Empty() {
		f.Lost = append(f.Lost, "ports "+f.Ports.Intersect(s.alloc.Pool()).String()+" of the ephemeral pool (routed to it beside its block)")
		f.Ports = f.Ports.Subtract(s.alloc.Pool())
	}
	f.Lost = append(f.Lost, "ephemeral block in the veth alias (found in the host demux)")
	if rr, ok := s.dp.(interface{ RestoreRange(*plane.Found) error }); ok {
		return rr.RestoreRange(f)
	}
	return nil
}

// failed reports that recovery of one container failed: a log line, the
// report (Status lists it with the unattributed objects) and the metric
// (RecoveryReport.Failed); start-up goes on.
func (s *Isolator) failed(rep *RecoveryReport, id string, err error) {
	msg := fmt.Sprintf("container %s: recovery failed: %v", id, err)
	rep.Failed = append(rep.Failed, msg)
	s.log.Error("recover: container not recovered; left as it is, start-up goes on", "container_id", id, "err", strings.TrimSpace(err.Error()))
}
