// Package isolator is isolatord's container lifecycle: Prepare reserves ports
// and an ephemeral block, Isolate plumbs the container's network through the
// data plane, Update changes its static ports, Usage reports its traffic,
// Cleanup removes everything. State is persisted (store.go) before and after
// every kernel mutation, and Start recovers from it (recover.go).
//
// Calls for one container are serialized by a per-container lock; the
// lifecycle lets calls for different containers run concurrently.
// Bookkeeping (allocator, ledger, slots, records) sits behind one
// short-held mutex; kernel work and disk writes happen outside it. Writes of
// concurrent calls share bbolt transactions (group commit, storebatch.go).
// How far the kernel work of different containers overlaps is the data
// plane's: the kernel one (package dataplane) builds and removes a
// container's own objects concurrently with others' but serialises the
// steps that touch tables shared by all containers (the host's demux
// entries in Isolate and Cleanup, the whole of SetPorts and SetLimits in
// Update, and recovery) behind one mutex. Get and List read a copy of the
// records kept beside the bookkeeping (view.go) and wait for no lock;
// Status takes only the short mutex; Usage (traffic counters and, with
// UsageWithSockets, the namespace's socket figures) takes the container's
// lock, so the figures are of the container its record describes, and
// reads the kernel without waiting for other containers' calls.
package isolator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/rate"
)

// DataPlane is the kernel side as the lifecycle sees it, in the types of
// package plane. dataplane.DataPlane implements it; unit tests use a fake.
type DataPlane interface {
	PrepareHost(ctx context.Context) (plane.HostInfo, error)
	Setup(ctx context.Context, c plane.Container) (plane.Plumbing, error)
	SetPorts(ctx context.Context, c plane.Container, ports, shared ephemeral.Set) error
	SetLimits(ctx context.Context, c plane.Container, egress, ingress rate.Limit) error
	Stats(ctx context.Context, c plane.Container) (plane.LinkStats, error)
	// SocketStats reads socket and SNMP figures inside c's namespace.
	SocketStats(ctx context.Context, c plane.Container) (plane.SocketStats, error)
	Teardown(ctx context.Context, c plane.Container) (plane.TeardownReport, error)
	Check(ctx context.Context, c plane.Container) ([]string, error)
	Adopt(ctx context.Context, c plane.Container) error
	RemoveStrays(ctx context.Context, keep []plane.Container) ([]string, error)
	Strays(ctx context.Context, keep []plane.Container) ([]string, error)
	Discover(ctx context.Context, known []string) (plane.Discovery, error)
	MountPath(id string) string
	// PlanPin says where Setup would pin c's namespace and whether the pin
	// would be isolatord's own, changing nothing.
	PlanPin(c plane.Container) (path string, owned bool, err error)
	// NetNSInode identifies a network namespace file by its inode,
	// refusing anything that is not one.
	NetNSInode(path string) (uint64, error)
	// NetNSMounts lists the mount points of every mounted network
	// namespace, by inode (the mount table).
	NetNSMounts() (map[uint64][]string, error)
}

// State of a container record. The -ing states are intents written before a
// kernel mutation; recovery resolves them.
type State string

const (
	StatePrepared  State = "prepared"
	StateIsolating State = "isolating"
	StateIsolated  State = "isolated"
	StateUpdating  State = "updating"
	StateCleaning  State = "cleaning"
)

// Record is one container as persisted.
type Record struct {
	ID        string            `json:"id"`
	State     State             `json:"state"`
	Slot      uint16            `json:"slot"`
	Ephemeral ephemeral.Range   `json:"ephemeral"`
	Ports     ephemeral.Set     `json:"ports"`  // exclusive static ports
	Shared    ephemeral.Set     `json:"shared"` // shared static ports
	Created   time.Time         `json:"created"`
	Isolated  time.Time         `json:"isolated,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`

	// Isolation target and result.
	Pid       int    `json:"pid,omitempty"`
	PidStart  uint64 `json:"pid_start,omitempty"` // process start time (clock ticks) to detect pid reuse
	NetNSPath string `json:"netns_path,omitempty"`
	NetNSIno  uint64 `json:"netns_ino,omitempty"`
	Veth      string `json:"veth,omitempty"`
	Mount     string `json:"mount,omitempty"`
	// PinOwned: isolatord made the pin at Mount and removes it at cleanup;
	// false when the runtime had pinned the namespace there (its pin is
	// used, never unmounted). Records written before the field existed
	// load as owned (store.go): isolatord made every pin then.
	PinOwned bool `json:"pin_owned"`

	// Bandwidth limits in force (zero: none), see limits.go.
	Egress  rate.Limit `json:"egress_limit,omitzero"`
	Ingress rate.Limit `json:"ingress_limit,omitzero"`

	// While State == updating: the ports being moved to.
	NewPorts  *ephemeral.Set `json:"new_ports,omitempty"`
	NewShared *ephemeral.Set `json:"new_shared,omitempty"`

	// Draining: static ports the container drains (drain.go; the kernel's
	// drain markers are the truth, this is the journal).
	Draining ephemeral.Set `json:"draining,omitzero"`
	// DrainDeadline: when the flows left on the drained ports are cut
	// (zero: never).
	DrainDeadline time.Time `json:"drain_deadline,omitzero"`
	// HandoffFrom, HandoffPorts: a successor's predecessor and the ports it
	// hands over, until the successor is isolated and the predecessor
	// drains them (drain.go).
	HandoffFrom  string        `json:"handoff_from,omitempty"`
	HandoffPorts ephemeral.Set `json:"handoff_ports,omitzero"`
	// HandoffExclusive: handed-over ports the successor asked for
	// exclusively; it holds them shared until the predecessor is cleaned
	// up, then exclusively again (drain.go).
	HandoffExclusive ephemeral.Set `json:"handoff_exclusive,omitzero"`

	// Lost names what a rebuild from the kernel could not recover.
	Lost []string `json:"lost,omitempty"`

	// Seq numbers the record's writes: an intent replaces the database's
	// record at load only if newer (intents.go).
	Seq uint64 `json:"seq,omitempty"`
}

