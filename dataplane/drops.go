package dataplane

// Drops: what containers tried to send and their host veth refused (see
// "Host-side veth ingress" and "Drops" in tcfilter's package
// documentation), and the namespaces that are never a container's.

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/nshandle"
	"github.com/isolatord/isolatord/tcfilter"
)

// FeatureClsBPF is reported in HostInfo.Features: the kernel loads the
// data plane's cls_bpf programs (the drop sink's and the VLAN check).
const FeatureClsBPF = "cls_bpf"

// DropReasons are the reasons of LinkStats.Dropped and DropTotals.
var DropReasons = tcfilter.DropReasons

// RefusedNamespaceError is returned (wrapping ErrHostNamespace) by Setup
// when a container's namespace is one that is never a container's.
type RefusedNamespaceError = plane.RefusedNamespaceError

// refusedNamespace reports whether ns is the data plane's host namespace,
// the daemon's own (its thread's or its process's) or pid 1's.
func (d *DataPlane) refusedNamespace(ns *nshandle.NS) error {
	if ns.SameAs(d.hostNS) {
		return &RefusedNamespaceError{Which: "the data plane's host network namespace"}
	}
	if ns.SameAs(d.selfNS) {
		return &RefusedNamespaceError{Which: "the daemon's own network namespace"}
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
			return &RefusedNamespaceError{Which: x.which}
		}
	}
	return nil
}

// vethDrops reads the drops of a container's veth (every reason present).
func (d *DataPlane) vethDrops(slot uint16, veth int) (map[string]uint64, error) {
	return d.vethFilters(slot, veth, 0).Drops()
}

// departedDrops reads the drops of a veth about to be deleted, for the
// totals of departed containers (best effort: an error loses them); the
// caller adds them to d.departed under d.mu.
func (d *DataPlane) departedDrops(slot uint16, veth int) map[string]uint64 {
	if veth == 0 || slot < 1 || slot > MaxSlot {
		return nil
	}
	m, err := d.vethDrops(slot, veth)
	if err != nil {
		d.log.Debug("drop counters of a removed veth not read", "veth", veth, "err", err)
		return nil
	}
	return m
}

// DropTotals returns the frames dropped on every container's veth since
// this DataPlane was created or the veth was (whichever is later), by
// reason, every reason present: the live containers' counters plus those
// of containers torn down since New. It dumps each live container's veth
// filters.
func (d *DataPlane) DropTotals(ctx context.Context) (map[string]uint64, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]uint64{}
	for _, r := range DropReasons {
		out[r] = 0
	}
	if d.closed || !d.prepared {
		return out, nil
	}
	maps.Copy(out, d.departed)
	var errs []error
	for id, rec := range d.ctrs {
		if err := checkCtx(ctx); err != nil {
			return out, err
		}
		m, err := d.vethDrops(rec.c.Slot, rec.veth)
		if err != nil {
			errs = append(errs, fmt.Errorf("container %s: %w", id, err))
			continue
		}
		for r, n := range m {
			out[r] += n
		}
	}
	return out, errors.Join(errs...)
}
