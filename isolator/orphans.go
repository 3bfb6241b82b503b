package isolator

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Orphan reclamation. A runtime that removes a container without a CNI DEL
// (ctr's detached containers, a runtime that gave up because isolatord was
// down) leaves the container's namespace alive only through isolatord's
// own pin: its ports stay held and its ID stays taken for ever. An isolated
// container whose namespace has no process (no thread of any process is in
// it) and no mount other than isolatord's own pin (a runtime's pin, such as
// podman's /run/netns/netns-*, CRI's /run/netns/cni-* or Nomad's, keeps it)
// for a whole grace period is cleaned up through Cleanup, logged and
// counted. A namespace with a live process or another pin is never
// reclaimed.

// DefaultOrphanGrace is how long a namespace must stay orphaned before its
// container is reclaimed.
const DefaultOrphanGrace = 30 * time.Second

// OrphanObserver is implemented by Observers that count reclaimed orphans.
type OrphanObserver interface {
	OrphanReclaimed(id string)
}

// orphanCount is the number of containers reclaimed since start.
type orphanCount struct{ n atomic.Uint64 }

// OrphansReclaimed is how many orphaned containers were cleaned up since
// the daemon started.
func (s *Isolator) OrphansReclaimed() uint64 { return s.orphans.n.Load() }

// orphanPeriod is how often the namespaces are looked at for a grace
// period: a quarter of it, between 250 ms and 10 s.
func orphanPeriod(grace time.Duration) time.Duration {
	p := grace / 4
	return min(max(p, 250*time.Millisecond), 10*time.Second)
}

// ReclaimOrphans looks for orphaned containers every period until ctx is
// done, and reclaims those orphaned for grace. grace <= 0 disables it.
func (s *Isolator) ReclaimOrphans(ctx context.Context, grace time.Duration) {
	if grace <= 0 {
		s.log.Info("orphan reclamation disabled")
		return
	}
	period := orphanPeriod(grace)
	s.log.Info("orphan reclamation", "grace_seconds", grace.Seconds(), "period_seconds", period.Seconds())
	since := map[string]time.Time{}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.orphanPass(ctx, time.Now(), grace, since)
	}
}

// orphanPass is one look: one /proc scan and one mountinfo read for every
// container. since holds when each container was first seen orphaned; it
// forgets containers that are not (any more).
func (s *Isolator) orphanPass(ctx context.Context, now time.Time, grace time.Duration, since map[string]time.Time) {
	orphans := s.orphaned(false)
	for id := range since {
		if _, ok := orphans[id]; !ok {
			delete(since, id)
		}
	}
	var due []string
	for id := range orphans {
		first, ok := since[id]
		if !ok {
			since[id] = now
			s.log.Debug("namespace orphaned; reclaimed after the grace period unless a process or pin comes back", "container_id", id, "grace_seconds", grace.Seconds())
			continue
		}
		if now.Sub(first) >= grace {
			due = append(due, id)
		}
	}
	if len(due) == 0 {
		return
	}
	// Before removing anything, look again, at every thread this time (a
	// thread can be in a namespace its process is not in).
	again := s.orphaned(true)
	for _, id := range due {
		r, ok := again[id]
		if !ok {
			delete(since, id)
			continue
		}
		first := since[id]
		err := s.Cleanup(ctx, id)
		if err != nil {
			s.log.Warn("reclaiming orphaned container failed; trying again next period", "container_id", id, "err", err.Error())
			continue
		}
		delete(since, id)
		s.orphans.n.Add(1)
		if o, ok := s.cfg.Observer.(OrphanObserver); ok {
			o.OrphanReclaimed(id)
		}
		s.log.Info("reclaimed orphaned container: its namespace had no process and no pin but isolatord's",
			"container_id", id, "netns_ino", r.NetNSIno, "orphaned_seconds", now.Sub(first).Seconds(), "labels", r.Labels)
	}
}