// Config configures the lifecycle.
type Config struct {
	ManagedPorts  ephemeral.Set   // operator-managed static ports
	EphemeralPool ephemeral.Set   // pool of per-container ephemeral blocks
	BlockSize     int             // ephemeral ports per container
	HostLocal     ephemeral.Range // host ip_local_port_range (start-up overlap check); zero = skip
	StateDir      string
	Version       string
	Logger        *slog.Logger
	// ProcRoot is where /proc is (tests); default "/proc".
	ProcRoot string
	// Observer receives lifecycle events (metrics); may be nil.
	Observer Observer
	// Egress and Ingress are the bandwidth limits of containers whose
	// Prepare gives none (zero: no limit).
	Egress, Ingress rate.Limit
	// HostPorts reserves containers' static ports in the host namespace
	// (hostports.go); nil: no host reservations.
	HostPorts HostPorts
	// HostPortsRetry is how often ports a host process took while the
	// daemon was down are tried again (0: DefaultHostPortsRetry).
	HostPortsRetry time.Duration
}

// Observer receives lifecycle events, for metrics. Implementations must be
// cheap and safe for concurrent use.
type Observer interface {
	// Operation reports one lifecycle call: op is prepare, isolate, update,
	// usage or cleanup; err is nil on success (its kind via KindOf).
	Operation(op string, d time.Duration, err error)
	// Recovered reports the outcome of start-up recovery.
	Recovered(rep RecoveryReport, d time.Duration)
}

// observe reports a call to the observer; use as defer s.observe(op, time.Now(), &err).
func (s *Isolator) observe(op string, start time.Time, err *error) {
	if s.cfg.Observer != nil {
		s.cfg.Observer.Operation(op, time.Since(start), *err)
	}
}

// Isolator is the lifecycle over a data plane and a state store.
type Isolator struct {
	cfg   Config
	dp    DataPlane
	log   *slog.Logger
	store *store
	host  atomic.Pointer[plane.HostInfo] // Host

	locks keyedMutex

	// rmu guards the default limits (cfg.Egress, cfg.Ingress), unattributed
	// and rebuilt: changed by start-up, reloads and RemoveUnattributed,
	// never by a setup or teardown, and read by Status and the metrics
	// without mu.
	rmu sync.Mutex

	mu      sync.Mutex // guards everything below but view, unattributed and rebuilt
	records map[string]*Record
	// view is records as Get, List and Usage read them, without mu
	// (view.go); it changes with records, under mu.
	view recordView
	// netnsOwner maps a network namespace (inode) to the container isolated
	// (or being isolated) into it.
	netnsOwner map[uint64]string
	alloc      *ephemeral.Allocator
	ledger     *ephemeral.Ledger
	slots      slotSet
	hostPorts  *hostLedger // its own lock: take it after mu, never before
	// unattributed: kernel objects recovery left in place (rebuild.go);
	// unattributed and rebuilt are guarded by rmu.
	unattributed []string
	rebuilt      []string
	// held: what unattributed kernel objects still route, kept reserved
	// (held.go); guarded by mu.
	held []heldClaim
	// Hooks for tests (fault injection); nil in production.
	hook func(point string)
	// orphans counts reclaimed orphaned containers (orphans.go).
	orphans orphanCount
}

// New validates the configuration and opens the state; call Start to recover.
func New(cfg Config, dp DataPlane) (*Isolator, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.EphemeralPool.Empty() {
		return nil, errors.New("no ephemeral ports: set --ephemeral-ports")
	}
	if err := ephemeral.ValidatePools(cfg.EphemeralPool, cfg.ManagedPorts, cfg.HostLocal); err != nil {
		return nil, err
	}
	alloc, err := ephemeral.NewAllocator(cfg.EphemeralPool, cfg.BlockSize)
	if err != nil {
		return nil, err
	}
	st, err := openStore(cfg.StateDir, cfg.Logger)
	if err != nil {
		return nil, err
	}
	return &Isolator{
		cfg:        cfg,
		dp:         dp,
		log:        cfg.Logger,
		store:      st,
		records:    map[string]*Record{},
		netnsOwner: map[uint64]string{},
		alloc:      alloc,
		ledger:     ephemeral.NewLedger(cfg.ManagedPorts, cfg.EphemeralPool),
		hostPorts:  newHostLedger(cfg.HostPorts),
	}, nil
}

// Close closes the state store. Kernel plumbing stays in place.
func (s *Isolator) Close() error {
	s.hostPorts.stop()
	return s.store.close()
}

func (s *Isolator) at(point string) {
	if s.hook != nil {
		s.hook(point)
	}
}

// PortSpec is one requested static port range as it arrives from the API
// (uint32 so that values above 65535 are rejected, not truncated).
type PortSpec struct {
	Begin, End uint32
	Shared     bool
}

// ParsePorts validates requested ports and returns the exclusive and shared
// sets. field names the request field in error messages (e.g. "ports").
func ParsePorts(field string, specs []PortSpec) (excl, shared ephemeral.Set, err error) {
	for i, p := range specs {
		name := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case p.Begin == 0:
			return excl, shared, errorf(ErrInvalidArgument, "%s.begin: port 0 is not a valid port (1-65535)", name)
		case p.Begin > 65535:
			return excl, shared, errorf(ErrInvalidArgument, "%s.begin: port %d is out of range 1-65535", name, p.Begin)
		case p.End == 0:
			return excl, shared, errorf(ErrInvalidArgument, "%s.end: missing (use end = begin for a single port)", name)
		case p.End > 65535:
			return excl, shared, errorf(ErrInvalidArgument, "%s.end: port %d is out of range 1-65535", name, p.End)
		case p.End < p.Begin:
			return excl, shared, errorf(ErrInvalidArgument, "%s: reversed range %d-%d (begin must be <= end)", name, p.Begin, p.End)
		}
		r := ephemeral.NewSet(ephemeral.Range{Begin: uint16(p.Begin), End: uint16(p.End)})
		if p.Shared {
			shared = shared.Union(r)
		} else {
			excl = excl.Union(r)
		}
	}
	if both := excl.Intersect(shared); !both.Empty() {
		return excl, shared, errorf(ErrInvalidArgument, "%s: ports %s are requested both shared and exclusive", field, both)
	}
	return excl, shared, nil
}

