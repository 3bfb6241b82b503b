package isolator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

// RecoveryReport counts the decisions Start made.
type RecoveryReport struct {
	Kept       int      // isolated containers whose plumbing was complete
	Prepared   int      // prepared containers (nothing in the kernel)
	Finished   int      // intents completed (isolate found complete, update rolled forward, re-plumbed)
	RolledBack int      // intents undone (isolate torn down back to prepared, update rolled back)
	CleanedUp  int      // containers removed (cleanup intent finished, namespace gone)
	Strays     []string // kernel objects removed (none at start-up: see Unattributed)
	// Rebuilt are the containers whose records were rebuilt from the kernel.
	Rebuilt []string
	// Unattributed are kernel objects of isolatord's shape that belong to
	// no container: left in place (RemoveUnattributed removes them).
	Unattributed []string
	// StateMovedAside is where a corrupt state file was moved ("" if not).
	StateMovedAside string
	Unreserved      []string // records whose ports no longer fit the configuration (kept, not reserved)
	// Failed are the containers whose recovery failed (left as they were,
	// reported; start-up went on).
	Failed []string
	// RangesRestored are the rebuilt containers whose tenant had changed
	// its ip_local_port_range: the block the host side proves was written
	// back ("<id>: <tenant's value> -> <block>").
	RangesRestored []string
	// Held are kernel objects that still route to a namespace but belong
	// to no container: what they route stays reserved (held.go).
	Held []string
	// HostPortConflicts are containers' ports a host process took while the
	// daemon was down (hostports.go).
	HostPortConflicts []HostPortConflict
}

