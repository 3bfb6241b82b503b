package isolator

import (
	"context"
	"fmt"
	"strings"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

// The kernel is the truth, the database a journal. Before recovery
// resolves the records, rebuild gives a record to every container the
// kernel shows (DataPlane.Discover) that the database does not know, or
// knows only as prepared: its state is missing, emptied, corrupt (moved
// aside), another --state-dir, or out of date. What the kernel does not
// say (labels, creation time when the veth alias is gone) is named in the
// record's Lost. Kernel objects that belong to no container are left in
// place and reported (RecoveryReport.Unattributed); RemoveUnattributed
// removes them when an operator asks.
//
// The rebuilt records are written in one transaction: a daemon killed
// during the rebuild finds either all of them or none, and the kernel
// unchanged either way, so a restart ends in the same state.

// rebuild merges the kernel's containers into recs.
//
// Rights come from the host side only (Discover): a container's tenant may
// have changed anything inside its namespace, which never adds a right.
// Where Discover found the tenant's ip_local_port_range changed, it wrote
// the block back; that is logged and counted here. What the kernel still
// routes to a namespace that cannot be rebuilt is returned as held.
func (s *Isolator) rebuild(ctx context.Context, recs []*Record, rep *RecoveryReport) ([]*Record, []plane.Held, error) {
	var known []string
	for _, r := range recs {
		if r.State != StatePrepared {
			known = append(known, r.ID)
		}
	}
	disc, err := s.dp.Discover(ctx, known)
	if err != nil {
		return recs, nil, fmt.Errorf("read containers from the kernel: %w", err)
	}
	rep.Unattributed = append(rep.Unattributed, disc.Unattributed...)
	held := disc.Held
	byID := make(map[string]int, len(recs))
	slotHolder := make(map[uint16]string, len(recs))
	for i, r := range recs {
		byID[r.ID] = i
		slotHolder[r.Slot] = r.ID
	}
	var rebuilt []*Record
	for _, f := range disc.Found {
		i, known := byID[f.ID]
		if known && recs[i].State != StatePrepared {
			continue // the record knows it: recovery checks it
		}
		if h, ok := slotHolder[f.Slot]; ok && h != f.ID {
			what := fmt.Sprintf("veth %s of container %s: its slot %d belongs to the record of container %s", f.Veth, f.ID, f.Slot, h)
			rep.Unattributed = append(rep.Unattributed, what)
			held = append(held, plane.Held{What: what, Ports: f.Ports.Union(ephemeral.NewSet(f.Ephemeral))})
			continue
		}
		if f.Ephemeral == (ephemeral.Range{}) {
			if err := s.inferEphemeral(&f); err != nil {
				what := fmt.Sprintf("veth %s of container %s: %v", f.Veth, f.ID, err)
				rep.Unattributed = append(rep.Unattributed, what)
				held = append(held, plane.Held{What: what, Slots: []uint16{f.Slot}, Ports: f.Ports})
				continue
			}
		}
		if f.TenantRange != "" {
			rep.RangesRestored = append(rep.RangesRestored, fmt.Sprintf("%s: %s -> %s", f.ID, f.TenantRange, f.Ephemeral))
			s.log.Warn("recover: the tenant had changed its ip_local_port_range; its block, as the host side proves it, was written back",
				"container_id", f.ID, "tenant_range", f.TenantRange, "ephemeral", f.Ephemeral.String())
		}
		r := recordFromKernel(f)
		if known {
			r.Created, r.Labels = recs[i].Created, recs[i].Labels
			r.Egress, r.Ingress = f.Egress, f.Ingress
			r.Lost = nil
			delete(slotHolder, recs[i].Slot)
			recs[i] = r
		} else {
			recs = append(recs, r)
			byID[r.ID] = len(recs) - 1
		}
		slotHolder[r.Slot] = r.ID
		rebuilt = append(rebuilt, r)
	}
	if len(rebuilt) == 0 {
		return recs, held, nil
	}
	if err := s.store.PutAll(rebuilt); err != nil {
		return recs, held, fmt.Errorf("persist %d containers rebuilt from the kernel: %w", len(rebuilt), err)
	}
	for _, r := range rebuilt {
		rep.Rebuilt = append(rep.Rebuilt, r.ID)
		attrs := []any{"container_id", r.ID, "slot", r.Slot, "ephemeral", r.Ephemeral.String(),
			"ports", portsString(r.Ports, r.Shared), "egress_limit", LimitString(r.Egress), "ingress_limit", LimitString(r.Ingress)}
		if len(r.Lost) > 0 {
			attrs = append(attrs, "not_recovered", strings.Join(r.Lost, ", "))
		}
		s.log.Warn("recover: container unknown to the state, rebuilt from the kernel", attrs...)
	}
	return recs, held, nil
}

// recordFromKernel is the record of a container found in the kernel.
func recordFromKernel(f plane.Found) *Record {
	return &Record{
		ID: f.ID, State: StateIsolated, Slot: f.Slot,
		Ephemeral: f.Ephemeral, Ports: f.Ports, Shared: f.Shared,
		Created: f.Created, Labels: f.Meta.Labels, PinOwned: f.Meta.PinOwned,
		NetNSPath: f.Mount, NetNSIno: f.NetNSIno, Veth: f.Veth, Mount: f.Mount,
		Egress: f.Egress, Ingress: f.Ingress,
		Lost: f.Lost,
	}
}

// RemoveUnattributed removes the kernel objects of isolatord's shape that
// belong to no container (those recovery reported and left in place): an
// operator's explicit decision. It returns what it removed.
func (s *Isolator) RemoveUnattributed(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	var keep []plane.Container
	for _, r := range s.records {
		if r.State != StatePrepared {
			keep = append(keep, s.container(r))
		}
	}
	s.mu.Unlock()
	removed, err := s.dp.RemoveStrays(ctx, keep)
	for _, x := range removed {
		s.log.Info("removed unattributed kernel object on request", "object", x)
	}
	s.rmu.Lock()
	s.unattributed = nil
	s.rmu.Unlock()
	if err == nil {
		s.mu.Lock()
		s.releaseHeld()
		s.mu.Unlock()
	}
	return removed, err
}

// Unattributed lists the kernel objects recovery could not attribute to
// any container (left in place).
func (s *Isolator) Unattributed() []string {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return append([]string(nil), s.unattributed...)
}

// RebuiltCount is how many containers start-up rebuilt from the kernel.
func (s *Isolator) RebuiltCount() int {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return len(s.rebuilt)
}