func validateID(id string) error {
	if id == "" {
		return errorf(ErrInvalidArgument, "container_id: must not be empty")
	}
	if err := plane.ValidateID(id); err != nil {
		return errorf(ErrInvalidArgument, "container_id: %v", err)
	}
	return nil
}

// validateLabels bounds the labels a caller may store.
func validateLabels(labels map[string]string) error {
	if len(labels) > 32 {
		return errorf(ErrInvalidArgument, "labels: %d labels, at most 32 allowed", len(labels))
	}
	for k, v := range labels {
		if k == "" || len(k) > 253 {
			return errorf(ErrInvalidArgument, "labels: key %q must be 1-253 characters", k)
		}
		if len(v) > 253 {
			return errorf(ErrInvalidArgument, "labels[%s]: value longer than 253 characters", k)
		}
	}
	return nil
}

// ledgerError maps a ledger refusal to an API error.
func ledgerError(id string, err error) error {
	var ce *ephemeral.ConflictError
	switch {
	case errors.As(err, &ce):
		return &Error{Kind: ErrFailedPrecondition, Msg: fmt.Sprintf("ports: %v", err), Err: err}
	case errors.Is(err, ephemeral.ErrNotManaged), errors.Is(err, ephemeral.ErrInEphemeralPool):
		return &Error{Kind: ErrInvalidArgument, Msg: fmt.Sprintf("ports: %v", err), Err: err}
	default:
		return &Error{Kind: ErrInvalidArgument, Msg: fmt.Sprintf("ports: container %s: %v", id, err), Err: err}
	}
}

// Prepare reserves the static ports and an ephemeral block for a container.
// Repeating it with the same ports returns the same container; different
// ports get ErrAlreadyExists.
func (s *Isolator) Prepare(ctx context.Context, id string, ports []PortSpec) (Record, error) {
	return s.PrepareWith(ctx, id, PrepareOptions{Ports: ports})
}

// PrepareOptions is what a Prepare asks for.
type PrepareOptions struct {
	Ports []PortSpec
	// Labels are stored alongside the container (for example the CNI
	// network it belongs to).
	Labels map[string]string
	// Egress and Ingress are the container's bandwidth limits; nil takes
	// the daemon's default (Config.Egress, Config.Ingress).
	Egress, Ingress *LimitSpec
	// HandoffFrom names a predecessor that hands HandoffPorts (among
	// Ports) over to this container once it is isolated (drain.go).
	HandoffFrom  string
	HandoffPorts []uint16
}

// PrepareWith is Prepare with labels and bandwidth limits. Repeating it
// returns the same container when the ports, and the limits it gives, are
// the same; labels are not compared.
func (s *Isolator) PrepareWith(ctx context.Context, id string, o PrepareOptions) (_ Record, err error) {
	defer s.observe("prepare", time.Now(), &err)
	if err := validateID(id); err != nil {
		return Record{}, err
	}
	labels := o.Labels
	if err := validateLabels(labels); err != nil {
		return Record{}, err
	}
	excl, shared, err := ParsePorts("ports", o.Ports)
	if err != nil {
		return Record{}, err
	}
	defEg, defIn := s.DefaultLimits()
	eg, err := s.resolveLimit("egress_limit", o.Egress, defEg)
	if err != nil {
		return Record{}, err
	}
	in, err := s.resolveLimit("ingress_limit", o.Ingress, defIn)
	if err != nil {
		return Record{}, err
	}
	askedExcl := excl
	if excl, shared, err = s.prepareHandoff(ctx, id, &o, excl, shared); err != nil {
		return Record{}, err
	}
	unlock := s.locks.lock(id)
	defer unlock()

	s.mu.Lock()
	if r, ok := s.records[id]; ok {
		s.mu.Unlock()
		samePorts := r.Ports.Equal(excl) && r.Shared.Equal(shared)
		sameLimits := (o.Egress == nil || r.Egress == eg) && (o.Ingress == nil || r.Ingress == in)
		switch {
		case samePorts && sameLimits:
			return *r, nil
		case !samePorts:
			return Record{}, errorf(ErrAlreadyExists, "container_id: %s is already prepared with ports %s (asked for %s)", id, portsString(r.Ports, r.Shared), portsString(excl, shared))
		}
		return Record{}, errorf(ErrAlreadyExists, "container_id: %s is already prepared with egress limit %s and ingress limit %s (asked for %s and %s; Update changes limits)",
			id, LimitString(r.Egress), LimitString(r.Ingress), LimitString(eg), LimitString(in))
	}
	// The ports first: a conflict says more than an exhausted pool.
	if err := s.ledger.Reserve(id, ephemeral.Request{Exclusive: excl, Shared: shared}); err != nil {
		s.mu.Unlock()
		return Record{}, ledgerError(id, err)
	}
	slot, ok := s.slots.take()
	if !ok {
		s.ledger.Release(id)
		s.mu.Unlock()
		return Record{}, errorf(ErrResourceExhausted, "no container slot left (at most %d containers)", plane.MaxSlot)
	}
	block, err := s.alloc.Allocate()
	if err != nil {
		s.ledger.Release(id)
		s.slots.put(slot)
		s.mu.Unlock()
		if errors.Is(err, ephemeral.ErrExhausted) {
			return Record{}, errorf(ErrResourceExhausted, "no ephemeral port block left: all %d blocks of %d ports in %s are in use", s.alloc.Total(), s.alloc.BlockSize(), s.cfg.EphemeralPool)
		}
		return Record{}, wrapf(ErrInternal, err, "allocate ephemeral block")
	}
	s.mu.Unlock()
	// Host reservations (hostports.go): a host process holding a port refuses the Prepare.
	if err := s.hostReserve(id, excl.Union(shared)); err != nil {
		s.mu.Lock()
		s.ledger.Release(id)
		s.slots.put(slot)
		_ = s.alloc.Release(block)
		s.mu.Unlock()
		return Record{}, err
	}
	s.mu.Lock()
	r := &Record{ID: id, State: StatePrepared, Slot: slot, Ephemeral: block, Ports: excl, Shared: shared, Created: time.Now().UTC(), Labels: labels,
		Egress: eg, Ingress: in}
	if o.HandoffFrom != "" {
		r.HandoffFrom = o.HandoffFrom
		for _, p := range o.HandoffPorts {
			r.HandoffPorts = r.HandoffPorts.Union(ephemeral.MustParseSet(strconv.Itoa(int(p))))
		}
		r.HandoffExclusive = r.HandoffPorts.Intersect(askedExcl)
	}
	s.records[id] = r
	s.view.show(r)
	rec := *r
	s.mu.Unlock()

	// The answer waits for the prepared record in the journal, not for
	// its commit (preparedStored). The journal is read at the next start
	// whatever the database holds then: a removal still queued of a
	// container cleaned up before (whose slot, ports or block this one
	// may have taken) must have ended first, as it would have if this
	// record had been queued after it.
	s.store.removalsEnded()
	if err := s.store.intend(&rec); err != nil {
		s.forget(id)
		return Record{}, wrapf(ErrInternal, err, "persist container %s", id)
	}
	intent := rec.Seq
	stored := rec
	landed := s.store.prepared.queued(id)
	if err := s.store.putLater(&stored, func(err error) { landed(); s.preparedStored(id, intent, err) }); err != nil {
		landed()
		s.store.settled(id, intent, s.log)
		s.forget(id)
		return Record{}, wrapf(ErrInternal, err, "persist container %s", id)
	}
	s.log.Info("prepared", "container_id", id, "ephemeral_ports", block.String(), "ports", portsString(excl, shared), "slot", slot,
		"egress_limit", LimitString(eg), "ingress_limit", LimitString(in))
	return rec, nil
}

