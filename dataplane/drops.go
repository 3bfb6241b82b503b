package dataplane

// Drops: what containers tried to send and their host veth refused (see
// "Host-side veth ingress" and "Drops" in tcfilter's package
// documentation), and the namespaces that are never a container's.

import (
	"context"
	"errors"
	"maps"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/tcfilter"
)

// refusedNamespace reports whether ns is the data plane's host namespace,
// the daemon's own (its thread's or its process's) or pid 1's.
func (d *DataPlane) refusedNamespace(ns *nshandle.NS) error {
	if ns.SameAs(d.hostNS) {
		return &plane.RefusedNamespaceError{Which: "the data plane's host network namespace"}
	}
	if ns.SameAs(d.selfNS) {
		return &plane.RefusedNamespaceError{Which: "the daemon's own network namespace"}
	}
	for _, x := range []struct{ path, which string }{
		{"/proc/self/ns/net", "the daemon process's network namespace"},
		{"/proc/1/ns/net", "the network namespace of pid 1 (the machine's)"},
	} {
		o, err := nshandle.Open(x.path)
		if err != nil {
			continue // not visible here (another pid namespace without /proc of ours)
		}
		same := ns.SameAs(o)
		o.Close()
		if same {
			return &plane.RefusedNamespaceError{Which: x.which}
		}
	}
	return nil
}

// vethDrops reads the drops of a container's veth (every reason present)
// from the sinks' count map: no netlink, no rtnl. Without cls_bpf they are
// not counted per container: nil, no error.
func (d *DataPlane) vethDrops(veth int) (map[string]uint64, error) {
	m, err := d.drops.Counts(veth)
	if errors.Is(err, tcfilter.ErrNoDropCounts) {
		return nil, nil
	}
	return m, err
}

// departedDrops reads the drops of a veth about to be deleted, for the
// totals of departed containers, and forgets them in the count map (best
// effort: an error loses them); the caller adds them to d.departed under
// d.mu.
func (d *DataPlane) departedDrops(veth int) map[string]uint64 {
	if veth == 0 || !d.drops.BPF() {
		return nil
	}
	m, err := d.drops.Release(veth)
	if err != nil {
		d.log.Debug("drop counters of a removed veth not read", "veth", veth, "err", err)
		return nil
	}
	return m
}

// pruneDrops forgets, at start-up, the counts of veths that are gone (ls:
// the host's links): their ifindexes may be handed out again. A veth set
// up later starts from zero anyway (Setup resets its entries).
func (d *DataPlane) pruneDrops(ls []netlink.Link) {
	live := map[int]bool{}
	for _, l := range ls {
		if isVethName(l.Attrs().Name) && !isRetired(l.Attrs()) {
			live[l.Attrs().Index] = true
		}
	}
	n, err := d.drops.Prune(func(veth int) bool { return live[veth] })
	if err != nil {
		d.log.Warn("drop counts of removed veths not all forgotten", "err", err)
	}
	if n > 0 {
		d.log.Info("drop counts of removed veths forgotten", "veths", n)
	}
}

// DropTotals returns the frames dropped on every container's veth, by
// reason, every reason present: the live containers' counts plus those of
// containers torn down since New. It reads the sinks' count map once (no
// rtnl), and takes d.mu only to list the live veths. Without cls_bpf only
// zeros.
func (d *DataPlane) DropTotals(ctx context.Context) (map[string]uint64, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, r := range tcfilter.DropReasons {
		out[r] = 0
	}
	d.hmu.RLock()
	defer d.hmu.RUnlock()
	d.mu.Lock()
	if d.closed || !d.prepared {
		d.mu.Unlock()
		return out, nil
	}
	maps.Copy(out, d.departed)
	live := make(map[int]bool, len(d.ctrs))
	for _, rec := range d.ctrs {
		live[rec.veth] = true
	}
	d.mu.Unlock()
	all, err := d.drops.All()
	if errors.Is(err, tcfilter.ErrNoDropCounts) {
		return out, nil
	}
	for veth, m := range all {
		if !live[veth] {
			continue // a setup in progress, or a teardown that has not read them yet
		}
		for r, n := range m {
			out[r] += n
		}
	}
	return out, err
}
