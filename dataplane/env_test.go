package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/vishvananda/netlink"
)

// env is a sandbox with a prepared data plane whose host is the sandbox host.
type env struct {
	t    testing.TB
	sb   *sandbox.Sandbox
	d    *DataPlane
	info plane.HostInfo
	bin  string
	ops  *atomic.Int64 // filter operations seen by the observer
	errs *atomic.Int64 // failed filter operations
	ipv6 IPv6Mode      // Config.IPv6 of its data planes (ipv6_test.go)
}

func quietLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvWith(t, IPv6Auto)
}

// newEnvWith is newEnv with the data plane's IPv6 mode and sandbox options.
func newEnvWith(t testing.TB, mode IPv6Mode, opts ...sandbox.Option) *env {
	t.Helper()
	sb := sandbox.New(t, opts...)
	e := &env{t: t, sb: sb, ops: new(atomic.Int64), errs: new(atomic.Int64), ipv6: mode}
	e.d = e.newDataPlane()
	var err error
	e.info, err = e.d.PrepareHost(context.Background())
	if err != nil {
		t.Fatalf("PrepareHost: %v", err)
	}
	return e
}

// newDataPlane opens another DataPlane on the same sandbox host (a
// "restarted daemon").
func (e *env) newDataPlane() *DataPlane {
	e.t.Helper()
	d, err := New(Config{
		HostNS: e.sb.Host.Path,
		IPv6:   e.ipv6,
		Logger: quietLogger(e.t),
		Observer: func(op tcfilter.Op) {
			e.ops.Add(1)
			if op.Result == "error" {
				e.errs.Add(1)
			}
		},
	})
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.t.Cleanup(func() { d.Close() })
	return d
}

// ctr is a running container process plus its data-plane description.
type ctr struct {
	proc *sandbox.Container
	c    plane.Container
}

var idSeq atomic.Int64

// uniqueID makes container IDs unique across sandboxes (they name files in
// the shared /run/netns).
func (e *env) uniqueID(name string) string {
	return fmt.Sprintf("%s-%s-%d", e.sb.Name, name, idSeq.Add(1))
}

// spawn starts `isotraffic serve` named name in a fresh namespace, serving
// TCP and UDP on every port of serve (0.0.0.0; [::], both families, when
// the sandbox has IPv6), without plumbing it.
func (e *env) spawn(name string, serve []uint16, reuse bool) *sandbox.Container {
	e.t.Helper()
	if e.bin == "" {
		e.bin = traffic.BinaryPath(e.t)
	}
	var tcp, udp []string
	any := "0.0.0.0:"
	if e.sb.HostIP6 != nil {
		any = "[::]:"
	}
	for _, p := range serve {
		tcp = append(tcp, any+strconv.Itoa(int(p)))
		udp = append(udp, any+strconv.Itoa(int(p)))
	}
	args := []string{e.bin, "serve", "--name", name}
	if len(tcp) > 0 {
		args = append(args, "--tcp", strings.Join(tcp, ","), "--udp", strings.Join(udp, ","))
	}
	if reuse {
		args = append(args, "--reuseport")
	}
	p := e.sb.StartContainer(e.t, name, args...)
	p.WaitFor(e.t, "ready", 10*time.Second)
	return p
}

// spec builds a Container for process p.
func (e *env) spec(name string, p *sandbox.Container, slot uint16, eph string, ports, shared string) plane.Container {
	e.t.Helper()
	r, err := ephemeral.ParseRange(eph)
	if err != nil {
		e.t.Fatal(err)
	}
	return plane.Container{
		ID: e.uniqueID(name), Slot: slot, NetNS: p.NetNS, Ephemeral: r,
		Ports: ephemeral.MustParseSet(ports), Shared: ephemeral.MustParseSet(shared),
	}
}

// setup plumbs c and registers its teardown (and a last-resort unmount).
func (e *env) setup(c plane.Container) plane.Plumbing {
	e.t.Helper()
	p, err := e.d.Setup(context.Background(), c)
	if err != nil {
		e.t.Fatalf("Setup %s: %v", c.ID, err)
	}
	e.cleanupMount(c.ID)
	d := e.d
	e.t.Cleanup(func() { d.Teardown(context.Background(), c) })
	return p
}

func (e *env) cleanupMount(id string) {
	e.t.Cleanup(func() { nspin.Unmount(nspin.DefaultDir, id) })
}

// start spawns and plumbs a container serving every port in serve.
func (e *env) start(name string, slot uint16, eph, ports, shared string, serve ...uint16) ctr {
	e.t.Helper()
	p := e.spawn(name, serve, shared != "")
	c := e.spec(name, p, slot, eph, ports, shared)
	pl := e.setup(c)
	// What the lifecycle records: a restarted data plane goes by it.
	c.Pin, c.PinOwned = pl.Mount, pl.PinOwned
	return ctr{p, c}
}

type doer interface{ Do(func() error) error }

// echo runs traffic.Echo inside ns and returns the answering server's name.
func echo(ns doer, network, addr string, opts ...traffic.Option) (string, error) {
	var reply string
	opts = append([]traffic.Option{traffic.WithTimeout(2 * time.Second)}, opts...)
	err := ns.Do(func() (err error) {
		reply, err = traffic.Echo(context.Background(), network, addr, "hello", opts...)
		return err
	})
	if err != nil {
		return "", err
	}
	return traffic.ReplyName(reply), nil
}