// forget drops a container's record from memory and releases everything
// it holds: the bookkeeping under s.mu, then its host reservations (closing
// sockets) after it. Its host ports stay counted as held until then, so no
// other container's reservation of one is lost in between.
func (s *Isolator) forget(id string) {
	s.mu.Lock()
	r, ok := s.records[id]
	if ok {
		delete(s.records, id)
		s.view.hide(id)
		if s.netnsOwner[r.NetNSIno] == id {
			delete(s.netnsOwner, r.NetNSIno)
		}
		s.ledger.Release(id)
		if err := s.alloc.Release(r.Ephemeral); err != nil {
			s.log.Warn("release ephemeral block", "container_id", id, "range", r.Ephemeral.String(), "err", err)
		}
		s.slots.put(r.Slot)
	}
	s.mu.Unlock()
	if ok {
		s.hostPorts.settle(id, ephemeral.Set{})
	}
}

// releaseNetNS drops id's claim on a namespace (after a failed isolate).
func (s *Isolator) releaseNetNS(ino uint64, id string) {
	s.mu.Lock()
	if s.netnsOwner[ino] == id {
		delete(s.netnsOwner, ino)
	}
	s.mu.Unlock()
}

// IsolateTarget names the container's network namespace: a pid or a path.
type IsolateTarget struct {
	Pid       int
	NetNSPath string
}

// Isolate plumbs the container's network. Repeating it with the same target
// returns the same container; another target gets AlreadyExists.
func (s *Isolator) Isolate(ctx context.Context, id string, t IsolateTarget) (Record, error) {
	r, _, _, err := s.IsolateIfLabeled(ctx, id, nil, t)
	return r, err
}

// isolateLocked is Isolate with id's lock held.
func (s *Isolator) isolateLocked(ctx context.Context, id string, t IsolateTarget) (_ Record, err error) {
	if t.Pid != 0 && t.NetNSPath != "" {
		return Record{}, errorf(ErrInvalidArgument, "target: give either pid or netns_path, not both")
	}
	if t.Pid < 0 || (t.Pid == 0 && t.NetNSPath == "") {
		return Record{}, errorf(ErrInvalidArgument, "pid: must be > 0 (or give netns_path), got %d", t.Pid)
	}

	s.mu.Lock()
	r, ok := s.records[id]
	var cur Record
	if ok {
		cur = *r
	}
	s.mu.Unlock()
	if !ok {
		return Record{}, errorf(ErrFailedPrecondition, "container_id: %s is not prepared (call Prepare first)", id)
	}
	if cur.State == StateIsolated {
		if (t.Pid != 0 && t.Pid == cur.Pid) || (t.NetNSPath != "" && t.NetNSPath == cur.NetNSPath) {
			return cur, nil
		}
		return Record{}, errorf(ErrAlreadyExists, "container_id: %s is already isolated (%s)", id, targetString(cur.Pid, cur.NetNSPath))
	}
	if cur.State != StatePrepared {
		return Record{}, errorf(ErrFailedPrecondition, "container_id: %s is %s", id, cur.State)
	}

	// Resolve the target before writing anything.
	next := cur
	if t.Pid > 0 {
		start, err := procStart(s.cfg.ProcRoot, t.Pid)
		if err != nil {
			return Record{}, errorf(ErrNotFound, "pid: process %d not found", t.Pid)
		}
		next.Pid, next.PidStart = t.Pid, start
		next.NetNSPath = fmt.Sprintf("%s/%d/ns/net", s.cfg.ProcRoot, t.Pid)
	} else {
		if _, err := os.Stat(t.NetNSPath); err != nil {
			return Record{}, errorf(ErrNotFound, "netns_path: %s: %v", t.NetNSPath, errors.Unwrap(err))
		}
		next.NetNSPath = t.NetNSPath
	}
	ino, err := s.dp.NetNSInode(next.NetNSPath)
	if err != nil {
		return Record{}, errorf(ErrNotFound, "%s: %s is not a network namespace: %v", targetField(t), next.NetNSPath, err)
	}
	next.NetNSIno = ino
	if s.Host().NetNSIno != 0 && ino == s.Host().NetNSIno {
		return Record{}, errorf(ErrFailedPrecondition, "%s: %s is the host's own network namespace", targetField(t), next.NetNSPath)
	}
	// One namespace holds one container (its eth0 is ours): claim it
	// atomically, so two concurrent Isolates into one namespace cannot both
	// pass.
	s.mu.Lock()
	if owner, ok := s.netnsOwner[ino]; ok && owner != id {
		s.mu.Unlock()
		return Record{}, errorf(ErrFailedPrecondition, "%s: network namespace %s already holds container %s", targetField(t), next.NetNSPath, owner)
	}
	s.netnsOwner[ino] = id
	s.mu.Unlock()
	next.State = StateIsolating
	next.Veth = plane.VethName(id)
	// Where the pin will be and whether it will be ours, in the intent:
	// recovery from a crash before the outcome is written must know
	// whether the pin it finds may be removed (a runtime's never may).
	if next.Mount, next.PinOwned, err = s.dp.PlanPin(s.container(&next)); err != nil {
		s.releaseNetNS(ino, id)
		return Record{}, errorf(ErrNotFound, "%s: %s: %v", targetField(t), next.NetNSPath, err)
	}
	if err := s.intend(&next); err != nil {
		s.releaseNetNS(ino, id)
		return Record{}, err
	}
	s.at("isolate:intent")

	plumb, err := s.dp.Setup(ctx, s.container(&next))
	if err != nil {
		// Setup rolled back its own work; return to prepared.
		s.releaseNetNS(ino, id)
		back := cur
		if perr := s.commit(&back); perr != nil {
			s.log.Error("persist rollback", "container_id", id, "err", perr)
		}
		if errors.Is(err, plane.ErrHostNamespace) {
			which := "the host's own network namespace"
			var rn *plane.RefusedNamespaceError
			if errors.As(err, &rn) {
				which = rn.Which
			}
			return Record{}, errorf(ErrFailedPrecondition, "%s: %s is %s, not a container's", targetField(t), next.NetNSPath, which)
		}
		return Record{}, wrapf(ErrInternal, err, "isolate %s", id)
	}
	s.at("isolate:plumbed")
	intent := next.Seq
	next.State = StateIsolated
	next.Isolated = time.Now().UTC()
	next.Veth = plumb.Veth
	next.Mount, next.PinOwned = plumb.Mount, plumb.PinOwned
	s.at("isolate:outcome")
	// The answer does not wait for the outcome's commit (isolatedStored).
	if err := s.store.putLater(&next, func(err error) { s.isolatedStored(id, intent, err) }); err != nil {
		return Record{}, wrapf(ErrInternal, err, "persist container %s", id)
	}
	s.publish(&next)
	s.log.Info("isolated", "container_id", id, "veth", plumb.Veth, "netns", plumb.Mount, "target", targetString(next.Pid, next.NetNSPath))
	return next, nil
}

