package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// The model-based fault test: random sequences of API calls (prepare,
// isolate, update, cleanup, shared joins and leaves), tenant writes inside
// containers (ip_local_port_range, addresses, eth0 down), kill -9 between
// and during calls, the state deleted, emptied, truncated or corrupted,
// and restarts, against the real daemon in a sandbox. A model says what
// each container owns; after every step the invariants are checked: the
// API answers; the listing is the model; no port, block or slot is held
// twice or by a container and the host; every live container's ports reach
// it and unheld ports reach nobody; every veth is an isolated container's
// and nothing is reported unattributed; after a rebuild every tenant's
// ip_local_port_range is its block again.
//
// Bounded: seeds run one after the other, fmSteps steps each, until
// -faultmodel.duration is spent (1 minute by default; longer with the
// flag; 20 s with -short). A failure prints its seed and its steps;
// -faultmodel.seed=N replays that one.

var (
	fmDuration = flag.Duration("faultmodel.duration", time.Minute, "how long TestFaultModel runs seeds")
	fmSeed     = flag.Int64("faultmodel.seed", 0, "replay this seed of TestFaultModel only (0: seeds from the clock)")
	fmSteps    = flag.Int("faultmodel.steps", 30, "steps per seed of TestFaultModel")
)

const (
	fmCtrs   = 4     // container processes (namespaces)
	fmShared = 31350 // the shared port
)

var fmPorts = []int{31300, 31301, 31302, 31303, 31304, 31305} // exclusive candidates

// fmCtr is the model of one container (one namespace, its process).
type fmCtr struct {
	proc   *sandbox.Container
	name   string // its server's name
	id     string // current container ID ("" = none)
	gen    int    // IDs are <sandbox>-m<n>-<gen>
	state  pb.ContainerState
	port   int  // exclusive static port (0: none)
	shared bool // holds fmShared
	block  [2]uint32
	broken bool // its tenant took its eth0 down: its ports reach nothing
}

type fmRun struct {
	t        *testing.T
	sb       *sandbox.Sandbox
	d        *Daemon
	ctrs     []*fmCtr
	rng      *rand.Rand
	trace    []string // the steps of the current seed
	steps    int
	reported int // checks that found objects reported unattributed
	seedNo   int64
}

func TestFaultModel(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{BlockSize: 1024})
	serveIn(t, sb.Host, "tcp", ":22", "host")
	r := &fmRun{t: t, sb: sb, d: d}
	ports := append([]int{fmShared}, fmPorts...)
	for i := range fmCtrs {
		name := fmt.Sprintf("m%d", i)
		r.ctrs = append(r.ctrs, &fmCtr{proc: startSharedServer(t, sb, name, ports...), name: name})
	}
	seeds := []int64{*fmSeed}
	if *fmSeed == 0 {
		seeds = nil
		base := time.Now().UnixNano() % 1_000_000_000
		for i := int64(0); i < 1000; i++ {
			seeds = append(seeds, base+i)
		}
	}
	d0 := *fmDuration
	if testing.Short() && d0 > 20*time.Second {
		d0 = 20 * time.Second
	}
	deadline := time.Now().Add(d0)
	ran := 0
	for _, seed := range seeds {
		if ran > 0 && time.Now().After(deadline) {
			break
		}
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r.t = t
			defer func() {
				if t.Failed() {
					t.Logf("FAILED at seed %d; replay with: go test -run 'TestFaultModel' ./test/e2e/ -faultmodel.seed=%d\nsteps:\n  %s",
						seed, seed, strings.Join(r.trace, "\n  "))
				}
			}()
			r.seed(seed, deadline)
		})
		ran++
		if !ok {
			break
		}
	}
	t.Logf("fault model: %d seeds, %d steps, invariants checked after each; %d times objects were reported unattributed (and removed on request)", ran, r.steps, r.reported)
}

// seed runs one seed from no container at all.
func (r *fmRun) seed(seed int64, deadline time.Time) {
	r.rng = rand.New(rand.NewSource(seed))
	r.seedNo = seed
	r.trace = nil
	r.reset()
	for i := 0; i < *fmSteps && (i < 3 || time.Now().Before(deadline)); i++ {
		r.step()
		r.steps++
		r.check()
	}
}

// reset cleans every container up and brings the namespaces back.
func (r *fmRun) reset() {
	ctx := context.Background()
	resp, err := r.d.Client.List(ctx, &pb.ListRequest{})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, c := range resp.GetContainers() {
		if _, err := r.d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: c.GetContainerId()}); err != nil {
			r.t.Fatal(err)
		}
	}
	for _, c := range r.ctrs {
		c.id, c.state, c.port, c.shared, c.broken, c.gen = "", 0, 0, false, false, 0
	}
	r.check()
}