// Start prepares the host and recovers every container from the state store
// and the kernel. It must run before serving; the daemon reports readiness
// only after it returns. One log line per decision.
func (s *Isolator) Start(ctx context.Context) (RecoveryReport, error) {
	var rep RecoveryReport
	start := time.Now()
	host, err := s.dp.PrepareHost(ctx)
	if err != nil {
		return rep, fmt.Errorf("prepare host: %w", err)
	}
	s.host.Store(&host)
	s.followHost()
	if err := s.checkDefaults(); err != nil {
		return rep, fmt.Errorf("bandwidth limits: %v", err)
	}

	tHost := time.Since(start)
	recs, err := s.store.Load()
	if err != nil {
		return rep, fmt.Errorf("load state: %w", err)
	}
	rep.StateMovedAside = s.store.MovedAside()
	var held []plane.Held
	if recs, held, err = s.rebuild(ctx, recs, &rep); err != nil {
		return rep, err
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].ID < recs[j].ID })

	tRebuild := time.Since(start)
	// 1. Rebuild the bookkeeping from the records, before any decision, so no
	//    port or block can be handed out twice.
	s.mu.Lock()
	loaded := recs[:0:0]
	for _, r := range recs {
		if !s.slots.claim(r.Slot) {
			// its kernel objects, if any, are reported with the strays;
			// what the record holds stays held (they may still route it)
			s.failed(&rep, r.ID, fmt.Errorf("state: slot %d is invalid or taken", r.Slot))
			req := holdRequest(r)
			s.hold(plane.Held{What: fmt.Sprintf("container %s (slot %d invalid or taken)", r.ID, r.Slot),
				Ports: req.Exclusive.Union(req.Shared).Union(ephemeral.NewSet(r.Ephemeral))})
			continue
		}
		loaded = append(loaded, r)
		if err := s.alloc.Claim(r.Ephemeral); err != nil {
			rep.Unreserved = append(rep.Unreserved, r.ID)
			s.log.Warn("recover: ephemeral block not reservable under the current configuration; kept until cleanup", "container_id", r.ID, "range", r.Ephemeral.String(), "err", err)
		}
		// A cleaning record's ports are not claimed: it is cleaned up
		// below, before any call is served, and another container may
		// hold them already (a cleanup answers before its record's
		// removal is committed, and frees its ports at once).
		if req := holdRequest(r); r.State != StateCleaning {
			if err := s.ledger.Reserve(r.ID, req); err != nil {
				rep.Unreserved = append(rep.Unreserved, r.ID)
				s.log.Warn("recover: static ports not reservable under the current configuration; kept until cleanup", "container_id", r.ID, "ports", portsString(req.Exclusive, req.Shared), "err", err)
			}
		}
		s.hostRetake(r, &rep)
		s.records[r.ID] = r
		if r.State != StatePrepared && r.State != StateCleaning && r.NetNSIno != 0 {
			s.netnsOwner[r.NetNSIno] = r.ID
		}
	}
	recs = loaded
	// what the kernel routes to namespaces no record owns stays reserved
	for _, h := range held {
		s.hold(h)
		rep.Held = append(rep.Held, h.What)
	}
	s.mu.Unlock()

	tClaims := time.Since(start)
	// 2. Resolve each record against the kernel.
	owned := s.ownersAlive(recs)
	var keep []*Record
	for i, r := range recs {
		kept, err := s.recoverOne(ctx, r, owned[i], &rep)
		if err != nil {
			// One bad container never stops the daemon: it is reported and
			// left as it is (its claims stand, its kernel objects stay).
			s.failed(&rep, r.ID, err)
			kept = r.State != StatePrepared && r.State != StateCleaning
		}
		if kept {
			keep = append(keep, r)
		}
	}

	tResolve := time.Since(start)
	// 3. Report kernel objects that belong to nobody; they stay.
	cs := make([]plane.Container, 0, len(keep))
	for _, r := range keep {
		cs = append(cs, s.container(r))
	}
	strays, err := s.dp.Strays(ctx, cs)
	if err != nil {
		return rep, fmt.Errorf("list unattributed kernel objects: %w", err)
	}
	// (what Discover already explained is not listed twice)
	for _, st := range strays {
		if !slices.ContainsFunc(rep.Unattributed, func(u string) bool {
			return strings.HasPrefix(u, st+":") || strings.HasPrefix(u, st+" ")
		}) {
			rep.Unattributed = append(rep.Unattributed, st)
		}
	}
	sort.Strings(rep.Unattributed)
	for _, st := range rep.Unattributed {
		s.log.Warn("recover: kernel object attributable to no container; left in place (isolatorctl remove-unattributed removes it)", "object", st)
	}
	s.mu.Lock()
	s.view.reset(s.records)
	s.mu.Unlock()
	s.rmu.Lock()
	s.unattributed = append(append([]string(nil), rep.Unattributed...), rep.Failed...)
	s.rebuilt = rep.Rebuilt
	s.rmu.Unlock()
	// Every intent is resolved now (its record committed or deleted
	// above) or was stale: the journal starts empty.
	if err := s.store.ClearJournal(); err != nil {
		s.log.Warn("intent journal: stale intents left (ignored at the next start)", "err", err.Error())
	}
	s.hostPorts.watchConflicts(s.cfg.HostPortsRetry, s.log)
	s.syncDrains()
	s.finishHandoffs(ctx)
	s.armDrainDeadlines()
	if s.cfg.Observer != nil {
		s.cfg.Observer.Recovered(rep, time.Since(start))
	}
	s.log.Info("recovery complete", "kept", rep.Kept, "prepared", rep.Prepared, "finished", rep.Finished,
		"rolled_back", rep.RolledBack, "cleaned_up", rep.CleanedUp, "rebuilt", len(rep.Rebuilt), "unattributed", len(rep.Unattributed),
		"failed", len(rep.Failed), "held", len(rep.Held), "ranges_restored", len(rep.RangesRestored),
		"host_port_conflicts", len(rep.HostPortConflicts),
		"host_done_seconds", tHost.Seconds(), "rebuild_done_seconds", tRebuild.Seconds(), "claims_done_seconds", tClaims.Seconds(), "resolve_done_seconds", tResolve.Seconds(), "total_seconds", time.Since(start).Seconds())
	return rep, nil
}

// holdRequest is what a record holds in the ledger: during an update, the
// union of the old and new ports.
func holdRequest(r *Record) ephemeral.Request {
	req := ephemeral.Request{Exclusive: r.Ports, Shared: r.Shared}
	if r.State == StateUpdating && r.NewPorts != nil && r.NewShared != nil {
		req.Exclusive = req.Exclusive.Union(*r.NewPorts)
		req.Shared = req.Shared.Union(*r.NewShared).Subtract(req.Exclusive)
	}
	return req
}