// isolatedStored is called once the isolated record of container id, whose
// isolating intent is numbered intent, is committed. The caller was
// answered before, with the intent still in the journal: a daemon killed
// before the commit finds the intent at its next start and, the plumbing
// being complete, records the container as isolated (the answer it gave);
// a machine that loses power loses the intent and the kernel objects alike
// (see intents.go) and comes back with the prepared record, nothing in the
// kernel. The write was queued before the answer, so every later write of
// the container is committed with it or after it. The intent is removed
// under the container's lock unless a newer one replaced it; after a
// failed commit it stays, for the next start to resolve.
func (s *Isolator) isolatedStored(id string, intent uint64, err error) {
	s.stored(id, intent, "isolated", err)
}

// preparedStored is called once the prepared record of container id,
// whose prepared intent is numbered intent, is committed. The caller was
// answered before, with the record in the journal: a daemon killed before
// the commit finds it there at its next start (intents.go). The intent is
// removed under the container's lock unless a newer one (an Isolate's)
// replaced it; after a failed commit it stays, for the next start.
func (s *Isolator) preparedStored(id string, intent uint64, err error) {
	s.stored(id, intent, "prepared", err)
}

// stored removes container id's intent numbered intent once the record
// (a state) it stands for is committed (err nil); after a failed commit
// the intent stays, for the next start to resolve.
func (s *Isolator) stored(id string, intent uint64, state string, err error) {
	unlock := s.locks.lock(id)
	defer unlock()
	if err != nil {
		s.log.Error("persist "+state+" container: its intent stays in the journal for the next start to resolve", "container_id", id, "err", err)
		return
	}
	s.store.settled(id, intent, s.log)
}

// commit persists r (a stable state, in the database; its intent, if any,
// is then removed) and publishes it in memory.
func (s *Isolator) commit(r *Record) error {
	if err := s.store.put(r); err != nil {
		return wrapf(ErrInternal, err, "persist container %s", r.ID)
	}
	s.at("commit:stored")
	s.store.settled(r.ID, 0, s.log)
	s.publish(r)
	return nil
}

// intend persists r, a transitional state written before the kernel is
// touched, in the intent journal (intents.go), and publishes it in memory.
func (s *Isolator) intend(r *Record) error {
	if r.State != StateIsolating {
		s.waitPrepared(r.ID) // (preparequeue.go)
	}
	if err := s.store.intend(r); err != nil {
		return wrapf(ErrInternal, err, "persist container %s", r.ID)
	}
	s.publish(r)
	return nil
}

// publish replaces the in-memory record of r's container by r.
func (s *Isolator) publish(r *Record) {
	s.mu.Lock()
	if cur, ok := s.records[r.ID]; ok {
		*cur = *r
		s.view.show(cur)
	}
	s.mu.Unlock()
}

// container converts a record to the data plane's view. The namespace is
// reached through the pin once there is one; while isolating, the pin is
// only planned (Mount and PinOwned from PlanPin), so through the target.
func (s *Isolator) container(r *Record) plane.Container {
	ns := r.NetNSPath
	if r.Mount != "" && r.State != StateIsolating {
		ns = r.Mount
	}
	return plane.Container{ID: r.ID, Slot: r.Slot, NetNS: ns, Ephemeral: r.Ephemeral, Ports: r.Ports, Shared: r.Shared,
		Egress: r.Egress, Ingress: r.Ingress, Pin: r.Mount, PinOwned: r.PinOwned,
		Meta: plane.Meta{Created: unixOrZero(r.Created), Labels: r.Labels, PinOwned: r.PinOwned}}
}

