package dataplane

// Design of the concrete data plane (DataPlane):
//
//   - Two netlink handles in the host namespace live as long as the
//     DataPlane: one for changes, one for reads (Stats). Container namespaces are opened per call and their handles
//     closed before the call returns (an open handle would keep a dead
//     container's namespace, and its veth, alive).
//   - In-memory indexes (container ID -> veth ifindex and installed ports,
//     slot -> ID, shared port -> holders) make every per-container call cost
//     O(ranges of that container): no link or filter dump happens on the
//     Setup/SetPorts/Teardown path. Dumps are only used by Snapshot,
//     RemoveStrays and Check, which serve recovery and diagnosis.
//   - Setup builds in this order: bind mount, veth (host end + container
//     eth0 in one request), then concurrently the host veth's settings,
//     filters and up, and the container's configuration, filters and
//     neighbours (setupchains.go), and only once both are done the host
//     eth0/lo demux entries that steer traffic to the new veth. Every step
//     registers its undo; any failure runs the undos in reverse, so a
//     failed Setup leaves nothing.
//   - Teardown is the reverse and tolerates missing objects, reporting them.
//     It does not wait for the kernel to delete the veth pair: the veth is
//     muted (a filter ahead of its others drops what the container sends),
//     moved to the deletion group and deleted in the background with
//     others (retire.go).
//   - Concurrency: mu guards the shared state (host demuxes, fan-out,
//     shared-port holder lists, the indexes). Setup claims its ID and slot
//     under mu, builds the container's own objects (mount, veth, its
//     settings and filters, the container's configuration) without it, and
//     takes it again only to add the host demux entries; Teardown removes
//     those under mu and retires the veth and unmounts without it. So calls
//     for different containers overlap as far as the kernel lets them (it
//     serialises most netlink changes itself), a few Setups and Teardowns
//     at a time (admit.go: more would only queue on rtnl, before reads). The per-container order is
//     the caller's (the lifecycle's per-container lock). SetPorts, SetLimits,
//     Adopt and the recovery calls hold mu throughout. Stats takes no lock
//     but hmu (read), which only keeps the handles open against Close;
//     SocketStats takes none (it reads inside the container's namespace).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/isolatord/isolatord/tcfilter/fragbpf"
	"github.com/isolatord/isolatord/tcfilter/wirebpf"
	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/netns/neighsync"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/tcfilter/nlbatch"
)

// Errors callers can test with errors.Is.
var (
	// ErrNotPrepared: Setup or Adopt before PrepareHost.
	ErrNotPrepared = errors.New("data plane not prepared: call PrepareHost first")
	// ErrExists: the container ID (or its slot) is already plumbed.
	ErrExists = errors.New("container already set up")
	// ErrUnknown: the container is not known to this data plane.
	ErrUnknown = errors.New("container not set up")
	// ErrInvalid wraps every validation error of a Container or port change.
	ErrInvalid = errors.New("invalid container")
	// ErrClosed: the data plane was closed. (Its netlink handle is gone; a
	// closed netlink.Handle would silently act on the caller's namespace.)
	ErrClosed = errors.New("data plane closed")
)