// mustEcho fails the test unless server want answers.
func mustEcho(t testing.TB, ns doer, network, addr, want string, opts ...traffic.Option) {
	t.Helper()
	got, err := echo(ns, network, addr, opts...)
	if err != nil {
		t.Errorf("%s %s: %v (want reply from %s)", network, addr, err, want)
		return
	}
	if got != want {
		t.Errorf("%s %s answered by %q, want %q", network, addr, got, want)
	}
}

// serveIn runs TCP and UDP echo servers named name in ns on addr.
func serveIn(t testing.TB, ns doer, addr, name string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	err := ns.Do(func() error {
		ts, err := traffic.ServeTCP(ctx, addr, name)
		if err != nil {
			return err
		}
		t.Cleanup(func() { ts.Close() })
		us, err := traffic.ServeUDP(ctx, addr, name)
		if err != nil {
			return err
		}
		t.Cleanup(func() { us.Close() })
		return nil
	})
	if err != nil {
		t.Fatalf("serve %s in namespace: %v", addr, err)
	}
}

// hostAddr is "198.18.0.1:port".
func hostAddr(port int) string { return net.JoinHostPort(sandbox.HostIP.String(), strconv.Itoa(port)) }

func loAddr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

func clientAddr(port int) string {
	return net.JoinHostPort(sandbox.ClientIP.String(), strconv.Itoa(port))
}

// tcShow returns `tc filter show dev DEV ingress` in the sandbox host.
func (e *env) tcShow(dev string) string {
	e.t.Helper()
	out, err := e.sb.Host.Command("tc", "filter", "show", "dev", dev, "ingress").CombinedOutput()
	if err != nil {
		e.t.Fatalf("tc filter show dev %s: %v\n%s", dev, err, out)
	}
	return actionIndexRE.ReplaceAllString(string(out), "")
}

// actionIndexRE matches tc's action index lines: they change when a filter
// is deleted and re-added identically.
var actionIndexRE = regexp.MustCompile(`(?m)^\s*index \d+ ref \d+ bind \d+\n`)

// hostFilters is the host eth0 and lo ingress filter listing, once the
// demuxes have deleted the hash tables the kernel still held busy.
func (e *env) hostFilters() string {
	e.t.Helper()
	if err := e.d.flush(); err != nil {
		e.t.Fatal(err)
	}
	return "eth0:\n" + e.tcShow("eth0") + "lo:\n" + e.tcShow("lo")
}

// hostLinks lists the sandbox host's link names but those of retired
// links (awaiting deletion in the background: no container's).
func (e *env) hostLinks() []string {
	e.t.Helper()
	var out []string
	for _, a := range e.hostLinkAttrs() {
		if !isRetired(a) {
			out = append(out, a.Name)
		}
	}
	return out
}

// hostLinkAttrs lists the sandbox host's links, retired ones included.
func (e *env) hostLinkAttrs() []*netlink.LinkAttrs {
	e.t.Helper()
	h, err := e.sb.Host.Netlink()
	if err != nil {
		e.t.Fatal(err)
	}
	defer h.Close()
	// Retired links are deleted in the background (retire.go): a dump
	// interrupted by a deletion is taken again (bounded).
	ls, err := h.LinkList()
	for i := 0; i < 20 && errors.Is(err, netlink.ErrDumpInterrupted); i++ {
		ls, err = h.LinkList()
	}
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*netlink.LinkAttrs
	for _, l := range ls {
		out = append(out, l.Attrs())
	}
	return out
}

func (e *env) hasLink(name string) bool {
	for _, n := range e.hostLinks() {
		if n == name {
			return true
		}
	}
	return false
}

// rootState captures the root namespace's state that the tests must never
// change: links with MAC/MTU/flags, addresses, qdiscs and the lo sysctls the
// data plane writes in its host namespace.
func rootState(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		a := l.Attrs()
		fmt.Fprintf(&b, "link %d %s %s mtu %d flags %v\n", a.Index, a.Name, a.HardwareAddr, a.MTU, a.Flags)
		qs, _ := netlink.QdiscList(l)
		for _, q := range qs {
			fmt.Fprintf(&b, "  qdisc %s %x\n", q.Type(), q.Attrs().Parent)
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		for _, ad := range addrs {
			fmt.Fprintf(&b, "  addr %s\n", ad.IPNet)
		}
	}
	for _, k := range []string{"net/ipv4/conf/lo/route_localnet", "net/ipv4/conf/lo/accept_local",
		"net/ipv4/conf/all/rp_filter", "net/ipv4/conf/lo/rp_filter", "net/ipv4/ip_local_port_range"} {
		var v string
		sysctl.Here(func(sd *sysctl.Dir) (err error) { v, err = sd.Read(k); return err })
		fmt.Fprintf(&b, "%s=%s\n", k, v)
	}
	return b.String()
}

// checkRootUnchanged fails the test at cleanup if the root namespace changed.
func checkRootUnchanged(t testing.TB) {
	before := rootState(t)
	t.Cleanup(func() {
		if after := rootState(t); after != before {
			t.Errorf("root namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
}

// run executes a command and returns its combined output (tests only).
func run(t testing.TB, name string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// lineDiff summarises how b differs from a, line by line (as multisets).
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out []string
	for l, n := range count {
		switch {
		case n > 0:
			out = append(out, fmt.Sprintf("- %s (x%d)", l, n))
		case n < 0:
			out = append(out, fmt.Sprintf("+ %s (x%d)", l, -n))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}