// Update changes the static ports of a container, all or nothing.
func (s *Isolator) Update(ctx context.Context, id string, ports []PortSpec) (_ Record, err error) {
	return s.UpdateWith(ctx, id, UpdateOptions{Ports: ports})
}

// UpdateOptions is what an Update changes.
type UpdateOptions struct {
	// Ports is the complete new list of static ports, unless KeepPorts:
	// then the ports stay as they are and Ports must be empty.
	Ports     []PortSpec
	KeepPorts bool
	// Egress and Ingress are new bandwidth limits; nil keeps the current
	// one, a zero Rate removes it.
	Egress, Ingress *LimitSpec
}

// UpdateWith changes the static ports and/or the bandwidth limits of a
// container, all or nothing: the limits first (in place, see
// DataPlane.SetLimits), then the ports; if the ports fail, the limits are
// put back.
func (s *Isolator) UpdateWith(ctx context.Context, id string, o UpdateOptions) (_ Record, err error) {
	defer s.observe("update", time.Now(), &err)
	if err := validateID(id); err != nil {
		return Record{}, err
	}
	if o.KeepPorts && len(o.Ports) > 0 {
		return Record{}, errorf(ErrInvalidArgument, "ports: must be empty when keep_ports is set")
	}
	excl, shared, err := ParsePorts("ports", o.Ports)
	if err != nil {
		return Record{}, err
	}
	var eg, in *rate.Limit
	for _, x := range []struct {
		field string
		spec  *LimitSpec
		out   **rate.Limit
	}{{"egress_limit", o.Egress, &eg}, {"ingress_limit", o.Ingress, &in}} {
		if x.spec != nil {
			l, err := ParseLimit(x.field, *x.spec, s.Host())
			if err != nil {
				return Record{}, err
			}
			*x.out = &l
		}
	}
	unlock := s.locks.lock(id)
	defer unlock()

	s.mu.Lock()
	r, ok := s.records[id]
	if !ok {
		s.mu.Unlock()
		return Record{}, errorf(ErrNotFound, "container_id: %s is not known", id)
	}
	cur := *r
	s.mu.Unlock()
	if o.KeepPorts {
		excl, shared = cur.Ports, cur.Shared
	}
	newEg, newIn := cur.Egress, cur.Ingress
	if eg != nil {
		newEg = *eg
	}
	if in != nil {
		newIn = *in
	}
	samePorts := cur.Ports.Equal(excl) && cur.Shared.Equal(shared)
	sameLimits := newEg == cur.Egress && newIn == cur.Ingress
	if samePorts && sameLimits {
		return cur, nil
	}
	if cur.State != StatePrepared && cur.State != StateIsolated {
		return Record{}, errorf(ErrFailedPrecondition, "container_id: %s is %s", id, cur.State)
	}
	if sameLimits {
		return s.updatePorts(ctx, cur, excl, shared)
	}
	next, err := s.updateLimits(ctx, cur, newEg, newIn)
	if err != nil || samePorts {
		return next, err
	}
	done, err := s.updatePorts(ctx, next, excl, shared)
	if err != nil {
		if _, rerr := s.updateLimits(ctx, next, cur.Egress, cur.Ingress); rerr != nil {
			s.log.Error("put the limits back after a failed port update", "container_id", id, "err", rerr)
		}
		return Record{}, err
	}
	return done, nil
}

// updateLimits sets a container's limits; the per-container lock is held.
// The new limits are persisted before the kernel changes: a daemon killed
// in between finds them in the record, and recovery (Adopt) brings the
// kernel to them.
func (s *Isolator) updateLimits(ctx context.Context, cur Record, eg, in rate.Limit) (Record, error) {
	next := cur
	next.Egress, next.Ingress = eg, in
	if err := s.commit(&next); err != nil {
		return Record{}, err
	}
	if cur.State == StateIsolated {
		s.at("limits:intent")
		if err := s.dp.SetLimits(ctx, s.container(&next), eg, in); err != nil {
			back := cur
			if perr := s.commit(&back); perr != nil {
				s.log.Error("persist rollback", "container_id", cur.ID, "err", perr)
			}
			return Record{}, wrapf(ErrInternal, err, "update bandwidth limits of %s", cur.ID)
		}
	}
	s.log.Info("updated", "container_id", cur.ID, "egress_limit", LimitString(eg), "ingress_limit", LimitString(in))
	return next, nil
}

// updatePorts changes a container's static ports; the per-container lock is
// held.
func (s *Isolator) updatePorts(ctx context.Context, cur Record, excl, shared ephemeral.Set) (_ Record, err error) {
	id := cur.ID
	// Host reservations (hostports.go): on failure keep the old ports', on success the new ones'.
	defer func() {
		if err != nil {
			s.hostPorts.settle(id, cur.Ports.Union(cur.Shared))
		} else {
			s.hostPorts.settle(id, excl.Union(shared))
		}
	}()
	s.mu.Lock()
	// Hold old ∪ new while the kernel moves over, so no other container can
	// take a port whose filters still point here.
	hold := ephemeral.Request{Exclusive: cur.Ports.Union(excl), Shared: cur.Shared.Union(shared).Subtract(cur.Ports.Union(excl))}
	if err := s.ledger.Update(id, ephemeral.Request{Exclusive: excl, Shared: shared}); err != nil {
		s.mu.Unlock()
		return Record{}, ledgerError(id, err)
	}
	s.mu.Unlock()
	if err := s.hostReserve(id, excl.Union(shared)); err != nil {
		s.mu.Lock()
		_ = s.ledger.Update(id, ephemeral.Request{Exclusive: cur.Ports, Shared: cur.Shared})
		s.mu.Unlock()
		return Record{}, err
	}
	s.mu.Lock()
	if cur.State == StatePrepared {
		next := cur
		next.Ports, next.Shared = excl, shared
		s.mu.Unlock()
		if err := s.commit(&next); err != nil {
			s.mu.Lock()
			_ = s.ledger.Update(id, ephemeral.Request{Exclusive: cur.Ports, Shared: cur.Shared})
			s.mu.Unlock()
			return Record{}, err
		}
		s.log.Info("updated", "container_id", id, "ports", portsString(excl, shared))
		return next, nil
	}
	if err := s.ledger.Update(id, hold); err != nil {
		// The union can only fail if a port changed between exclusive and shared;
		// then holding the new set alone is what we can do.
		s.log.Debug("hold union", "container_id", id, "err", err)
	}
	s.mu.Unlock()

	next := cur
	next.State = StateUpdating
	next.NewPorts, next.NewShared = &excl, &shared
	restore := func() {
		s.mu.Lock()
		_ = s.ledger.Update(id, ephemeral.Request{Exclusive: cur.Ports, Shared: cur.Shared})
		s.mu.Unlock()
	}
	if err := s.intend(&next); err != nil {
		restore()
		return Record{}, err
	}
	s.at("update:intent")
	if err := s.dp.SetPorts(ctx, s.container(&cur), excl, shared); err != nil {
		restore()
		back := cur
		if perr := s.commit(&back); perr != nil {
			s.log.Error("persist rollback", "container_id", id, "err", perr)
		}
		return Record{}, wrapf(ErrInternal, err, "update ports of %s", id)
	}
	done := cur
	done.Ports, done.Shared = excl, shared
	if err := s.commit(&done); err != nil {
		return Record{}, err
	}
	s.mu.Lock()
	_ = s.ledger.Update(id, ephemeral.Request{Exclusive: excl, Shared: shared})
	s.mu.Unlock()
	s.log.Info("updated", "container_id", id, "ports", portsString(excl, shared))
	return done, nil
}