// Config configures New.
type Config struct {
	HostNS   string            // host network namespace path; "" = the process's own
	Eth0     string            // public interface; "" = device of the default route
	Lo       string            // loopback; "" = the first IFF_LOOPBACK link
	NetNSDir string            // where namespaces are bind-mounted; "" = /var/run/netns
	Observer tcfilter.Observer // sees every tc filter operation (metrics); may be nil
	Logger   *slog.Logger      // nil = slog.Default()
	// SharedReconcile is how often shared ports whose spread is not settled
	// are planned again (pins of ended flows removed, held-back buckets
	// moved); 0 = DefaultSharedReconcile, negative = never.
	SharedReconcile time.Duration
	// SharedIdle is how long a flow of a shared port may go without
	// traffic the host's filters see and keep its holder through a change,
	// and how long a holder may keep back a bucket (shared.go); 0 =
	// DefaultSharedIdle.
	SharedIdle time.Duration
	// IPv6 says whether containers share the host's IPv6 addresses
	// (ipv6.go); the zero value is IPv6Auto.
	IPv6 IPv6Mode
	// Follow makes the data plane follow the host's interface at run
	// time (follow.go): containers get the host's new addresses,
	// gateways, MTU and MAC, and a recreated eth0 its demux again.
	Follow bool
	// ContainerPorts are the ports containers may own (the static ports
	// and the ephemeral pool); empty = DefaultContainerPorts. With the
	// host's ip_local_port_range and HostLoopbackPorts they are the
	// destination ports a container may reach on 127.0.0.0/8 and ::1
	// (loopback.go); every other is dropped as "loopback".
	ContainerPorts ephemeral.Set
	// HostLoopbackPorts are host loopback ports opened to every container
	// (--host-loopback-ports); SetHostLoopbackPorts changes them.
	HostLoopbackPorts ephemeral.Set
	// FragmentTableSize is how many fragmented datagrams per family the
	// fragment steering remembers (fragments.go); 0 = fragbpf.DefaultSize,
	// negative = no fragment steering.
	FragmentTableSize int
}

// ContainerEth0 is the name of the veth peer inside every container.
const ContainerEth0 = "eth0"