// aliveWorkers is how many records ownersAlive reads at once.
const aliveWorkers = 4

// ownersAlive is alive for each record of recs (false for prepared and
// cleaning ones, which do not need it), read aliveWorkers at a time: a
// /proc or namespace file read per container, independent of each other.
func (s *Isolator) ownersAlive(recs []*Record) []bool {
	out := make([]bool, len(recs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(aliveWorkers, len(recs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = s.alive(recs[i])
			}
		}()
	}
	for i, r := range recs {
		if r.State != StatePrepared && r.State != StateCleaning {
			next <- i
		}
	}
	close(next)
	wg.Wait()
	return out
}

// recoverOne decides the fate of one record, whose namespace's owner was
// found alive or not (owned); it reports whether the container's plumbing
// is kept.
func (s *Isolator) recoverOne(ctx context.Context, r *Record, owned bool, rep *RecoveryReport) (bool, error) {
	log := s.log.With("container_id", r.ID, "state", string(r.State))
	switch r.State {
	case StatePrepared:
		rep.Prepared++
		log.Info("recover: prepared, nothing in the kernel")
		if s.store.JournalOnly(r.ID) { // its Prepare's commit had not landed
			if err := s.commit(r); err != nil {
				return false, err
			}
		}
		return false, nil

	case StateCleaning:
		if err := s.finishCleanup(ctx, r); err != nil {
			return false, err
		}
		rep.CleanedUp++
		log.Info("recover: cleanup intent finished")
		return false, nil
	}

	// isolating, isolated, updating: the namespace must still have its owner.
	if !owned {
		if err := s.finishCleanup(ctx, r); err != nil {
			return false, err
		}
		rep.CleanedUp++
		log.Info("recover: container's namespace is gone; cleaned up", "target", targetString(r.Pid, r.NetNSPath))
		return false, nil
	}

	c := s.container(r)
	switch r.State {
	case StateIsolating:
		missing, err := s.dp.Check(ctx, c)
		if err == nil && len(missing) == 0 {
			r.State = StateIsolated
			r.Mount = s.mountPathFor(r)
			if r.Isolated.IsZero() { // the outcome was not committed: the intent carries no time
				r.Isolated = time.Now().UTC()
			}
			if err := s.commit(r); err != nil {
				return false, err
			}
			if err := s.adopt(ctx, s.container(r), log); err != nil {
				return false, err
			}
			rep.Finished++
			log.Info("recover: isolate intent found complete; kept")
			return true, nil
		}
		if _, err := s.dp.Teardown(ctx, c); err != nil {
			return false, fmt.Errorf("roll back isolate of %s: %w", r.ID, err)
		}
		s.releaseNetNS(r.NetNSIno, r.ID)
		r.State, r.Mount, r.PinOwned, r.Pid, r.PidStart, r.NetNSPath, r.NetNSIno, r.Veth = StatePrepared, "", false, 0, 0, "", 0, ""
		if err := s.commit(r); err != nil {
			return false, err
		}
		rep.RolledBack++
		log.Info("recover: isolate intent incomplete; rolled back to prepared", "missing", strings.Join(missing, ", "))
		return false, nil

	case StateUpdating:
		// Roll forward: the data plane brings the kernel to the new ports
		// from wherever the interrupted update left it.
		newP, newS := *r.NewPorts, *r.NewShared
		if err := s.adopt(ctx, c, log); err != nil {
			return false, err
		}
		if err := s.dp.SetPorts(ctx, c, newP, newS); err != nil {
			log.Warn("recover: rolling the update forward failed; rolling back", "err", err)
			if err2 := s.dp.SetPorts(ctx, s.container(&Record{ID: r.ID, Slot: r.Slot, Ephemeral: r.Ephemeral, Ports: newP, Shared: newS, NetNSPath: r.NetNSPath, Mount: r.Mount}), r.Ports, r.Shared); err2 != nil {
				return false, fmt.Errorf("roll back update of %s: %v (forward: %w)", r.ID, err2, err)
			}
			newP, newS = r.Ports, r.Shared
			rep.RolledBack++
		} else {
			rep.Finished++
			log.Info("recover: update intent rolled forward", "ports", portsString(newP, newS))
		}
		r.State, r.Ports, r.Shared, r.NewPorts, r.NewShared = StateIsolated, newP, newS, nil, nil
		if err := s.commit(r); err != nil {
			return false, err
		}
		s.mu.Lock()
		_ = s.ledger.Update(r.ID, ephemeral.Request{Exclusive: newP, Shared: newS})
		s.mu.Unlock()
		s.hostPorts.settle(r.ID, newP.Union(newS))
		return true, nil

	default: // isolated
		missing, err := s.dp.Check(ctx, c)
		if err != nil {
			return false, fmt.Errorf("check %s: %w", r.ID, err)
		}
		if len(missing) == 0 {
			if err := s.adopt(ctx, c, log); err != nil {
				return false, err
			}
			rep.Kept++
			log.Info("recover: plumbing complete; kept")
			return true, nil
		}
		// Something was removed behind our back: rebuild it, with the
		// ranges the record holds (never new ones). The namespace is held
		// open across the teardown: a record rebuilt from the kernel knows
		// it only by its pin, which the teardown removes.
		var nsKeep *os.File
		if f, err := os.Open(c.NetNS); err == nil {
			nsKeep = f
			defer f.Close()
		}
		if _, err := s.dp.Teardown(ctx, c); err != nil {
			return false, fmt.Errorf("teardown before re-plumb of %s: %w", r.ID, err)
		}
		src := *r
		src.Mount, src.PinOwned = "", false
		if nsKeep != nil {
			src.NetNSPath = fmt.Sprintf("/proc/self/fd/%d", nsKeep.Fd())
		}
		plumb, err := s.dp.Setup(ctx, s.container(&src))
		if err != nil {
			s.releaseNetNS(r.NetNSIno, r.ID)
			r.State, r.Mount, r.PinOwned, r.Pid, r.PidStart, r.NetNSPath, r.NetNSIno, r.Veth = StatePrepared, "", false, 0, 0, "", 0, ""
			if err := s.commit(r); err != nil {
				return false, err
			}
			rep.RolledBack++
			log.Warn("recover: plumbing incomplete and re-plumbing failed; back to prepared", "missing", strings.Join(missing, ", "), "err", err)
			return false, nil
		}
		r.Veth, r.Mount, r.PinOwned = plumb.Veth, plumb.Mount, plumb.PinOwned
		if err := s.commit(r); err != nil {
			return false, err
		}
		rep.Finished++
		log.Info("recover: plumbing incomplete; re-plumbed", "missing", strings.Join(missing, ", "))
		return true, nil
	}
}

// adopt registers a kept container with the data plane. Its bandwidth
// limits are put back in force there when they are not; if that fails the
// container is still kept (its traffic flows) and the failure is logged.
func (s *Isolator) adopt(ctx context.Context, c plane.Container, log *slog.Logger) error {
	err := s.dp.Adopt(ctx, c)
	if errors.Is(err, plane.ErrShaping) {
		log.Error("recover: bandwidth limits not in force", "egress_limit", LimitString(c.Egress), "ingress_limit", LimitString(c.Ingress), "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("adopt %s: %w", c.ID, err)
	}
	return nil
}

// finishCleanup tears down (idempotently), deletes the record and releases
// its ports.
func (s *Isolator) finishCleanup(ctx context.Context, r *Record) error {
	if _, err := s.dp.Teardown(ctx, s.container(r)); err != nil {
		return fmt.Errorf("cleanup of %s: %w", r.ID, err)
	}
	if err := s.store.Del(r.ID); err != nil {
		return fmt.Errorf("persist cleanup of %s: %w", r.ID, err)
	}
	s.store.Settled(r.ID, 0)
	s.forget(r.ID)
	return nil
}

// mountPathFor is where the data plane bind-mounts a container's namespace.
func (s *Isolator) mountPathFor(r *Record) string {
	if r.Mount != "" {
		return r.Mount
	}
	return s.dp.MountPath(r.ID)
}
