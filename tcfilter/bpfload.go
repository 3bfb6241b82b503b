package tcfilter

// Loading the data plane's BPF programs (package bpfprog: C compiled by
// clang through bpf2go) with cilium/ebpf, and the two tiny ones that every
// veth or sink shares (this kernel has no gact, so no "action drop"; see
// "Drops" in the package documentation). All are attached in
// direct-action mode, so their return value is the verdict.

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/bpfprog"
)

// Verdicts of a direct-action program.
const (
	tcActUnspec = -1
	tcActOK     = 0
	tcActShot   = 2
)

// VLANMarkMAC is the Ethernet source the VLAN check (bpfprog's novlan.c)
// gives a tagged frame, so that every u32 priority of the veth drops it
// with reason DropVLAN.
var VLANMarkMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// loadObjects loads the programs and maps named by the fields of objs (a
// bpf2go objects struct, or one with a subset of its fields) from the
// object that load returns, with its read-only globals set to vars and
// the maps of replace used instead of new ones.
func loadObjects(load func() (*ebpf.CollectionSpec, error), objs any, vars map[string]any, replace map[string]*ebpf.Map) error {
	spec, err := load()
	if err != nil {
		return fmt.Errorf("bpf: %w", err)
	}
	for name, v := range vars {
		vs := spec.Variables[name]
		if vs == nil {
			return fmt.Errorf("bpf: no variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("bpf: set %s: %w", name, err)
		}
	}
	if err := spec.LoadAndAssign(objs, &ebpf.CollectionOptions{MapReplacements: replace}); err != nil {
		return fmt.Errorf("bpf: load: %w", err)
	}
	return nil
}

// filterName is a cls_bpf filter's name: prefix and a digest of the
// program's object and its parameters, so that a name match means the
// same code on the same parameters.
func filterName(prefix, object string, params ...[]byte) string {
	h := sha256.New()
	h.Write(bpfprog.Object(object))
	for _, p := range params {
		h.Write(p)
	}
	return fmt.Sprintf("%s%x", prefix, h.Sum(nil)[:6])
}

// progCache keeps each shared program loaded once for the life of the
// process: every veth's filter refers to the same program instead of a
// fresh copy.
var progCache struct {
	sync.Mutex
	progs map[string]*ebpf.Program
}

// cachedProg returns f's program, loading it on first use. It stays open
// (the filters hold their own references).
func cachedProg(f bpfFilter) (*ebpf.Program, error) {
	progCache.Lock()
	defer progCache.Unlock()
	if p, ok := progCache.progs[f.name]; ok {
		return p, nil
	}
	p, err := f.load()
	if err != nil {
		return nil, err
	}
	if progCache.progs == nil {
		progCache.progs = map[string]*ebpf.Program{}
	}
	progCache.progs[f.name] = p
	return p, nil
}

// loadShot loads isolatord_drop, which drops every frame (TC_ACT_SHOT).
func loadShot() (*ebpf.Program, error) {
	var o bpfprog.ShotPrograms
	if err := loadObjects(bpfprog.LoadShot, &o, nil, nil); err != nil {
		return nil, err
	}
	return o.IsolatordDrop, nil
}

// loadNoVLAN loads the VLAN check (bpfprog's novlan.c): it gives a frame
// that carried an 802.1Q/802.1ad tag the Ethernet source VLANMarkMAC and
// lets every frame go on to the next filter (TC_ACT_UNSPEC).
func loadNoVLAN() (*ebpf.Program, error) {
	var o bpfprog.NoVLANPrograms
	if err := loadObjects(bpfprog.LoadNoVLAN, &o, nil, nil); err != nil {
		return nil, err
	}
	return o.IsoNovlan, nil
}

// Names of our shared cls_bpf filters (the kernel reports them in a dump).
const (
	bpfNameShot   = "isolatord_drop"
	bpfNameNoVLAN = "isolatord_novlan"
)

// bpfFilter describes one of our direct-action cls_bpf filters.
type bpfFilter struct {
	name   string
	load   func() (*ebpf.Program, error)
	parent uint32 // netlink.HANDLE_MIN_INGRESS or HANDLE_MIN_EGRESS
	prio   uint16
}

var (
	shotFilter   = bpfFilter{bpfNameShot, loadShot, netlink.HANDLE_MIN_EGRESS, PrioSinkShot}
	noVLANFilter = bpfFilter{bpfNameNoVLAN, loadNoVLAN, netlink.HANDLE_MIN_INGRESS, PrioVethVLAN}
)

// present reports whether link has f (by priority and program name).
func (f bpfFilter) present(h *netlink.Handle, link int) (bool, error) {
	fs, err := h.FilterList(linkRef(link), f.parent)
	if err != nil {
		return false, fmt.Errorf("list filters of ifindex %d: %w", link, err)
	}
	for _, x := range fs {
		if b, ok := x.(*netlink.BpfFilter); ok && b.Priority == f.prio && b.DirectAction && b.Name == f.name {
			return true, nil
		}
	}
	return false, nil
}

// filter is the netlink filter that attaches f to link, with the cached
// program.
func (f bpfFilter) filter(link int) (*netlink.BpfFilter, error) {
	p, err := cachedProg(f)
	if err != nil {
		return nil, err
	}
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: link, Parent: f.parent, Priority: f.prio, Protocol: unix.ETH_P_ALL, Handle: 1,
		},
		Fd: p.FD(), Name: f.name, DirectAction: true,
	}, nil
}