func (r *fmRun) logf(format string, args ...any) {
	r.trace = append(r.trace, fmt.Sprintf(format, args...))
}

// eth0Gone waits until the eth0 of an earlier container in c's namespace
// is gone (a cleaned-up container's veth is deleted in the background,
// its peer with it): a leak if it stays.
func (r *fmRun) eth0Gone(c *fmCtr) {
	var err error
	gone := wait.Until(20*time.Second, func() bool {
		var h *netlink.Handle
		if h, err = c.proc.Netlink(); err != nil {
			return false
		}
		defer h.Close()
		_, lerr := h.LinkByName("eth0")
		return lerr != nil
	})
	if !gone {
		r.t.Fatalf("%s's namespace still has the eth0 of a cleaned-up container after 20 s (%v)\n%s", c.name, err, r.d.Log())
	}
}

// ctrID is c's current generation's ID: unique in the run (the seed is in
// it), the same in a replay of the seed.
func (r *fmRun) ctrID(c *fmCtr) string {
	return fmt.Sprintf("%s-%s-s%d-%d", r.sb.Name, c.name, r.seedNo%100000, c.gen)
}

// freePort is an exclusive candidate nobody holds (0: none).
func (r *fmRun) freePort() int {
	var free []int
	for _, p := range fmPorts {
		if !slices.ContainsFunc(r.ctrs, func(c *fmCtr) bool { return c.id != "" && c.port == p }) {
			free = append(free, p)
		}
	}
	if len(free) == 0 {
		return 0
	}
	return free[r.rng.Intn(len(free))]
}

func portsOf(port int, shared bool) []*pb.PortRange {
	var ps []*pb.PortRange
	if port != 0 {
		ps = append(ps, &pb.PortRange{Begin: uint32(port), End: uint32(port)})
	}
	if shared {
		ps = append(ps, &pb.PortRange{Begin: fmShared, End: fmShared, Shared: true})
	}
	return ps
}

// call is one API call on c and what the model becomes if it succeeds.
type fmCall struct {
	what  string
	do    func(ctx context.Context) (*pb.Container, error)
	apply func(got *pb.Container)
}

// randomCall picks an API call that the model says must succeed.
func (r *fmRun) randomCall() (*fmCtr, fmCall) {
	c := r.ctrs[r.rng.Intn(len(r.ctrs))]
	cl := r.d.Client
	switch {
	case c.id == "":
		c.gen++
		id := r.ctrID(c)
		port, shared := r.freePort(), r.rng.Intn(2) == 0
		return c, fmCall{fmt.Sprintf("prepare %s ports %d shared %v", id, port, shared),
			func(ctx context.Context) (*pb.Container, error) {
				resp, err := cl.Prepare(ctx, &pb.PrepareRequest{ContainerId: id, Ports: portsOf(port, shared)})
				return resp.GetContainer(), err
			},
			func(got *pb.Container) {
				c.id, c.state, c.port, c.shared = id, pb.ContainerState_CONTAINER_STATE_PREPARED, port, shared
				c.block = [2]uint32{got.GetEphemeralPorts().GetBegin(), got.GetEphemeralPorts().GetEnd()}
			}}
	case c.state == pb.ContainerState_CONTAINER_STATE_PREPARED && r.rng.Intn(3) > 0:
		id := c.id
		r.eth0Gone(c)
		return c, fmCall{"isolate " + id,
			func(ctx context.Context) (*pb.Container, error) {
				resp, err := cl.Isolate(ctx, &pb.IsolateRequest{ContainerId: id, Target: &pb.IsolateRequest_Pid{Pid: int32(c.proc.Pid)}})
				return resp.GetContainer(), err
			},
			func(*pb.Container) { c.state, c.broken = pb.ContainerState_CONTAINER_STATE_ISOLATED, false }}
	case r.rng.Intn(4) == 0:
		id := c.id
		return c, fmCall{"cleanup " + id,
			func(ctx context.Context) (*pb.Container, error) {
				_, err := cl.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id})
				return nil, err
			},
			func(*pb.Container) { c.id, c.state, c.port, c.shared, c.broken = "", 0, 0, false, false }}
	default:
		id := c.id
		port := c.port
		if r.rng.Intn(2) == 0 {
			port = r.freePort() // may be 0: leave the exclusive port
		}
		shared := r.rng.Intn(2) == 0
		return c, fmCall{fmt.Sprintf("update %s ports %d shared %v", id, port, shared),
			func(ctx context.Context) (*pb.Container, error) {
				resp, err := cl.Update(ctx, &pb.UpdateRequest{ContainerId: id, Ports: portsOf(port, shared)})
				return resp.GetContainer(), err
			},
			func(*pb.Container) { c.port, c.shared = port, shared }}
	}
}

