package fragbpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// DefaultSize is the default number of datagrams each table (IPv4, IPv6)
// remembers (as Cilium's --bpf-fragments-map-max).
const DefaultSize = 8192

// MinSize and MaxSize bound a table's size.
const (
	MinSize = 256
	MaxSize = 1 << 20
)

// Program names as the kernel reports them (how a restarted daemon finds
// its own programs on a hook).
const (
	steerName = "frag_steer"
	learnName = "frag_learn"
)

// Runner runs fn where ifindexes mean the host's devices: the bpf(2) calls
// that attach to a device by ifindex resolve it in the calling thread's
// network namespace (nshandle.NS.Do).
type Runner func(fn func() error) error

// Steering is the loaded programs and their tables.
type Steering struct {
	objs    fragObjects
	do      Runner
	size    uint32
	adopted bool
	kept    bool
}

// Load loads the programs with tables of size datagrams per family. When
// the tcx ingress of device adoptFrom (the host's lo; 0: none) holds a
// steer program of an earlier run whose tables have this shape, its
// tables (and counters) are reused, so a restart loses no learned
// datagram; otherwise they start empty. An error means the kernel cannot
// run the programs (no BPF, no tcx): fragments then stay with the host.
func Load(size int, do Runner, adoptFrom int) (*Steering, error) {
	if size == 0 {
		size = DefaultSize
	}
	if size < MinSize || size > MaxSize {
		return nil, fmt.Errorf("fragment table size %d: must be %d..%d", size, MinSize, MaxSize)
	}
	if do == nil {
		do = func(fn func() error) error { return fn() }
	}
	spec, err := loadFrag()
	if err != nil {
		return nil, err
	}
	spec.Maps["frag4"].MaxEntries = uint32(size)
	spec.Maps["frag6"].MaxEntries = uint32(size)
	s := &Steering{do: do, size: uint32(size)}
	var opts ebpf.CollectionOptions
	var oldTag string
	if adoptFrom > 0 {
		var old map[string]*ebpf.Map
		_ = do(func() error { old, oldTag = oldMaps(adoptFrom, spec); return nil })
		if len(old) == 3 {
			opts.MapReplacements = old
			s.adopted = true
		}
		defer func() {
			for _, m := range old {
				m.Close()
			}
		}()
	}
	if err := spec.LoadAndAssign(&s.objs, &opts); err != nil {
		return nil, fmt.Errorf("load fragment programs: %w", err)
	}
	if info, err := s.objs.FragSteer.Info(); err == nil && s.adopted && info.Tag == oldTag {
		s.kept = true
	}
	return s, nil
}

// oldMaps returns the maps of the steer program attached at ifindex's
// tcx ingress, if they all have the shape spec asks for, and that
// program's tag (its code).
func oldMaps(ifindex int, spec *ebpf.CollectionSpec) (map[string]*ebpf.Map, string) {
	p := attached(ifindex, ebpf.AttachTCXIngress, steerName)
	if p == nil {
		return nil, ""
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return nil, ""
	}
	ids, _ := info.MapIDs()
	out := map[string]*ebpf.Map{}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		ms, ok := spec.Maps[mi.Name]
		if err != nil || !ok || mi.Type != ms.Type || mi.KeySize != ms.KeySize ||
			mi.ValueSize != ms.ValueSize || mi.MaxEntries != ms.MaxEntries || out[mi.Name] != nil {
			m.Close()
			continue
		}
		out[mi.Name] = m
	}
	return out, info.Tag
}

// Adopted reports whether Load reused the tables of an earlier run.
func (s *Steering) Adopted() bool { return s.adopted }

// Kept reports whether the earlier run's programs are this build's (the
// same code) on the tables Load reused: the learn programs it attached
// to containers' veths are then in force as they are, and an adopted
// container needs none attached again (a restart with many containers
// spends no bpf(2) calls and namespace switch per container on it).
func (s *Steering) Kept() bool { return s.kept }

// Size is the number of datagrams each table holds.
func (s *Steering) Size() int { return int(s.size) }

// Close releases the programs and maps held by this process; attached
// programs stay attached (and keep their maps).
func (s *Steering) Close() error { return s.objs.Close() }

// AttachSteer puts the steer program at the tcx ingress of the host
// device ifindex (host eth0, host lo), in front of its tc filters,
// replacing one of an earlier run.
func (s *Steering) AttachSteer(ifindex int) error {
	return s.do(func() error { return put(ifindex, ebpf.AttachTCXIngress, steerName, s.objs.FragSteer) })
}

// AttachLearn puts the learn program at the tcx egress of a container's
// host-side veth, replacing one of an earlier run.
func (s *Steering) AttachLearn(ifindex int) error {
	return s.do(func() error { return put(ifindex, ebpf.AttachTCXEgress, learnName, s.objs.FragLearn) })
}