// orphaned returns the isolated containers whose namespace has no process
// (threads too when threads is set) and no mount but isolatord's own pin.
// A container isolated by pid whose process is still in its namespace is
// passed over first, one stat each; the mount table and the /proc scan,
// whose cost grows with everything on the machine, are read only when
// candidates are left.
func (s *Isolator) orphaned(threads bool) map[string]Record {
	cand := map[uint64][]Record{}
	s.mu.Lock()
	for _, r := range s.records {
		if r.State == StateIsolated && r.NetNSIno != 0 {
			cand[r.NetNSIno] = append(cand[r.NetNSIno], *r)
		}
	}
	s.mu.Unlock()
	for ino, rs := range cand {
		if slices.ContainsFunc(rs, func(r Record) bool { return r.Pid > 0 && nsOfProcess(s.cfg.ProcRoot, r.Pid) == ino }) {
			delete(cand, ino)
		}
	}
	if len(cand) == 0 {
		return nil
	}
	mounts, err := s.dp.NetNSMounts()
	if err != nil {
		s.log.Warn("orphan check: cannot read the mount table; nothing reclaimed", "err", err.Error())
		return nil
	}
	dirs := map[string]string{}
	for ino, rs := range cand {
		for _, r := range rs {
			if otherPin(mounts[ino], r, dirs) {
				delete(cand, ino)
				break
			}
		}
	}
	if len(cand) == 0 {
		return nil
	}
	if err := nsInProcesses(s.cfg.ProcRoot, threads, func(ino uint64) { delete(cand, ino) }); err != nil {
		s.log.Warn("orphan check: cannot scan processes; nothing reclaimed", "err", err.Error())
		return nil
	}
	out := map[string]Record{}
	for _, rs := range cand {
		for _, r := range rs {
			out[r.ID] = r
		}
	}
	return out
}

// otherPin reports whether any of a namespace's mount points is not r's own
// pin. A pin isolatord does not own is someone else's, so it counts. dirs
// caches resolved directories (nil: none).
func otherPin(points []string, r Record, dirs map[string]string) bool {
	own := ""
	if r.PinOwned && r.Mount != "" {
		own = resolvePath(r.Mount, dirs)
	}
	for _, p := range points {
		if p != own {
			return true
		}
	}
	return false
}

// resolvePath resolves symlinks in a path's directory (/var/run ->
// /run), as mountinfo reports mount points; dirs caches the directories
// resolved (nil: no cache).
func resolvePath(p string, dirs map[string]string) string {
	d := filepath.Dir(p)
	dir, ok := dirs[d]
	if !ok {
		var err error
		if dir, err = filepath.EvalSymlinks(d); err != nil {
			return p
		}
		if dirs != nil {
			dirs[d] = dir
		}
	}
	return filepath.Join(dir, filepath.Base(p))
}

// nsOfProcess is the inode of process pid's network namespace (0 if it
// cannot be read: no such process).
func nsOfProcess(procRoot string, pid int) uint64 {
	var st unix.Stat_t
	if unix.Stat(procRoot+"/"+strconv.Itoa(pid)+"/ns/net", &st) != nil {
		return 0
	}
	return st.Ino
}

// nsInProcesses calls seen with the network namespace inode of every
// process under procRoot (of every thread when threads is set). Processes
// that end during the scan are skipped. No process is started.
func nsInProcesses(procRoot string, threads bool, seen func(ino uint64)) error {
	d, err := os.Open(procRoot)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	stat := func(p string) {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			seen(st.Ino)
		}
	}
	for _, n := range names {
		if _, err := strconv.Atoi(n); err != nil {
			continue
		}
		if !threads {
			stat(procRoot + "/" + n + "/ns/net")
			continue
		}
		tasks, err := os.ReadDir(procRoot + "/" + n + "/task")
		if err != nil {
			continue
		}
		for _, t := range tasks {
			stat(procRoot + "/" + n + "/task/" + t.Name() + "/ns/net")
		}
	}
	return nil
}