// step does one random thing.
func (r *fmRun) step() {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	isolated := r.isolated()
	switch k := r.rng.Intn(100); {
	case k < 45: // an API call
		c, call := r.randomCall()
		r.logf("%s", call.what)
		got, err := call.do(ctx)
		if err != nil {
			t.Fatalf("%s: %v", call.what, err)
		}
		call.apply(got)
		r.logf("  -> %s %v", c.id, c.state)
	case k < 50: // a conflicting call: refused, nothing changes
		var held []int
		for _, c := range r.ctrs {
			if c.id != "" && c.port != 0 {
				held = append(held, c.port)
			}
		}
		if len(held) == 0 {
			r.logf("no conflict to try")
			return
		}
		p := held[r.rng.Intn(len(held))]
		r.logf("prepare a stranger with held port %d: refused", p)
		if _, err := r.d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: r.sb.Name + "-stranger", Ports: portsOf(p, false)}); err == nil {
			t.Fatalf("port %d handed to a second container", p)
		}
	case k < 62 && len(isolated) > 0: // a tenant's write
		c := isolated[r.rng.Intn(len(isolated))]
		r.tenantWrite(c)
	case k < 72: // kill -9 and restart
		r.logf("kill -9, restart")
		r.d.Kill()
		r.d.Start()
	case k < 80: // kill -9 during a call
		c, call := r.randomCall()
		delay := time.Duration(r.rng.Intn(20)) * time.Millisecond
		r.logf("kill -9 %v into %s, restart", delay, call.what)
		before := *c
		done := make(chan struct{})
		var got *pb.Container
		var err error
		go func() { defer close(done); got, err = call.do(ctx) }()
		time.Sleep(delay) // the kill point (random, not a wait for a condition)
		r.d.Kill()
		<-done
		r.d.Start()
		r.reconcile(c, before, call, got, err)
	case k < 92: // the state lost
		losses := stateLosses(filepath.Join(r.d.StateDir, "isolatord.db"), r.rng)
		loss := losses[r.rng.Intn(len(losses))]
		r.logf("kill -9, state %s, restart", loss.name)
		r.d.Kill()
		if err := loss.do(); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		r.d.Start()
		// prepared containers have nothing in the kernel: gone with the
		// state, unless the intent journal (a file of its own) still had
		// their Prepare; then they are back as they were
		listed := r.listed()
		for _, c := range r.ctrs {
			if c.state == pb.ContainerState_CONTAINER_STATE_PREPARED {
				if l, ok := listed[c.id]; ok && matches(*c, l, ok) {
					r.logf("  -> %s kept by the intent journal", c.id)
					continue
				}
				c.id, c.state, c.port, c.shared = "", 0, 0, false
			}
		}
		r.checkRanges()
	default:
		r.logf("restart (SIGTERM)")
		r.d.Stop()
		r.d.Start()
	}
}

// reconcile settles the model after a call killed in flight: the container
// is as before the call or as after it, nothing else.
func (r *fmRun) reconcile(c *fmCtr, before fmCtr, call fmCall, got *pb.Container, callErr error) {
	listed := r.listed()
	id := c.id
	if id == "" { // a prepare: its ID is the next one
		id = r.ctrID(c)
	}
	l, ok := listed[id]
	after := before
	tmp := *c
	call.apply(orEmpty(got, l))
	after, *c = *c, tmp
	for _, cand := range []fmCtr{before, after} {
		if matches(cand, l, ok) {
			*c = cand
			if cand.id != "" && cand.state == pb.ContainerState_CONTAINER_STATE_PREPARED && ok {
				c.block = [2]uint32{l.GetEphemeralPorts().GetBegin(), l.GetEphemeralPorts().GetEnd()}
			}
			r.logf("  -> settled as %s (call returned %v)", map[bool]string{true: "before", false: "after"}[cand.id == before.id && cand.state == before.state && cand.port == before.port && cand.shared == before.shared], callErr)
			return
		}
	}
	r.t.Fatalf("after kill -9 during %s: %s listed as %v (present %v), neither before %+v nor after %+v", call.what, id, l, ok, before, after)
}