// DetachSteer removes the steer program from ifindex's tcx ingress (one
// of any run); a device without it is fine.
func (s *Steering) DetachSteer(ifindex int) error {
	return s.do(func() error { return remove(ifindex, ebpf.AttachTCXIngress, steerName) })
}

// Attached reports whether ifindex's hook holds a program of ours:
// the steer program (ingress) or the learn program (egress).
func (s *Steering) Attached(ifindex int, ingress bool) (ok bool) {
	at, name := ebpf.AttachTCXEgress, learnName
	if ingress {
		at, name = ebpf.AttachTCXIngress, steerName
	}
	_ = s.do(func() error {
		if p := attached(ifindex, at, name); p != nil {
			ok = true
			p.Close()
		}
		return nil
	})
	return ok
}

func put(ifindex int, at ebpf.AttachType, name string, prog *ebpf.Program) error {
	opts := link.RawAttachProgramOptions{Target: ifindex, Program: prog, Attach: at}
	if old := attached(ifindex, at, name); old != nil {
		defer old.Close()
		opts.Anchor = link.ReplaceProgram(old)
	}
	if err := link.RawAttachProgram(opts); err != nil {
		return fmt.Errorf("attach %s to ifindex %d: %w", name, ifindex, err)
	}
	return nil
}

func remove(ifindex int, at ebpf.AttachType, name string) error {
	old := attached(ifindex, at, name)
	if old == nil {
		return nil
	}
	defer old.Close()
	err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: ifindex, Program: old, Attach: at})
	if err != nil {
		return fmt.Errorf("detach %s from ifindex %d: %w", name, ifindex, err)
	}
	return nil
}

// attached opens the program called name on ifindex's hook, or nil.
func attached(ifindex int, at ebpf.AttachType, name string) *ebpf.Program {
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil {
		return nil
	}
	for _, ap := range res.Programs {
		p, err := ebpf.NewProgramFromID(ap.ID)
		if err != nil {
			continue
		}
		if info, err := p.Info(); err == nil && info.Name == name {
			return p
		}
		p.Close()
	}
	return nil
}

// Counts are the programs' counters since the tables were created.
type Counts struct {
	Steered4, Steered6 uint64 // later fragments sent after their first fragment
	Host4, Host6       uint64 // later fragments with no entry: left to the host
	Learned            uint64 // datagrams learned (first fragments sent to a container)
	Forgotten          uint64 // entries dropped by a newer first fragment of their key
	Entries            uint64 // entries in the tables now
	// Evicted are entries the tables dropped to make room (least recently
	// used first): Learned - Forgotten - Entries.
	Evicted uint64
}

// Steered is all later fragments steered; Host all left to the host.
func (c Counts) Steered() uint64 { return c.Steered4 + c.Steered6 }
func (c Counts) Host() uint64    { return c.Host4 + c.Host6 }

// counter indexes (frag.c)
const (
	countSteered4 = iota
	countHost4
	countSteered6
	countHost6
	countLearned
	countForgotten
	countMax
)

// Counts reads the counters and counts the tables' entries (batch
// lookups).
func (s *Steering) Counts() (Counts, error) {
	var v [countMax]uint64
	for i := range v {
		var per []uint64
		if err := s.objs.Counts.Lookup(uint32(i), &per); err != nil {
			return Counts{}, fmt.Errorf("fragment counters: %w", err)
		}
		for _, x := range per {
			v[i] += x
		}
	}
	c := Counts{Steered4: v[countSteered4], Host4: v[countHost4], Steered6: v[countSteered6],
		Host6: v[countHost6], Learned: v[countLearned], Forgotten: v[countForgotten]}
	n4, err := entries[fragFrag4Key](s.objs.Frag4)
	if err != nil {
		return Counts{}, err
	}
	n6, err := entries[fragFrag6Key](s.objs.Frag6)
	if err != nil {
		return Counts{}, err
	}
	c.Entries = n4 + n6
	if c.Learned > c.Forgotten+c.Entries {
		c.Evicted = c.Learned - c.Forgotten - c.Entries
	}
	return c, nil
}

// entries counts m's entries with batch lookups of batchSize (a few
// syscalls per table, where a key-by-key walk took one per entry and
// restarted from the first key whenever the key it stood on was deleted,
// counting some twice while the table changed). K is the map's key type.
func entries[K any](m *ebpf.Map) (uint64, error) {
	const batchSize = 1024
	keys := make([]K, batchSize)
	vals := make([]uint32, batchSize)
	var cursor ebpf.MapBatchCursor
	var n uint64
	for range m.MaxEntries()/batchSize + 2 {
		got, err := m.BatchLookup(&cursor, keys, vals, nil)
		n += uint64(got)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("fragment table: %w", err)
		}
	}
	return n, nil
}