// DataPlane is isolatord's kernel data plane for one host namespace.
type DataPlane struct {
	cfg    Config
	log    *slog.Logger
	hostNS *nshandle.NS // the namespace we plumb
	selfNS *nshandle.NS // the daemon's own namespace (never a container's)
	h      *netlink.Handle
	// hr is a second handle for reads (Stats), so that they do not queue
	// behind the requests of setups and teardowns on h's socket.
	hr *netlink.Handle
	// hc sends the veth filters' requests in batches (nlbatch.Conn).
	hc *nlbatch.Conn
	// sys reads veth counters without rtnl (Stats); nil when no sysfs
	// could be mounted for hostNS, and Stats uses hr.
	sys *hostlink.SysNet

	// hmu guards the handles' lifetime for the calls that do not take mu
	// (Stats): Close sets hclosed under it before closing them.
	hmu     sync.RWMutex
	hclosed bool
	// writers holds a token per Setup or Teardown at work (admit.go).
	writers chan struct{}
	// unrouting combines the first step of concurrent teardowns
	// (unroute.go).
	unrouting unrouter
	// statsVeth: container ID -> host veth ifindex of the containers in
	// ctrs, for Stats (admit.go).
	statsVeth sync.Map
	// staged are the veth pairs Stage made that no Setup adopted yet
	// (staged.go), under smu.
	smu    sync.Mutex
	staged map[string]stagedVeth

	mu       sync.Mutex
	prepared bool
	info     plane.HostInfo
	links    hostlink.Links
	copy     []sysctl.Setting
	eth0     *tcfilter.HostDemux
	lo       *tcfilter.HostDemux
	frag     *fragbpf.Steering // fragment steering (fragments.go); nil: off
	wire     *wirebpf.Guard    // host eth0's wire guard (wireguard.go); nil: off
	lopath   atomic.Bool       // the guard was put on: host veths and containers' lo get the lo MTU
	sink     tcfilter.Sink     // the drop sink of the IPv6 demux's counting mirrors
	// drops are the per-reason drop sinks every veth's dropping nodes
	// redirect to, and their count map (read without d.mu, under hmu).
	drops *tcfilter.DropSinks
	ip6   []net.IP // host IPv6 addresses the filters match (ipv6filters.go); nil: IPv6 off
	// loopPorts are the destination ports containers may reach on the
	// host's loopback (loopback.go), loopOpen the operator's part of them.
	loopPorts []ephemeral.Range
	loopOpen  ephemeral.Set
	departed  map[string]uint64 // drops counted on the veths of containers torn down since New
	neigh     *neighsync.Syncer // containers' neighbours from the host's table (neigh.go)
	// neighAgain: the syncer must start again on eth0 (a recreated
	// eth0 whose restart failed: the follower retries it)
	neighAgain bool
	ctrs       map[string]*record
	slots      map[uint16]string
	// settingUp: ID -> slot of the setups in progress (claim).
	settingUp map[string]uint16
	shared    map[uint16][]spread.Holder
	closed    bool
	// rootQdiscs caches, for recovery, which links have a root qdisc other
	// than the default (one dump for all Adopts: a qdisc dump is not
	// filtered by device, so a dump per container would make recovery
	// quadratic). nil when not valid; every mutating call clears it.
	rootQdiscs map[int]bool
	// recoveryLinkList (the host's links) and recoveryLinks (host link name
	// -> ifindex) are filled with rootQdiscs and valid while it is
	// (rebuild.go).
	recoveryLinkList []netlink.Link
	recoveryLinks    map[string]int
	// recoveryCurrent: host veths (by name) whose alias says their filters
	// are of the current layout and point at the current drop sink.
	recoveryCurrent map[string]bool
	// recoveryOver: Strays or RemoveStrays ran, recovery is over; the
	// recovery caches no longer answer that a link does not exist
	// (recoveryLinkOrZero).
	recoveryOver bool
	// recoveryKnown: each host demux's index grouped by slot, for Check
	// during recovery (knownOf); emptied with each fill of the cache.
	recoveryKnown map[string]map[uint16][]tcfilter.Entry

	// hostSysctl holds the host namespace's sysctls open for the host
	// veths' settings (withHostSysctls).
	hostSysctl *sysctl.Dir
	// saddr6 is the host's IPv6 source selection on eth0 (saddr6.go).
	saddr6 saddr6State
	// v6 is what containers get of the host's IPv6 (nil: IPv6 off); set by
	// PrepareHost.
	v6 *hostlink.IPv6

	// retired deletes retired links in the background (retire.go); set by
	// PrepareHost.
	retired *retirer

	// fmu orders host changes the follower applies (write) against
	// setups (read, for their whole length: a setup reads the host's
	// facts without d.mu). Taken before d.mu.
	fmu sync.RWMutex
	// hostNow are the host facts of d.info, d.links and d.v6 (follow.go).
	hostNow hostFacts
	// lost4: the host has no IPv4 address now (d.info.IP keeps the last
	// one, which the filters match; containers have none).
	lost4        bool
	follow       *follower
	followStats  plane.FollowStats
	followEvents atomic.Uint64           // notifications about eth0 or lo
	watching     atomic.Pointer[watched] // what the follower's notifications are about
	onHost       func(plane.HostInfo)

	// the shared-port reconciler (shared.go)
	reconcileStop chan struct{}
	reconcileDone chan struct{}
	reconcileNext uint16 // first port of the next pass when one pass was not enough
	// held: shared port -> bucket -> since when it is held back from its
	// assigned holder (its hold ends after SharedIdle).
	held map[uint16]map[int]time.Time
	// drain: shared port -> slots of its holders that drain it (drain.go);
	// rebuilt from the spread tables' markers at Adopt.
	drain map[uint16]map[uint16]bool
	// cut: shared port -> draining slots whose flows were cut (CutDrain)
	cut map[uint16]map[uint16]bool
	// drainHoldings, drainFlows: the last DrainTotals that could read them
	drainHoldings, drainFlows atomic.Int64

	// hook, when set (tests), runs after each named Setup/SetPorts step and
	// can fail it to exercise rollback.
	hook func(step string) error
	// trace, when set (benchmarks), is told when each named step of Setup,
	// SetPorts and Teardown ends, and in which of Setup's concurrent chains
	// ("" outside them); it must be safe for concurrent use.
	trace func(chain, step string)
	// serialSetup, when set (benchmarks), runs Setup's container chain
	// after its host chain instead of beside it (setupchains.go).
	serialSetup bool
	// planned, when set (tests), runs between planning a shared port's
	// spread (its holders' sockets read) and installing it.
	planned func(port uint16)
	// fanoutAlways, when set (tests), gives containers ICMP fan-out nodes
	// even with the echo programs, as without them (fanoutUsed).
	fanoutAlways bool
}