func orEmpty(got, listed *pb.Container) *pb.Container {
	if got != nil {
		return got
	}
	if listed != nil {
		return listed
	}
	return &pb.Container{}
}

// matches says whether the listing of one container (l, present) is m.
func matches(m fmCtr, l *pb.Container, present bool) bool {
	if m.id == "" {
		return !present
	}
	if !present || l.GetState() != m.state {
		return false
	}
	port, shared := 0, false
	for _, p := range l.GetPorts() {
		if p.GetShared() && p.GetBegin() == fmShared && p.GetEnd() == fmShared {
			shared = true
		} else if !p.GetShared() && p.GetBegin() == p.GetEnd() && port == 0 {
			port = int(p.GetBegin())
		} else {
			return false
		}
	}
	return port == m.port && shared == m.shared
}

// tenantWrite is a root tenant changing its own namespace.
func (r *fmRun) tenantWrite(c *fmCtr) {
	ranges := []string{"16 31", "49152 65535", "32768 33790", "32768 33279"}
	for _, o := range r.ctrs {
		if o != c && o.id != "" {
			ranges = append(ranges, fmt.Sprintf("%d %d", o.block[0], o.block[1]))
		}
	}
	switch r.rng.Intn(6) {
	case 0:
		r.logf("tenant %s: eth0 down", c.id)
		must(r.t, c.proc.Do(func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.LinkSetDown(l)
		}))
		c.broken = true
	case 1:
		a := fmt.Sprintf("198.18.0.%d/32", 200+r.rng.Intn(50))
		r.logf("tenant %s: add address %s", c.id, a)
		must(r.t, c.proc.Do(func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			addr, err := netlink.ParseAddr(a)
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, addr); err != nil && !strings.Contains(err.Error(), "exists") {
				return err
			}
			return nil
		}))
	default:
		v := ranges[r.rng.Intn(len(ranges))]
		r.logf("tenant %s: ip_local_port_range %s", c.id, v)
		must(r.t, c.proc.SetSysctl("net.ipv4.ip_unprivileged_port_start", "0"))
		must(r.t, c.proc.SetSysctl("net.ipv4.ip_local_port_range", v))
	}
}

func (r *fmRun) isolated() []*fmCtr {
	var out []*fmCtr
	for _, c := range r.ctrs {
		if c.id != "" && c.state == pb.ContainerState_CONTAINER_STATE_ISOLATED {
			out = append(out, c)
		}
	}
	return out
}

// listed is the daemon's listing by ID (the API must answer).
func (r *fmRun) listed() map[string]*pb.Container {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := r.d.Client.List(ctx, &pb.ListRequest{})
	if err != nil {
		r.t.Fatalf("the API does not answer: %v\n%s", err, r.d.Log())
	}
	out := map[string]*pb.Container{}
	for _, c := range resp.GetContainers() {
		out[c.GetContainerId()] = c
	}
	return out
}

// checkRanges: after a rebuild, every rebuilt tenant's range is its block
// (a container the intent journal still knew is recovered from its record,
// which reads nothing from the tenant and writes nothing back).
func (r *fmRun) checkRanges() {
	st, err := r.d.Client.Status(context.Background(), &pb.StatusRequest{})
	must(r.t, err)
	for _, c := range r.isolated() {
		if !slices.Contains(st.GetRebuilt(), c.id) {
			continue
		}
		v, err := c.proc.Sysctl("net.ipv4.ip_local_port_range")
		want := fmt.Sprintf("%d %d", c.block[0], c.block[1])
		if err != nil || strings.Join(strings.Fields(v), " ") != want {
			r.t.Fatalf("after the rebuild, %s's ip_local_port_range is %q (%v), want its block %s", c.id, v, err, want)
		}
	}
}

// check asserts every invariant.
func (r *fmRun) check() { r.checkAgain(false) }