// attach adds f to link (which must have a clsact qdisc). The filter takes
// its own reference to the cached program.
func (f bpfFilter) attach(h *netlink.Handle, link int) error {
	bf, err := f.filter(link)
	if err != nil {
		return err
	}
	if err := h.FilterAdd(bf); err != nil {
		return fmt.Errorf("attach bpf %s to ifindex %d: %w", f.name, link, err)
	}
	return nil
}

// ensure attaches f unless link has it already.
func (f bpfFilter) ensure(h *netlink.Handle, link int) error {
	ok, err := f.present(h, link)
	if err != nil || ok {
		return err
	}
	return f.attach(h, link)
}

// BPFAvailable reports whether this kernel loads our cls_bpf programs (it
// loads one and unloads it).
func BPFAvailable() error {
	p, err := loadShot()
	if err != nil {
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("%w (no BPF_PROG_TYPE_SCHED_CLS)", err)
		}
		return err
	}
	p.Close()
	return nil
}

// progID is the id of program p (0 if unknown).
func progID(p *ebpf.Program) ebpf.ProgramID {
	if p == nil {
		return 0
	}
	info, err := p.Info()
	if err != nil {
		return 0
	}
	id, _ := info.ID()
	return id
}

// mapID is the id of map m (0 if unknown).
func mapID(m *ebpf.Map) ebpf.MapID {
	if m == nil {
		return 0
	}
	info, err := m.Info()
	if err != nil {
		return 0
	}
	id, _ := info.ID()
	return id
}

// progMaps opens the maps program p uses, by name (a name met twice keeps
// the first; the caller closes them all).
func progMaps(p *ebpf.Program) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	info, err := p.Info()
	if err != nil {
		return out
	}
	ids, _ := info.MapIDs()
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		if err != nil || out[mi.Name] != nil {
			m.Close()
			continue
		}
		out[mi.Name] = m
	}
	return out
}

// takeMaps returns the maps of ms named by names (nil if one is missing)
// and closes the others.
func takeMaps(ms map[string]*ebpf.Map, names ...string) []*ebpf.Map {
	out := make([]*ebpf.Map, len(names))
	ok := true
	for i, n := range names {
		out[i] = ms[n]
		ok = ok && out[i] != nil
		delete(ms, n)
	}
	for _, m := range ms {
		m.Close()
	}
	if !ok {
		closeMaps(out)
		return nil
	}
	return out
}

// closeMaps closes maps (nil ones are fine).
func closeMaps(ms []*ebpf.Map) {
	for _, m := range ms {
		m.Close()
	}
}

// usesMap reports whether program p uses map m.
func usesMap(p *ebpf.Program, m *ebpf.Map) bool {
	id := mapID(m)
	if id == 0 {
		return false
	}
	info, err := p.Info()
	if err != nil {
		return false
	}
	ids, _ := info.MapIDs()
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