// record is what the data plane installed for one container.
type record struct {
	c    plane.Container // ports, shared ports and limits as installed
	veth int
	via  int // egress shaper entry ifindex (0: no egress limit)
	ino  uint64
	pin  nspin.Pin // where the namespace is pinned, and whether by us
	in   hostFacts // the host facts its objects carry (follow.go)
	// followErr is the last error bringing it in line said (follow.go).
	followErr string
}

// New opens the host namespace and a netlink handle in it. It changes
// nothing; PrepareHost does.
func New(cfg Config) (*DataPlane, error) {
	if cfg.NetNSDir == "" {
		cfg.NetNSDir = nspin.DefaultDir
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	self, err := nshandle.Current()
	if err != nil {
		return nil, err
	}
	host := self
	if cfg.HostNS != "" {
		host, err = nshandle.Open(cfg.HostNS)
		if err != nil {
			self.Close()
			return nil, err
		}
	}
	h, err := host.Netlink()
	var hr *netlink.Handle
	var hc *nlbatch.Conn
	if err == nil {
		if hr, err = host.Netlink(); err != nil {
			h.Close()
		}
	}
	if err == nil {
		if hc, err = openConn(host); err != nil {
			h.Close()
			hr.Close()
		}
	}
	if err != nil {
		if host != self {
			host.Close()
		}
		self.Close()
		return nil, err
	}
	d := &DataPlane{
		cfg: cfg, log: log, hostNS: host, selfNS: self, h: h, hr: hr, hc: hc,
		ctrs:     map[string]*record{},
		slots:    map[uint16]string{},
		shared:   map[uint16][]spread.Holder{},
		departed: map[string]uint64{},
		writers:  make(chan struct{}, maxWriters()),
	}
	d.unrouting.turn = make(chan struct{}, 1)
	d.hostSysctl = sysctl.Open()
	if d.sys, err = hostlink.OpenSysNet(host); err != nil {
		log.Info("veth counters read over netlink (behind rtnl): no sysfs for the host namespace", "err", err)
		d.sys = nil
	}
	return d, nil
}

// Close stops the shared-port reconciler and releases the namespace and
// netlink handles. Kernel objects stay.
func (d *DataPlane) Close() error {
	// hmu before mu: a Setup holding hmu (read) finishes with mu.
	d.hmu.Lock()
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.hmu.Unlock()
		return nil
	}
	d.closed = true
	follow := d.follow
	stop, done := d.reconcileStop, d.reconcileDone
	d.reconcileStop, d.reconcileDone = nil, nil
	err := d.closeLocked()
	d.hclosed = true
	d.mu.Unlock()
	d.hmu.Unlock()
	// A pass waiting for the lock sees d.closed and does nothing.
	if stop != nil {
		close(stop)
		<-done
	}
	follow.stopAndWait()
	return err
}

func (d *DataPlane) closeLocked() error {
	if d.retired != nil {
		d.retired.close()
	}
	if d.frag != nil { // (its programs stay attached)
		d.frag.Close()
		d.frag = nil
	}
	if d.wire != nil { // (it stays attached)
		d.wire.Close()
		d.wire = nil
	}
	if d.prepared {
		if err := d.flush(); err != nil {
			d.log.Warn("host demux tables not deleted at close", "err", err)
		}
	}
	if d.neigh != nil {
		d.neigh.Close()
	}
	d.drops.Close()
	if d.eth0 != nil {
		d.eth0.ReleaseEcho() // the sweepers stop; the programs stay
	}
	d.h.Close()
	d.hr.Close()
	d.hc.Close()
	if d.sys != nil {
		d.sys.Close()
	}
	d.hostSysctl.Close()
	var err error
	if d.hostNS != d.selfNS {
		err = d.hostNS.Close()
	}
	return errors.Join(err, d.selfNS.Close())
}