func (r *fmRun) checkAgain(again bool) {
	t := r.t
	listed := r.listed()
	// the listing is the model
	n := 0
	for _, c := range r.ctrs {
		if c.id == "" {
			continue
		}
		n++
		l, ok := listed[c.id]
		if !matches(*c, l, ok) {
			t.Fatalf("%s listed as %v (present %v), the model says %+v\n%s", c.id, l, ok, *c, r.d.Log())
		}
		if b := l.GetEphemeralPorts(); b.GetBegin() != c.block[0] || b.GetEnd() != c.block[1] {
			t.Fatalf("%s's block is %d-%d, it was given %v", c.id, b.GetBegin(), b.GetEnd(), c.block)
		}
	}
	if len(listed) != n {
		t.Fatalf("%d containers listed, the model has %d: %v", len(listed), n, keys(listed))
	}
	// nothing held twice, nothing of the host's held
	blocks := map[uint32]string{}
	ports := map[uint32]string{}
	for id, l := range listed {
		b := l.GetEphemeralPorts()
		if b.GetBegin() < 32768 || b.GetEnd() > 40959 || b.GetEnd()-b.GetBegin() != 1023 {
			t.Fatalf("%s holds block %d-%d, no block of the pool", id, b.GetBegin(), b.GetEnd())
		}
		if o, dup := blocks[b.GetBegin()]; dup {
			t.Fatalf("block %d held by %s and %s", b.GetBegin(), o, id)
		}
		blocks[b.GetBegin()] = id
		for _, p := range l.GetPorts() {
			if p.GetShared() {
				continue
			}
			if o, dup := ports[p.GetBegin()]; dup {
				t.Fatalf("port %d held by %s and %s", p.GetBegin(), o, id)
			}
			ports[p.GetBegin()] = id
		}
	}
	// traffic: each live container's port reaches it, the host's port 22
	// the host, a port nobody holds nobody
	for _, c := range r.isolated() {
		if c.port != 0 && !c.broken {
			r.mustReach(c.port, c.name)
		}
	}
	var holders []string
	for _, c := range r.isolated() {
		if c.shared && !c.broken {
			holders = append(holders, c.name)
		}
	}
	if len(holders) > 0 && len(holders) == countShared(r.isolated()) {
		r.mustReach(fmShared, holders...)
	}
	r.mustReach(22, "host")
	if p := r.freePort(); p != 0 {
		if got, err := echoFromClient(r.sb, "tcp", p); err == nil {
			t.Fatalf("port %d, held by nobody, answered by %q", p, got)
		}
	}
	// every veth is an isolated container's; nothing unattributed
	want := map[string]bool{}
	for _, c := range r.isolated() {
		want[plane.VethName(c.id)] = true
	}
	h, err := r.sb.Host.Netlink()
	must(t, err)
	defer h.Close()
	// (a dump is interrupted when links change meanwhile: the background
	// deletion of retired veths; asked again)
	var ls []netlink.Link
	if !wait.Until(10*time.Second, func() bool { ls, err = h.LinkList(); return err == nil }) {
		t.Fatalf("list the host's links: %v", err)
	}
	var got []string
	for _, l := range ls {
		a := l.Attrs()
		if len(a.Name) == 15 && strings.HasPrefix(a.Name, plane.VethPrefix) && a.Group == 0 {
			got = append(got, a.Name)
			if !want[a.Name] {
				t.Fatalf("veth %s is no isolated container's (isolated: %v)", a.Name, keysB(want))
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("veths %v, want those of %v", got, keysB(want))
	}
	// What recovery could not attribute is reported (never removed by
	// itself): the operator's removal takes it away and changes no
	// container (checked again at once).
	st, err := r.d.Client.Status(context.Background(), &pb.StatusRequest{})
	must(t, err)
	if u := st.GetUnattributed(); len(u) != 0 {
		if again {
			t.Fatalf("still reported unattributed after remove-unattributed: %v", u)
		}
		r.logf("  reported unattributed: %v; removed on request", u)
		r.reported++
		if _, err := r.d.Client.RemoveUnattributed(context.Background(), &pb.RemoveUnattributedRequest{}); err != nil {
			t.Fatalf("remove-unattributed: %v", err)
		}
		r.checkAgain(true)
	}
}

func countShared(cs []*fmCtr) int {
	n := 0
	for _, c := range cs {
		if c.shared {
			n++
		}
	}
	return n
}

// mustReach: a TCP echo from the client to port is answered by one of
// names (retried for a while under load; a wrong answer fails at once).
func (r *fmRun) mustReach(port int, names ...string) {
	var last string
	ok := wait.Until(15*time.Second, func() bool {
		got, err := echoFromClient(r.sb, "tcp", port)
		if err == nil && !slices.Contains(names, got) {
			r.t.Fatalf("port %d answered by %q, want one of %v", port, got, names)
		}
		last = fmt.Sprintf("%q, %v", got, err)
		return err == nil
	})
	if !ok {
		r.t.Fatalf("port %d does not reach %v: %s", port, names, last)
	}
}

func keys(m map[string]*pb.Container) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func keysB(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