// Usage returns a container's traffic counters (zero unless it is
// isolated).
func (s *Isolator) Usage(ctx context.Context, id string) (Record, plane.LinkStats, error) {
	r, st, _, err := s.usage(ctx, id, false)
	return r, st, err
}

// UsageWithSockets is Usage with the socket and SNMP figures of the
// container's namespace, nil when it is not isolated or they cannot be
// read (the traffic counters are reported all the same).
func (s *Isolator) UsageWithSockets(ctx context.Context, id string) (Record, plane.LinkStats, *plane.SocketStats, error) {
	return s.usage(ctx, id, true)
}

// usage reads the data plane's figures of a container under its lock, so
// that they are of the container the record describes.
func (s *Isolator) usage(ctx context.Context, id string, sockets bool) (_ Record, _ plane.LinkStats, _ *plane.SocketStats, err error) {
	defer s.observe("usage", time.Now(), &err)
	if err := validateID(id); err != nil {
		return Record{}, plane.LinkStats{}, nil, err
	}
	unlock := s.locks.lock(id)
	defer unlock()
	r, ok := s.view.get(id)
	if !ok {
		return Record{}, plane.LinkStats{}, nil, errorf(ErrNotFound, "container_id: %s is not known", id)
	}
	if r.State != StateIsolated {
		return r, plane.LinkStats{}, nil, nil
	}
	c := s.container(&r)
	// The namespace's figures are read beside the link's (different
	// kernel objects, no lock in common), both before the lock is let go.
	var (
		ss   plane.SocketStats
		serr error
		wg   sync.WaitGroup
	)
	if sockets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss, serr = s.dp.SocketStats(ctx, c)
		}()
	}
	st, err := s.dp.Stats(ctx, c)
	wg.Wait()
	if err != nil {
		return r, st, nil, wrapf(ErrInternal, err, "usage of %s", id)
	}
	if !sockets {
		return r, st, nil, nil
	}
	if serr != nil {
		s.log.Debug("usage: namespace statistics", "container_id", id, "err", serr.Error())
		return r, st, nil, nil
	}
	return r, st, &ss, nil
}

// Cleanup removes everything of a container, then releases its ports.
// Cleaning an unknown or never-isolated container succeeds.
func (s *Isolator) Cleanup(ctx context.Context, id string) (err error) {
	defer s.observe("cleanup", time.Now(), &err)
	if err := validateID(id); err != nil {
		return err
	}
	var done *Record
	defer func() { s.settleSuccessors(ctx, done) }() // after the unlock below
	unlock := s.locks.lock(id)
	defer unlock()
	r, ok := s.get(id)
	if !ok {
		return nil
	}
	if err := s.cleanup(ctx, &r); err != nil {
		return err
	}
	done = &r
	return nil
}

// CleanupIfLabeled is Cleanup of a container carrying each of want's labels
// with its value; one lacking any is kept (kept is true) and nothing
// changes. The labels are checked under the container's lock, so a
// container replaced meanwhile is never removed on another's behalf.
func (s *Isolator) CleanupIfLabeled(ctx context.Context, id string, want map[string]string) (kept bool, err error) {
	defer s.observe("cleanup", time.Now(), &err)
	if err := validateID(id); err != nil {
		return false, err
	}
	var done *Record
	defer func() { s.settleSuccessors(ctx, done) }() // after the unlock below
	unlock := s.locks.lock(id)
	defer unlock()
	r, ok := s.get(id)
	if !ok {
		return false, nil
	}
	if !r.HasLabels(want) {
		return true, nil
	}
	if err := s.cleanup(ctx, &r); err != nil {
		return false, err
	}
	done = &r
	return false, nil
}

