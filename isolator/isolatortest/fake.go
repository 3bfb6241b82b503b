// Package isolatortest has an in-memory fake of the data plane for unit
// tests of the lifecycle and the API server (no kernel, no root).
package isolatortest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
)

func inode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// DataPlane is an in-memory data plane for lifecycle unit tests (a fake: the
// real one is dataplane.DataPlane). It records
// which containers are plumbed and which ports point where, and can fail on
// demand.
type DataPlane struct {
	mu       sync.Mutex
	Plumbed  map[string]plane.Container // id -> container as plumbed
	portOwn  map[uint16][]string        // port -> ids with filters for it
	HostIno  uint64
	FailNext map[string]error // op -> error returned once
	Missing  map[string][]string
	calls    []string
	// Limits are the bandwidth limits last given for each container by
	// Setup, SetLimits or Adopt: [egress, ingress].
	Limits map[string][2]rate.Limit
	// Host is what PrepareHost reports besides the names and HostIno
	// (LinkSpeed, Features).
	Host plane.HostInfo
	// Discovered is what Discover returns.
	Discovered plane.Discovery
	// ForeignPins are the container IDs whose namespace a runtime has
	// already pinned at MountPath: PlanPin and Setup report those pins as
	// not isolatord's.
	ForeignPins map[string]bool
	// TornDown is every container Teardown was given, in order.
	TornDown []plane.Container
	// NSDir holds files that stand for network namespaces (unit tests
	// cannot create real ones without root); NetNSInode accepts those and
	// /proc/<pid>/ns/net, and refuses anything else.
	NSDir string
	// Mounts is what NetNSMounts reports (namespace inode -> mount points).
	Mounts map[uint64][]string
	// Sockets is what SocketStats reports of a plumbed container; nil:
	// an error, as for a namespace that cannot be read.
	Sockets *plane.SocketStats
}

// New returns an empty fake data plane.
func New() *DataPlane {
	return &DataPlane{Plumbed: map[string]plane.Container{}, portOwn: map[uint16][]string{}, FailNext: map[string]error{}, Missing: map[string][]string{},
		Limits: map[string][2]rate.Limit{}}
}

func (f *DataPlane) record(op, id string) error {
	f.calls = append(f.calls, op+" "+id)
	if err, ok := f.FailNext[op]; ok {
		delete(f.FailNext, op)
		return err
	}
	return nil
}

func (f *DataPlane) PrepareHost(ctx context.Context) (plane.HostInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.Host
	h.Eth0, h.Lo, h.NetNSIno = "eth0", "lo", f.HostIno
	return h, f.record("prepare-host", "")
}

func (f *DataPlane) setPortsLocked(c plane.Container, ports, shared ephemeral.Set) {
	f.clearOwner(c.ID)
	all := ports.Union(shared).Union(ephemeral.NewSet(c.Ephemeral))
	for _, p := range all.Ports() {
		f.portOwn[p] = append(f.portOwn[p], c.ID)
	}
}

func (f *DataPlane) Setup(ctx context.Context, c plane.Container) (plane.Plumbing, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("setup", c.ID); err != nil {
		return plane.Plumbing{}, err
	}
	if ino, err := inode(c.NetNS); err == nil && ino == f.HostIno {
		return plane.Plumbing{}, fmt.Errorf("%s: %w", c.NetNS, plane.ErrHostNamespace)
	}
	f.Plumbed[c.ID] = c
	f.setPortsLocked(c, c.Ports, c.Shared)
	f.Limits[c.ID] = [2]rate.Limit{c.Egress, c.Ingress}
	return plane.Plumbing{Veth: "iso-" + c.ID, Mount: f.MountPath(c.ID), PinOwned: !f.ForeignPins[c.ID]}, nil
}

func (f *DataPlane) SetPorts(ctx context.Context, c plane.Container, ports, shared ephemeral.Set) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("setports", c.ID); err != nil {
		return err
	}
	if _, ok := f.Plumbed[c.ID]; !ok {
		return errors.New("not plumbed")
	}
	c.Ports, c.Shared = ports, shared
	f.Plumbed[c.ID] = c
	f.setPortsLocked(c, ports, shared)
	return nil
}

func (f *DataPlane) SetLimits(ctx context.Context, c plane.Container, egress, ingress rate.Limit) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("setlimits", c.ID); err != nil {
		return err
	}
	p, ok := f.Plumbed[c.ID]
	if !ok {
		return errors.New("not plumbed")
	}
	p.Egress, p.Ingress = egress, ingress
	f.Plumbed[c.ID] = p
	f.Limits[c.ID] = [2]rate.Limit{egress, ingress}
	return nil
}

