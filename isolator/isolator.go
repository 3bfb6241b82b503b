// Package isolator is isolatord's container lifecycle: Prepare reserves ports
// and an ephemeral block, Isolate plumbs the container's network through the
// data plane, Update changes its static ports, Usage reports its traffic,
// Cleanup removes everything. State is persisted (package store) before and after
// every kernel mutation, and Start recovers from it (recover.go).
//
// Calls for one container are serialized by a per-container lock; the
// lifecycle lets calls for different containers run concurrently.
// Bookkeeping (allocator, ledger, slots, records) sits behind one
// short-held mutex; kernel work and disk writes happen outside it. Writes of
// concurrent calls share bbolt transactions (group commit).
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
//
// One file per verb: prepare.go, isolate.go (and isolatelabels.go),
// update.go, usage.go, cleanup.go, list.go (Get, List, Status), recover.go
// and rebuild.go (Start); records.go writes the records, validate.go checks
// requests.
package isolator

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/isolator/store"
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
	// used, never unmounted).
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
	// record at load only if newer (store/intents.go).
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
	store *store.Store[Record, *Record]
	// prepared are the prepared records whose commit is queued
	// (preparequeue.go).
	prepared preparedQueue
	host     atomic.Pointer[plane.HostInfo] // Host

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
	st, err := store.Open[Record](cfg.StateDir, cfg.Logger, validateID)
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
	return s.store.Close()
}

func (s *Isolator) at(point string) {
	if s.hook != nil {
		s.hook(point)
	}
}