// HasLabels reports whether r carries each of want's labels with its value.
func (r Record) HasLabels(want map[string]string) bool {
	for k, v := range want {
		if got, ok := r.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// cleanup tears a container down; the per-container lock is held.
func (s *Isolator) cleanup(ctx context.Context, r *Record) error {
	if r.State != StatePrepared {
		next := *r
		next.State = StateCleaning
		if err := s.intend(&next); err != nil {
			return err
		}
		s.at("cleanup:intent")
		rep, err := s.dp.Teardown(ctx, s.container(r))
		if err != nil {
			return wrapf(ErrInternal, err, "cleanup of %s", r.ID)
		}
		if len(rep.Missing) > 0 {
			s.log.Info("cleanup found objects already gone", "container_id", r.ID, "missing", strings.Join(rep.Missing, ", "))
		}
		s.at("cleanup:torndown")
		s.store.delLater(r.ID, func(err error) { s.deleted(r.ID, next.Seq, err) })
		s.forget(r.ID)
		s.log.Info("cleaned up", "container_id", r.ID)
		return nil
	}
	// The prepared intent first: one left after the removal would bring
	// the container back at the next start (intents.go). When it cannot
	// be removed (a full disk: a removal is a line appended), the record
	// stays too.
	if err := s.store.unintend(r.ID, 0); err != nil {
		return wrapf(ErrInternal, err, "persist cleanup of %s", r.ID)
	}
	if err := s.store.del(r.ID); err != nil {
		return wrapf(ErrInternal, err, "persist cleanup of %s", r.ID)
	}
	s.at("cleanup:deleted")
	s.forget(r.ID)
	s.log.Info("cleaned up", "container_id", r.ID)
	return nil
}

// deleted is called once the removal of the record of a container torn
// down (its cleaning intent numbered seq) is committed. The caller was
// answered before: the container's kernel objects are gone and its intent
// is in the journal, so a daemon killed before the commit finishes the
// cleanup at its next start (the journal's intent), and a machine that
// loses power before it comes back with a record of an isolated container
// whose namespace is gone, which recovery cleans up too. The removal was
// queued before the call returned, so every later write (a container
// taking the same slot or ports) is committed with it or after it. The
// intent is removed under the container's lock unless a newer one of the
// same ID replaced it. A failed removal is tried once more, unless a
// container of the same ID was prepared since (its record replaced the
// old one).
func (s *Isolator) deleted(id string, seq uint64, err error) {
	unlock := s.locks.lock(id)
	defer unlock()
	if _, again := s.get(id); err != nil && !again {
		err = s.store.del(id)
	} else {
		err = nil
	}
	if err != nil {
		s.log.Error("persist cleanup: the record stays in the state until the next start finishes the cleanup", "container_id", id, "err", err.Error())
		return
	}
	s.store.settled(id, seq, s.log)
}

func (s *Isolator) get(id string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[id]
	if !ok {
		return Record{}, false
	}
	return *r, true
}

// Get returns one container.
func (s *Isolator) Get(ctx context.Context, id string) (Record, error) {
	if err := validateID(id); err != nil {
		return Record{}, err
	}
	r, ok := s.view.get(id)
	if !ok {
		return Record{}, errorf(ErrNotFound, "container_id: %s is not known", id)
	}
	return r, nil
}

// List returns every container, sorted by ID.
func (s *Isolator) List(ctx context.Context) []Record {
	return s.view.all()
}

// Status describes capacities and the host.
type Status struct {
	Version                     string
	BlockSize                   int
	BlocksTotal, BlocksUsed     int
	EphemeralPool, ManagedPorts ephemeral.Set
	ExclusivePorts, SharedPorts ephemeral.Set // static ports held
	Containers                  map[State]int
	Host                        plane.HostInfo
	// Bandwidth limits of containers that ask for none.
	DefaultEgress, DefaultIngress rate.Limit
	HostPorts                     HostPortsStatus // host port reservations (hostports.go)
	// What start-up recovery left for the operator (rebuild.go).
	Unattributed, Rebuilt []string
	StateMovedAside       string
	// OrphansReclaimed counts containers cleaned up because their
	// namespace was left without process or pin (orphans.go).
	OrphansReclaimed uint64
}

// Status returns capacities, holdings and the host the data plane found.
// It takes no lock a setup or teardown holds: the holdings come from the
// records' view (view.go), the blocks in use from the allocator's count,
// the host reservations from what the ledger last published.
func (s *Isolator) Status(ctx context.Context) Status {
	st := Status{
		Version:          s.cfg.Version,
		BlockSize:        s.alloc.BlockSize(),
		BlocksTotal:      s.alloc.Total(),
		BlocksUsed:       s.alloc.Used(),
		EphemeralPool:    s.cfg.EphemeralPool,
		ManagedPorts:     s.cfg.ManagedPorts,
		Containers:       map[State]int{},
		Host:             s.Host(),
		StateMovedAside:  s.store.movedAside,
		OrphansReclaimed: s.orphans.n.Load(),
	}
	s.rmu.Lock()
	st.DefaultEgress, st.DefaultIngress = s.cfg.Egress, s.cfg.Ingress
	st.Unattributed, st.Rebuilt = append([]string(nil), s.unattributed...), append([]string(nil), s.rebuilt...)
	s.rmu.Unlock()
	s.view.each(func(r *Record) {
		st.Containers[r.State]++
		st.ExclusivePorts = st.ExclusivePorts.Union(r.Ports)
		st.SharedPorts = st.SharedPorts.Union(r.Shared)
	})
	st.HostPorts = s.hostPorts.status()
	return st
}

func portsString(excl, shared ephemeral.Set) string {
	switch {
	case excl.Empty() && shared.Empty():
		return "none"
	case shared.Empty():
		return excl.String()
	case excl.Empty():
		return "shared " + shared.String()
	}
	return excl.String() + " + shared " + shared.String()
}

func targetString(pid int, path string) string {
	if pid > 0 {
		return "pid " + strconv.Itoa(pid)
	}
	return "netns " + path
}

func targetField(t IsolateTarget) string {
	if t.Pid > 0 {
		return "pid"
	}
	return "netns_path"
}

// slotSet hands out container slots 1..MaxSlot, lowest first.
type slotSet struct {
	used [plane.MaxSlot + 1]bool
	n    int
}

func (s *slotSet) take() (uint16, bool) {
	for i := 1; i <= plane.MaxSlot; i++ {
		if !s.used[i] {
			s.used[i] = true
			s.n++
			return uint16(i), true
		}
	}
	return 0, false
}

func (s *slotSet) claim(i uint16) bool {
	if i == 0 || int(i) > plane.MaxSlot || s.used[i] {
		return false
	}
	s.used[i] = true
	s.n++
	return true
}

func (s *slotSet) put(i uint16) {
	if i != 0 && int(i) <= plane.MaxSlot && s.used[i] {
		s.used[i] = false
		s.n--
	}
}

func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}