func (f *DataPlane) Stats(ctx context.Context, c plane.Container) (plane.LinkStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := plane.LinkStats{RxBytes: 100, TxBytes: 200}
	if p, ok := f.Plumbed[c.ID]; ok {
		for _, x := range []struct {
			l   rate.Limit
			out *plane.ShapeCounters
		}{{p.Egress, &st.Egress}, {p.Ingress, &st.Ingress}} {
			if !x.l.IsZero() {
				*x.out = plane.ShapeCounters{Limit: x.l, Enforced: true, Queue: "bfifo", Bytes: 1000, Packets: 10, Drops: 1, Overlimits: 5}
			}
		}
	}
	return st, f.record("stats", c.ID)
}

func (f *DataPlane) SocketStats(ctx context.Context, c plane.Container) (plane.SocketStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("sockets", c.ID); err != nil {
		return plane.SocketStats{}, err
	}
	if _, ok := f.Plumbed[c.ID]; !ok || f.Sockets == nil {
		return plane.SocketStats{}, fmt.Errorf("%s: no namespace statistics", c.NetNS)
	}
	return *f.Sockets, nil
}

func (f *DataPlane) Teardown(ctx context.Context, c plane.Container) (plane.TeardownReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("teardown", c.ID); err != nil {
		return plane.TeardownReport{}, err
	}
	f.TornDown = append(f.TornDown, c)
	var rep plane.TeardownReport
	if _, ok := f.Plumbed[c.ID]; !ok {
		rep.Missing = append(rep.Missing, "veth")
	}
	delete(f.Plumbed, c.ID)
	f.clearOwner(c.ID)
	return rep, nil
}

func (f *DataPlane) clearOwner(id string) {
	for p, ids := range f.portOwn {
		var keep []string
		for _, x := range ids {
			if x != id {
				keep = append(keep, x)
			}
		}
		if len(keep) == 0 {
			delete(f.portOwn, p)
		} else {
			f.portOwn[p] = keep
		}
	}
}

func (f *DataPlane) Check(ctx context.Context, c plane.Container) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("check", c.ID); err != nil {
		return nil, err
	}
	if m, ok := f.Missing[c.ID]; ok {
		return m, nil
	}
	if _, ok := f.Plumbed[c.ID]; !ok {
		return []string{"veth", "mount", "filters"}, nil
	}
	return nil, nil
}

func (f *DataPlane) Adopt(ctx context.Context, c plane.Container) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("adopt", c.ID); err != nil {
		return err
	}
	f.Limits[c.ID] = [2]rate.Limit{c.Egress, c.Ingress}
	return nil
}

// Discover returns Discovered (tests set it: what the kernel would show).
func (f *DataPlane) Discover(ctx context.Context, known []string) (plane.Discovery, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Discovered, f.record("discover", "")
}

// Strays lists the plumbed containers not in keep, removing nothing.
func (f *DataPlane) Strays(ctx context.Context, keep []plane.Container) ([]string, error) {
	return f.strays(keep, false)
}

func (f *DataPlane) RemoveStrays(ctx context.Context, keep []plane.Container) ([]string, error) {
	return f.strays(keep, true)
}

func (f *DataPlane) strays(keep []plane.Container, remove bool) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	known := map[string]bool{}
	for _, c := range keep {
		known[c.ID] = true
	}
	var out []string
	for id, c := range f.Plumbed {
		if !known[id] {
			out = append(out, "veth iso-"+id)
			if remove {
				delete(f.Plumbed, id)
				f.clearOwner(c.ID)
			}
		}
	}
	sort.Strings(out)
	op := "strays?"
	if remove {
		op = "strays"
	}
	return out, f.record(op, "")
}

// NetNSInode is the inode of a file in NSDir or of /proc/<pid>/ns/net;
// anything else is not a network namespace.
func (f *DataPlane) NetNSInode(path string) (uint64, error) {
	inDir := f.NSDir != "" && strings.HasPrefix(path, f.NSDir+"/")
	if !inDir && !(strings.HasPrefix(path, "/proc/") && strings.HasSuffix(path, "/ns/net")) {
		return 0, fmt.Errorf("%s: not a network namespace file", path)
	}
	return inode(path)
}

// NetNSMounts returns Mounts.
func (f *DataPlane) NetNSMounts() (map[uint64][]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.Mounts), nil
}

func (f *DataPlane) MountPath(id string) string { return "/fake/netns/" + id }

// PlanPin: pins are at MountPath, isolatord's own unless in ForeignPins.
func (f *DataPlane) PlanPin(c plane.Container) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.MountPath(c.ID), !f.ForeignPins[c.ID], nil
}

// Owners returns a copy of port -> owners.
func (f *DataPlane) Owners() map[uint16][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[uint16][]string{}
	for p, ids := range f.portOwn {
		out[p] = append([]string(nil), ids...)
	}
	return out
}

// Calls returns the operations made so far ("setup c1", "setlimits c1", ...).
func (f *DataPlane) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}