// isVethName reports whether name has our veth naming shape.
func isVethName(name string) bool {
	if len(name) != 15 || !strings.HasPrefix(name, plane.VethPrefix) {
		return false
	}
	for _, c := range name[3:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// checkID is ValidateID wrapped in ErrInvalid with the field named.
func checkID(id string) error {
	if err := plane.ValidateID(id); err != nil {
		return fmt.Errorf("%w: container ID: %v", ErrInvalid, err)
	}
	return nil
}

// validateContainer checks everything Setup needs from c.
func validateContainer(c plane.Container) error {
	if err := checkID(c.ID); err != nil {
		return err
	}
	if c.Slot == 0 || c.Slot > plane.MaxSlot {
		return fmt.Errorf("%w: container %s: slot %d outside 1..%d", ErrInvalid, c.ID, c.Slot, plane.MaxSlot)
	}
	if c.NetNS == "" {
		return fmt.Errorf("%w: container %s: network namespace path is empty", ErrInvalid, c.ID)
	}
	for _, x := range []struct {
		name string
		l    rate.Limit
	}{{"egress", c.Egress}, {"ingress", c.Ingress}} {
		if err := x.l.Validate(); err != nil {
			return fmt.Errorf("%w: container %s: %s limit: %v", ErrInvalid, c.ID, x.name, err)
		}
	}
	if !c.Ephemeral.IsAligned() {
		return fmt.Errorf("%w: container %s: ephemeral range %s is not a power-of-two sized, aligned block", ErrInvalid, c.ID, c.Ephemeral)
	}
	return validatePorts(c.ID, c.Ephemeral, c.Ports, c.Shared)
}

func validatePorts(id string, eph ephemeral.Range, ports, shared ephemeral.Set) error {
	es := ephemeral.NewSet(eph)
	if err := ephemeral.CheckOverlap("static ports", ports, "shared ports", shared); err != nil {
		return fmt.Errorf("%w: container %s: %v", ErrInvalid, id, err)
	}
	if err := ephemeral.CheckOverlap("ephemeral ports", es, "static ports", ports); err != nil {
		return fmt.Errorf("%w: container %s: %v", ErrInvalid, id, err)
	}
	if err := ephemeral.CheckOverlap("ephemeral ports", es, "shared ports", shared); err != nil {
		return fmt.Errorf("%w: container %s: %v", ErrInvalid, id, err)
	}
	return nil
}

// exclusiveRanges are the ranges the host demuxes steer to the container.
func exclusiveRanges(eph ephemeral.Range, ports ephemeral.Set) []ephemeral.Range {
	return ephemeral.Split(ephemeral.NewSet(eph).Union(ports))
}

// allRanges are the ranges the container may use as source ports (veth
// filters) and keeps local (container lo filters): exclusive and shared.
func allRanges(eph ephemeral.Range, ports, shared ephemeral.Set) []ephemeral.Range {
	return ephemeral.Split(ephemeral.NewSet(eph).Union(ports).Union(shared))
}

// undoStack collects the undo actions of a multi-step change.
type undoStack struct {
	steps []undoStep
}

type undoStep struct {
	name string
	fn   func() error
}

func (u *undoStack) push(name string, fn func() error) { u.steps = append(u.steps, undoStep{name, fn}) }

// run undoes everything in reverse and returns the undo errors.
func (u *undoStack) run() error {
	var errs []error
	for i := len(u.steps) - 1; i >= 0; i-- {
		if err := u.steps[i].fn(); err != nil {
			errs = append(errs, fmt.Errorf("undo %s: %w", u.steps[i].name, err))
		}
	}
	u.steps = nil
	return errors.Join(errs...)
}

// ready fails unless the data plane is open and prepared; call with d.mu held.
func (d *DataPlane) ready() error {
	if d.closed {
		return ErrClosed
	}
	if !d.prepared {
		return ErrNotPrepared
	}
	return nil
}

func (d *DataPlane) step(name string) error { return d.stepIn("", name) }

// stepIn ends step name of one of Setup's chains ("host", "container"; ""
// outside them): the benchmark's trace, the tests' failure hook. It may be
// called from both chains at once.
func (d *DataPlane) stepIn(chain, name string) error {
	if d.trace != nil {
		d.trace(chain, name)
	}
	if d.hook != nil {
		if err := d.hook(name); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

func checkCtx(ctx context.Context) error {
	if ctx == nil {
		return nil
	}
	return ctx.Err()
}

// hostIP is the shared IPv4 address.
func (d *DataPlane) hostIP() net.IP { return d.info.IP.IP }

// vethFilters are the filters of a container's host veth; via is the
// ifindex of its egress shaper's entry (0: none).
func (d *DataPlane) vethFilters(slot uint16, veth, via int) tcfilter.VethFilters {
	return tcfilter.VethFilters{
		H: d.h, C: d.hc, Veth: veth, Eth0: d.links.Eth0Index, Lo: d.links.LoIndex, Via: via,
		Sinks: d.drops, VLAN: d.sink.BPF, HostIP: d.hostIP(), HostIP6: d.hostIP6(), MAC: d.info.MAC, Slot: slot, Obs: d.cfg.Observer,
		LoopPorts: d.loopPorts,
	}
}

// holdersWith returns hs plus (slot, veth), replacing an entry of that slot.
func holdersWith(hs []spread.Holder, slot uint16, veth int) []spread.Holder {
	out := holdersWithout(hs, slot)
	out = append(out, spread.Holder{Slot: slot, Target: veth})
	sort.Slice(out, func(i, j int) bool { return out[i].Slot < out[j].Slot })
	return out
}

// holdersWithout returns a copy of hs without slot.
func holdersWithout(hs []spread.Holder, slot uint16) []spread.Holder {
	out := make([]spread.Holder, 0, len(hs))
	for _, h := range hs {
		if h.Slot != slot {
			out = append(out, h)
		}
	}
	return out
}

// mountPath is where container id's namespace is pinned by default.
func (d *DataPlane) mountPath(id string) string {
	return strings.TrimSuffix(d.cfg.NetNSDir, "/") + "/" + id
}

// pinOf is where c's namespace is pinned as c records it (the default
// path when it records none).
func (d *DataPlane) pinOf(c plane.Container) nspin.Pin {
	if c.Pin == "" {
		return nspin.Pin{Path: d.mountPath(c.ID), Owned: c.PinOwned}
	}
	return nspin.Pin{Path: c.Pin, Owned: c.PinOwned}
}

// packets and no IPv6 (the shared MAC would give every link the same
// link-local address); call it inside withHostSysctls.
func hostLinkSettings(sd *sysctl.Dir, idx int, name string) error {
	if err := sd.SetIPv4Conf(idx, map[int]uint32{sysctl.DevconfForwarding: 0}); err != nil {
		return err
	}
	return sd.DisableIPv6(name)
}

// withHostSysctls runs fn inside the host namespace with its sysctls, held
// open from one call to the next.
func (d *DataPlane) withHostSysctls(fn func(*sysctl.Dir) error) error {
	return d.hostNS.Do(func() error { return fn(d.hostSysctl) })
}

// flush waits until the host demuxes have deleted the hash tables the
// kernel still held busy when they were unlinked (never needed for
// correctness: nothing routes through them).
func (d *DataPlane) flush() error {
	if d.eth0 == nil {
		return nil
	}
	return errors.Join(d.eth0.Flush(), d.lo.Flush())
}

// fanoutUsed reports whether containers get an ICMP fan-out node on eth0:
// only without the echo programs (tcfilter.HostDemux.FanoutUsed: with them
// nothing leads to the fan-out, and each node would make every setup and
// teardown walk one bucket holding every container's node, and every
// device deletion of the machine walk one more mirred action per
// container).
func (d *DataPlane) fanoutUsed() bool { return d.fanoutAlways || d.eth0.FanoutUsed() }
