package dataplane

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/containerns"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
	"github.com/vishvananda/netlink"
)

// followWithin is how long the tests give containers to follow a host
// change (the follower's target is 2 s; the slack is for a loaded machine).
const followWithin = 6 * time.Second

// followEnv is an env whose data plane follows the host, with the last
// host facts it reported.
type followEnv struct {
	*env
	mu   sync.Mutex
	info plane.HostInfo
	seen atomic.Int64
}

func newFollowEnv(t testing.TB, opts ...sandbox.Option) *followEnv {
	t.Helper()
	return newFollowEnvMode(t, IPv6Auto, opts...)
}

func newFollowEnvMode(t testing.TB, mode IPv6Mode, opts ...sandbox.Option) *followEnv {
	t.Helper()
	sb := sandbox.New(t, opts...)
	e := &env{t: t, sb: sb, ops: new(atomic.Int64), errs: new(atomic.Int64), ipv6: mode}
	d, err := New(Config{HostNS: sb.Host.Path, IPv6: mode, Logger: quietLogger(t), Follow: true,
		Observer: func(op tcfilter.Op) {
			e.ops.Add(1)
			if op.Result == "error" {
				e.errs.Add(1)
			}
		}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	e.d = d
	fe := &followEnv{env: e}
	d.OnHostChange(func(h plane.HostInfo) {
		fe.mu.Lock()
		fe.info = h
		fe.mu.Unlock()
		fe.seen.Add(1)
	})
	if e.info, err = d.PrepareHost(context.Background()); err != nil {
		t.Fatalf("PrepareHost: %v", err)
	}
	fe.info = e.info
	return fe
}

func (fe *followEnv) host() plane.HostInfo {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	return fe.info
}

// ip runs `ip args...` in namespace ns (the sandbox's host or client).
func ip(t testing.TB, ns sandbox.NS, args ...string) {
	t.Helper()
	if out, err := ns.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// ctrView is what a test sees of a container's eth0 and lo.
type ctrView struct {
	addrs4 []string // eth0's IPv4 addresses with prefix
	gw4    string   // eth0's IPv4 default gateway
	mtu    int      // the MTU metric of every IPv4 route through eth0 (0: one lacks it or they differ, or eth0's MTU is not containerns.EthMTU)
	loMTU  int
	mac    string
	// noRoutes: eth0 has no IPv4 route (no address), so mtu says nothing
	noRoutes bool
}

// netlinker opens a netlink handle in a namespace (a sandbox container
// or a namespace by path).
type netlinker interface {
	Netlink() (*netlink.Handle, error)
}

func viewOf(p netlinker) (ctrView, error) {
	var v ctrView
	h, err := p.Netlink()
	if err != nil {
		return v, err
	}
	defer h.Close()
	eth, err := h.LinkByName(ContainerEth0)
	if err != nil {
		return v, err
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return v, err
	}
	v.loMTU, v.mac = lo.Attrs().MTU, eth.Attrs().HardwareAddr.String()
	as, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		return v, err
	}
	for _, a := range as {
		v.addrs4 = append(v.addrs4, a.IPNet.String())
	}
	rs, err := h.RouteList(eth, netlink.FAMILY_V4)
	if err != nil {
		return v, err
	}
	for i, r := range rs {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			v.gw4 = fmt.Sprint(r.Gw)
		}
		if i == 0 {
			v.mtu = r.MTU
		} else if r.MTU != v.mtu {
			v.mtu = 0
		}
	}
	if eth.Attrs().MTU != containerns.EthMTU {
		v.mtu = 0
	}
	v.noRoutes = len(rs) == 0
	return v, nil
}

func (v ctrView) String() string {
	return fmt.Sprintf("addrs %v gw %s mtu %d lo mtu %d mac %s", v.addrs4, v.gw4, v.mtu, v.loMTU, v.mac)
}

// sourceSeen dials addr from inside p over TCP and returns the source
// address the server (in the client namespace, see acceptor) saw.
type acceptor struct {
	ln    net.Listener
	peers chan string
}

// listenIn listens on addr in ns and answers every connection with one
// line, reporting its peer's address.
func listenIn(t testing.TB, ns doer, addr string) *acceptor {
	t.Helper()
	a := &acceptor{peers: make(chan string, 64)}
	err := ns.Do(func() (err error) {
		a.ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.ln.Close() })
	go func() {
		for {
			c, err := a.ln.Accept()
			if err != nil {
				return
			}
			select {
			case a.peers <- c.RemoteAddr().(*net.TCPAddr).IP.String():
			default:
			}
			c.Write([]byte("ok\n"))
			c.Close()
		}
	}()
	return a
}

// dialFrom connects from inside p to addr and returns the local address
// the kernel chose, once the server's line came back (the whole path
// works both ways).
func dialFrom(p doer, addr string) (string, error) {
	var local string
	err := p.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		if line != "ok\n" {
			return fmt.Errorf("got %q", line)
		}
		local = c.LocalAddr().(*net.TCPAddr).IP.String()
		return nil
	})
	return local, err
}

// waitInLine waits until p's eth0 carries exactly addr (with prefix; ""
// for none), default gateway gw ("" none or "<nil>") and mtu, and the
// client reaches p's port on hostIP (unless ""). It returns how long it
// took.
func (fe *followEnv) waitInLine(t *testing.T, p *sandbox.Container, name string, port int, addr, gw string, mtu int) time.Duration {
	t.Helper()
	start := time.Now()
	var last ctrView
	var lastErr error
	ok := wait.Until(followWithin, func() bool {
		v, err := viewOf(p)
		if err != nil {
			lastErr = err
			return false
		}
		last = v
		want := []string(nil)
		if addr != "" {
			want = []string{addr}
		}
		if fmt.Sprint(v.addrs4) != fmt.Sprint(want) || (v.mtu != mtu && !(addr == "" && v.noRoutes)) || v.loMTU != wantLoMTU(fe.d, mtu) {
			return false
		}
		if gw != "" && v.gw4 != gw {
			return false
		}
		return true
	})
	took := time.Since(start)
	if !ok {
		t.Fatalf("container %s not in line within %v: %v (err %v); want addr %s gw %s mtu %d", name, followWithin, last, lastErr, addr, gw, mtu)
	}
	if addr != "" && port != 0 {
		hostIP := strings.Split(addr, "/")[0]
		target := net.JoinHostPort(hostIP, fmt.Sprint(port))
		var err error
		if !wait.Until(followWithin, func() bool {
			var got string
			got, err = echo(fe.sb.Client, "tcp", target, traffic0()...)
			return err == nil && got == name
		}) {
			t.Fatalf("client cannot reach %s on %s after the change: %v", name, target, err)
		}
	}
	return took
}

func TestFollowIPv4RenumberGatewayMTU(t *testing.T) {
	checkRootUnchanged(t)
	fe := newFollowEnv(t)
	sb := fe.sb
	const port = 8080
	web := fe.start("web", 1, "40000-40063", "8080", "", port)
	mustEcho(t, sb.Client, "tcp", hostAddr(port), "web")
	// The outside world: a server in the client namespace on both of
	// its addresses (the second subnet is added below).
	ip(t, sb.Client, "addr", "add", "198.18.5.2/24", "dev", "eth0")
	out := listenIn(t, sb.Client, "0.0.0.0:9000")

	// 1. add-then-remove, with a gateway change: the new address, then
	// the new default route, then the old address goes.
	ip(t, sb.Host, "addr", "add", "198.18.5.1/24", "dev", "eth0")
	ip(t, sb.Host, "route", "replace", "default", "via", "198.18.5.2", "dev", "eth0")
	ip(t, sb.Host, "addr", "del", "198.18.0.1/24", "dev", "eth0")
	took := fe.waitInLine(t, web.proc, "web", port, "198.18.5.1/24", "198.18.5.2", 1500)
	t.Logf("add-then-remove + gateway: container in line after %v", took)
	if src, err := dialFrom(web.proc, "198.18.5.2:9000"); err != nil || src != "198.18.5.1" {
		t.Errorf("container's outgoing connection: source %q, err %v; want 198.18.5.1", src, err)
	} else if peer := <-out.peers; peer != "198.18.5.1" {
		t.Errorf("server saw the container as %s, want 198.18.5.1", peer)
	}
	if _, err := echo(sb.Client, "tcp", hostAddr(port), traffic0()...); err == nil {
		t.Errorf("the old address %s still answers", hostAddr(port))
	}
	wait.For(t, followWithin, "the host facts reported follow", func() bool {
		h := fe.host()
		return h.IP.String() == "198.18.5.1/24" && h.Gateway.String() == "198.18.5.2"
	})

	// 2. remove-then-add: the host has no IPv4 address for a while
	// (containers have none either), then the first one back.
	ip(t, sb.Host, "addr", "del", "198.18.5.1/24", "dev", "eth0")
	fe.waitInLine(t, web.proc, "web", 0, "", "", 1500)
	wait.For(t, followWithin, "the host facts say no IPv4 address", func() bool { return fe.host().IP.IP == nil })
	ip(t, sb.Host, "addr", "add", "198.18.0.1/24", "dev", "eth0")
	ip(t, sb.Host, "route", "replace", "default", "via", "198.18.0.2", "dev", "eth0")
	took = fe.waitInLine(t, web.proc, "web", port, "198.18.0.1/24", "198.18.0.2", 1500)
	t.Logf("remove-then-add: container in line after %v", took)
	if src, err := dialFrom(web.proc, "198.18.0.2:9000"); err != nil || src != "198.18.0.1" {
		t.Errorf("container's outgoing connection: source %q, err %v; want 198.18.0.1", src, err)
	}

	// 3. MTU 1,500 -> 1,400 -> 1,500: eth0's route metrics (eth0 stays at
	// containerns.EthMTU), lo and the host veth follow.
	for _, mtu := range []int{1400, 1500} {
		ip(t, sb.Host, "link", "set", "eth0", "mtu", fmt.Sprint(mtu))
		took = fe.waitInLine(t, web.proc, "web", port, "198.18.0.1/24", "198.18.0.2", mtu)
		t.Logf("MTU %d: container in line after %v", mtu, took)
		h, err := sb.Host.Netlink()
		if err != nil {
			t.Fatal(err)
		}
		l, err := h.LinkByName(plane.VethName(web.c.ID))
		h.Close()
		if err != nil || l.Attrs().MTU != fe.d.vethMTU(mtu) {
			t.Errorf("host veth MTU after the change to %d: %v %v", mtu, l, err)
		}
	}
	st := fe.d.FollowStats()
	if st.Pending != 0 || st.Changes < 4 {
		t.Errorf("follower stats %+v: want nothing pending and at least 4 changes", st)
	}
}

// traffic0 are the echo options of these tests (the default timeout).
func traffic0() []traffic.Option { return nil }

// recreateEth0 deletes the sandbox host's eth0 (and the client's end) and
// makes the pair again with the same addresses and routes but a new MAC.
func recreateEth0(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()
	client := sb.Client.Path[strings.LastIndex(sb.Client.Path, "/")+1:]
	ip(t, sb.Host, "link", "del", "eth0")
	ip(t, sb.Host, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", client)
	ip(t, sb.Client, "addr", "add", "198.18.0.2/24", "dev", "eth0")
	ip(t, sb.Client, "link", "set", "eth0", "up")
	ip(t, sb.Host, "addr", "add", "198.18.0.1/24", "dev", "eth0")
	ip(t, sb.Host, "link", "set", "eth0", "up")
	ip(t, sb.Host, "route", "replace", "default", "via", "198.18.0.2", "dev", "eth0")
}

func TestFollowEth0Recreated(t *testing.T) {
	checkRootUnchanged(t)
	fe := newFollowEnv(t)
	sb := fe.sb
	const port = 8080
	web := fe.start("web", 1, "40000-40063", "8080", "", port)
	mustEcho(t, sb.Client, "tcp", hostAddr(port), "web")
	before, err := viewOf(web.proc)
	if err != nil {
		t.Fatal(err)
	}
	recreateEth0(t, sb)
	out := listenIn(t, sb.Client, "0.0.0.0:9000")
	h, err := sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	mac := eth.Attrs().HardwareAddr.String()
	if mac == before.mac {
		t.Fatalf("the new eth0 has the old MAC %s: the test proves nothing about MACs", mac)
	}
	took := fe.waitInLine(t, web.proc, "web", port, "198.18.0.1/24", "198.18.0.2", 1500)
	t.Logf("eth0 recreated: container in line after %v", took)
	wait.For(t, followWithin, "the container's eth0 and lo carry the new MAC", func() bool {
		v, err := viewOf(web.proc)
		return err == nil && v.mac == mac
	})
	lo, err := h.LinkByName("lo")
	if err != nil || lo.Attrs().HardwareAddr.String() != mac {
		t.Errorf("host lo MAC %v (%v), want eth0's %s", lo.Attrs().HardwareAddr, err, mac)
	}
	if src, err := dialFrom(web.proc, "198.18.0.2:9000"); err != nil || src != "198.18.0.1" {
		t.Errorf("container's outgoing connection: source %q, err %v; want 198.18.0.1", src, err)
	} else if peer := <-out.peers; peer != "198.18.0.1" {
		t.Errorf("server saw the container as %s", peer)
	}
	mustEcho(t, sb.Client, "udp", hostAddr(port), "web")
	// A container set up after the change is plumbed on the new eth0.
	api := fe.start("api", 2, "40064-40127", "8081", "", 8081)
	mustEcho(t, sb.Client, "tcp", hostAddr(8081), "api")
	if v, err := viewOf(api.proc); err != nil || v.mac != mac {
		t.Errorf("new container: %v %v, want MAC %s", v, err, mac)
	}
	if st := fe.d.FollowStats(); st.Pending != 0 {
		t.Errorf("follower stats %+v: want nothing pending", st)
	}
}

// globals6 are the global IPv6 addresses of p's eth0.
func globals6(p *sandbox.Container) ([]string, error) {
	h, err := p.Netlink()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	eth, err := h.LinkByName(ContainerEth0)
	if err != nil {
		return nil, err
	}
	as, err := h.AddrList(eth, netlink.FAMILY_V6)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range as {
		if a.IP.IsGlobalUnicast() {
			out = append(out, a.IPNet.String())
		}
	}
	sort.Strings(out)
	return out, nil
}

func TestFollowIPv6Renumber(t *testing.T) {
	checkRootUnchanged(t)
	fe := newFollowEnv(t, sandbox.WithIPv6())
	sb := fe.sb
	const port = 8080
	web := fe.start("web", 1, "40000-40063", "8080", "", port)
	old := net.JoinHostPort(sb.HostIP6.String(), fmt.Sprint(port))
	mustEcho(t, sb.Client, "tcp", old, "web")
	// The new prefix: the sandbox's with its seventh byte changed.
	newHost := append(net.IP(nil), sb.HostIP6...)
	newHost[6] ^= 0x01
	newClient := append(net.IP(nil), sb.ClientIP6...)
	newClient[6] ^= 0x01
	oldNet, newNet := sb.HostIP6.String()+"/64", newHost.String()+"/64"
	ip(t, sb.Client, "-6", "addr", "add", newClient.String()+"/64", "dev", "eth0", "nodad")
	out := listenIn(t, sb.Client, "[::]:9000")

	// make-before-break: while the host has both, containers have both
	// and the old one keeps working
	ip(t, sb.Host, "-6", "addr", "add", newNet, "dev", "eth0", "nodad")
	want := []string{newNet, oldNet}
	sort.Strings(want)
	var got []string
	wait.For(t, followWithin, "the container has both prefixes", func() bool {
		got, _ = globals6(web.proc)
		return fmt.Sprint(got) == fmt.Sprint(want)
	})
	mustEcho(t, sb.Client, "tcp", old, "web")
	start := time.Now()
	ip(t, sb.Host, "-6", "addr", "del", oldNet, "dev", "eth0")
	wait.For(t, followWithin, "the container has only the new prefix", func() bool {
		got, _ = globals6(web.proc)
		return fmt.Sprint(got) == fmt.Sprint([]string{newNet})
	})
	t.Logf("IPv6 renumbered: container in line after %v", time.Since(start))
	target := net.JoinHostPort(newHost.String(), fmt.Sprint(port))
	var err error
	if !wait.Until(followWithin, func() bool {
		var name string
		name, err = echo(sb.Client, "tcp", target)
		return err == nil && name == "web"
	}) {
		t.Fatalf("client cannot reach web on %s: %v", target, err)
	}
	mustEcho(t, sb.Client, "udp", target, "web")
	if src, err := dialFrom(web.proc, net.JoinHostPort(newClient.String(), "9000")); err != nil || src != newHost.String() {
		t.Errorf("container's outgoing connection: source %q, err %v; want %s", src, err, newHost)
	} else if peer := <-out.peers; peer != newHost.String() {
		t.Errorf("server saw the container as %s", peer)
	}
	// IPv4 is untouched.
	mustEcho(t, sb.Client, "tcp", hostAddr(port), "web")
	wait.For(t, followWithin, "the host facts reported follow", func() bool {
		h := fe.host()
		return len(h.IPv6) == 1 && h.IPv6[0].String() == newNet
	})

	// The host loses its last global IPv6 address: so do containers;
	// it comes back: so does theirs.
	ip(t, sb.Host, "-6", "addr", "del", newNet, "dev", "eth0")
	wait.For(t, followWithin, "the container has no global IPv6 address", func() bool {
		got, _ = globals6(web.proc)
		return len(got) == 0
	})
	wait.For(t, followWithin, "the host facts say no IPv6 address", func() bool { return len(fe.host().IPv6) == 0 })
	mustEcho(t, sb.Client, "tcp", hostAddr(port), "web")
	ip(t, sb.Host, "-6", "addr", "add", newNet, "dev", "eth0", "nodad")
	wait.For(t, followWithin, "the container has the address again", func() bool {
		got, _ = globals6(web.proc)
		return fmt.Sprint(got) == fmt.Sprint([]string{newNet})
	})
	if !wait.Until(followWithin, func() bool {
		var name string
		name, err = echo(sb.Client, "tcp", target)
		return err == nil && name == "web"
	}) {
		t.Fatalf("client cannot reach web on %s after the address came back: %v", target, err)
	}
	if src, err := dialFrom(web.proc, net.JoinHostPort(newClient.String(), "9000")); err != nil || src != newHost.String() {
		t.Errorf("container's outgoing connection after the address came back: source %q, err %v", src, err)
	}
}

// TestFollowHundredContainers: the IPv4 renumbering with a gateway change
// and an MTU change with 100 containers, each serving its port: all are in
// line within the deadline, each answers on the new address and connects
// out from it.
func TestFollowHundredContainers(t *testing.T) {
	checkRootUnchanged(t)
	fe := newFollowEnv(t)
	sb := fe.sb
	const n = 100
	cs := fe.addFleet(0, n)
	nss := make([]sandbox.NS, n)
	for i, c := range cs {
		nss[i] = sandbox.NS{Name: c.ID, Path: fe.d.mountPath(c.ID)}
		serveIn(t, nss[i], fmt.Sprintf("0.0.0.0:%d", 20000+i), c.ID)
	}
	ip(t, sb.Client, "addr", "add", "198.18.5.2/24", "dev", "eth0")
	out := listenIn(t, sb.Client, "0.0.0.0:9000")
	allInLine := func(addr, gw string, mtu int) time.Duration {
		t.Helper()
		start := time.Now()
		var bad string
		ok := wait.Until(3*followWithin, func() bool {
			for i, ns := range nss {
				v, err := viewOf(ns)
				if err != nil || fmt.Sprint(v.addrs4) != fmt.Sprint([]string{addr}) || v.gw4 != gw || v.mtu != mtu || v.loMTU != wantLoMTU(fe.d, mtu) {
					bad = fmt.Sprintf("container %d: %v %v", i, v, err)
					return false
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("not every container in line: %s (want %s via %s, mtu %d)", bad, addr, gw, mtu)
		}
		return time.Since(start)
	}
	ip(t, sb.Host, "addr", "add", "198.18.5.1/24", "dev", "eth0")
	ip(t, sb.Host, "route", "replace", "default", "via", "198.18.5.2", "dev", "eth0")
	ip(t, sb.Host, "addr", "del", "198.18.0.1/24", "dev", "eth0")
	took := allInLine("198.18.5.1/24", "198.18.5.2", 1500)
	t.Logf("%d containers in line after the renumbering in %v", n, took)
	for i, ns := range nss {
		mustEcho(t, sb.Client, "tcp", fmt.Sprintf("198.18.5.1:%d", 20000+i), cs[i].ID)
		if src, err := dialFrom(ns, "198.18.5.2:9000"); err != nil || src != "198.18.5.1" {
			t.Errorf("container %d: outgoing source %q, err %v", i, src, err)
		} else if peer := <-out.peers; peer != "198.18.5.1" {
			t.Errorf("container %d: the server saw %s", i, peer)
		}
	}
	ip(t, sb.Host, "link", "set", "eth0", "mtu", "1400")
	took = allInLine("198.18.5.1/24", "198.18.5.2", 1400)
	t.Logf("%d containers in line after the MTU change in %v", n, took)
	mustEcho(t, sb.Client, "udp", fmt.Sprintf("198.18.5.1:%d", 20000+n-1), cs[n-1].ID)
	if st := fe.d.FollowStats(); st.Pending != 0 || st.Failures != 0 || st.Synced < 2*n {
		t.Errorf("follower stats %+v: want %d synced twice, none failed or pending", st, n)
	}
}

// TestFollowRestartAfterChanges: the host is renumbered (with a gateway
// and an MTU change) while the daemon is down; the restarted data plane's
// Adopt brings the container in line from its veth's alias, as it does
// for IPv6.
func TestFollowRestartAfterChanges(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	sb := e.sb
	const port = 8080
	web := e.start("web", 1, "40000-40063", "8080", "", port)
	mustEcho(t, sb.Client, "tcp", hostAddr(port), "web")
	e.d.Close()
	ip(t, sb.Client, "addr", "add", "198.18.5.2/24", "dev", "eth0")
	ip(t, sb.Host, "addr", "add", "198.18.5.1/24", "dev", "eth0")
	ip(t, sb.Host, "route", "replace", "default", "via", "198.18.5.2", "dev", "eth0")
	ip(t, sb.Host, "addr", "del", "198.18.0.1/24", "dev", "eth0")
	ip(t, sb.Host, "link", "set", "eth0", "mtu", "1400")
	out := listenIn(t, sb.Client, "0.0.0.0:9000")

	ctx := context.Background()
	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d2.Adopt(ctx, web.c); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.Strays(ctx, []plane.Container{web.c}); err != nil {
		t.Fatal(err)
	}
	v, err := viewOf(web.proc)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(v.addrs4) != "[198.18.5.1/24]" || v.gw4 != "198.18.5.2" || v.mtu != 1400 || v.loMTU != wantLoMTU(d2, 1400) {
		t.Errorf("container after the restart: %v", v)
	}
	mustEcho(t, sb.Client, "tcp", "198.18.5.1:8080", "web")
	mustEcho(t, sb.Client, "udp", "198.18.5.1:8080", "web")
	if src, err := dialFrom(web.proc, "198.18.5.2:9000"); err != nil || src != "198.18.5.1" {
		t.Errorf("container's outgoing connection: source %q, err %v; want 198.18.5.1", src, err)
	} else if peer := <-out.peers; peer != "198.18.5.1" {
		t.Errorf("server saw the container as %s", peer)
	}
	if miss, err := d2.Check(ctx, web.c); err != nil || len(miss) != 0 {
		t.Errorf("Check after Adopt: %v %v", miss, err)
	}
}

// TestFollowSecondAddressNoDisruption: a second IPv4 address added to the
// host and removed again changes nothing containers carry (the primary
// address stays): a connection to the container on the first address
// carries on throughout, and no container is touched.
func TestFollowSecondAddressNoDisruption(t *testing.T) {
	checkRootUnchanged(t)
	fe := newFollowEnv(t)
	sb := fe.sb
	const port = 8080
	web := fe.start("web", 1, "40000-40063", "8080", "", port)
	var conn net.Conn
	err := sb.Client.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", hostAddr(port), 2*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	roundTrip := func(msg string) {
		t.Helper()
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write([]byte(msg + "\n")); err != nil {
			t.Fatalf("%s: write: %v", msg, err)
		}
		line, err := rd.ReadString('\n')
		if err != nil || line != "web "+msg+"\n" {
			t.Fatalf("%s: got %q, %v", msg, line, err)
		}
	}
	roundTrip("before")
	before := fe.d.FollowStats()
	ip(t, sb.Host, "addr", "add", "198.18.7.1/24", "dev", "eth0")
	wait.For(t, followWithin, "a pass after the new address", func() bool {
		return fe.d.FollowStats().Passes > before.Passes
	})
	roundTrip("second added")
	// A tenant taking the host's second address for itself gets nothing
	// through: the veth lets only the address containers share out.
	listenIn(t, sb.Client, "0.0.0.0:9000")
	err = web.proc.Do(func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		eth, err := h.LinkByName(ContainerEth0)
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr("198.18.7.1/32")
		return h.AddrAdd(eth, a)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = web.proc.Do(func() error {
		d := net.Dialer{Timeout: 500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: net.ParseIP("198.18.7.1")}}
		c, err := d.Dial("tcp4", "198.18.0.2:9000")
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Errorf("a container connected out from the host's second address")
	}
	wait.For(t, followWithin, "the veth dropped the SYN from the second address", func() bool {
		st, err := fe.d.Stats(context.Background(), web.c)
		return err == nil && st.Dropped[tcfilter.DropSource] > 0
	})
	if src, err := dialFrom(web.proc, "198.18.0.2:9000"); err != nil || src != "198.18.0.1" {
		t.Errorf("outgoing connection from the shared address: %q %v", src, err)
	}
	added := fe.d.FollowStats()
	ip(t, sb.Host, "addr", "del", "198.18.7.1/24", "dev", "eth0")
	wait.For(t, followWithin, "a pass after the removal", func() bool {
		return fe.d.FollowStats().Passes > added.Passes
	})
	roundTrip("second removed")
	if st := fe.d.FollowStats(); st.Changes != before.Changes || st.Synced != before.Synced {
		t.Errorf("a second address changed containers: before %+v after %+v", before, st)
	}
	v, err := viewOf(web.proc)
	if err != nil || !strings.Contains(fmt.Sprint(v.addrs4), "198.18.0.1/24") {
		t.Errorf("container: %v %v", v, err)
	}
	mustEcho(t, sb.Client, "udp", hostAddr(port), "web")
}

// TestFollowOneBadContainer: a container whose namespace cannot be
// brought in line (its tenant renamed eth0) is counted and retried while
// the others follow; once its eth0 is back it follows too.
func TestFollowOneBadContainer(t *testing.T) {
	checkRootUnchanged(t)
	fe := newFollowEnv(t)
	sb := fe.sb
	bad := fe.start("bad", 1, "40000-40063", "8080", "", 8080)
	good := fe.start("good", 2, "40064-40127", "8081", "", 8081)
	h, err := bad.proc.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName(ContainerEth0)
	if err != nil {
		t.Fatal(err)
	}
	rename := func(name string) {
		t.Helper()
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		must(h.LinkSetDown(eth))
		must(h.LinkSetName(eth, name))
		must(h.LinkSetUp(eth))
	}
	rename("tenant0")
	ip(t, sb.Client, "addr", "add", "198.18.5.2/24", "dev", "eth0")
	ip(t, sb.Host, "addr", "add", "198.18.5.1/24", "dev", "eth0")
	ip(t, sb.Host, "route", "replace", "default", "via", "198.18.5.2", "dev", "eth0")
	ip(t, sb.Host, "addr", "del", "198.18.0.1/24", "dev", "eth0")
	fe.waitInLine(t, good.proc, "good", 8081, "198.18.5.1/24", "198.18.5.2", 1500)
	wait.For(t, followWithin, "the bad container's failures are counted and retried", func() bool {
		st := fe.d.FollowStats()
		return st.Failures >= 2 && st.Pending == 1
	})
	mustEcho(t, sb.Client, "tcp", "198.18.5.1:8081", "good")
	rename(ContainerEth0)
	fe.waitInLine(t, bad.proc, "bad", 8080, "198.18.5.1/24", "198.18.5.2", 1500)
	wait.For(t, followWithin, "nothing pending", func() bool { return fe.d.FollowStats().Pending == 0 })
}

// TestFollowIPv6Appears: --ipv6=auto decided off (the host had no global
// IPv6 address at start-up); the host gains one (and a default route via
// a link-local router): the follower turns IPv6 on, a container set up
// from then on is reachable over IPv6 and connects out from the host's
// address, and one set up before keeps working over IPv4 without IPv6.
func TestFollowIPv6Appears(t *testing.T) {
	checkRootUnchanged(t)
	fe := newFollowEnv(t)
	sb := fe.sb
	if fe.d.IPv6() != nil || len(fe.info.IPv6) != 0 {
		t.Fatalf("IPv6 on at start-up without a host IPv6 address: %v", fe.info.IPv6)
	}
	old := fe.start("old", 1, "40000-40063", "8080", "", 8080)
	mustEcho(t, sb.Client, "tcp", hostAddr(8080), "old")

	const host6, client6 = "2001:db8:33:b::1", "2001:db8:33:b::2"
	ip(t, sb.Client, "-6", "addr", "add", client6+"/64", "dev", "eth0", "nodad")
	ip(t, sb.Client, "-6", "addr", "add", sandbox.RouterLinkLocal6+"/64", "dev", "eth0", "nodad")
	out := listenIn(t, sb.Client, "[::]:9000")
	start := time.Now()
	ip(t, sb.Host, "-6", "addr", "add", host6+"/64", "dev", "eth0", "nodad")
	ip(t, sb.Host, "-6", "route", "add", "default", "via", sandbox.RouterLinkLocal6, "dev", "eth0")
	wait.For(t, followWithin, "the host facts reported carry the IPv6 address", func() bool {
		h := fe.host()
		return len(h.IPv6) == 1 && h.IPv6[0].String() == host6+"/64" && h.Gateway6.String() == sandbox.RouterLinkLocal6
	})
	t.Logf("IPv6 turned on %v after the address was added", time.Since(start))
	if v6 := fe.d.IPv6(); v6 == nil || !v6.HasGlobal() {
		t.Fatalf("data plane IPv6 facts: %v", v6)
	}

	set := time.Now()
	nw := fe.start("new", 2, "40064-40127", "8081", "", 8081)
	target := net.JoinHostPort(host6, "8081")
	var err error
	if !wait.Until(2*time.Second, func() bool {
		var name string
		name, err = echo(sb.Client, "tcp", target)
		return err == nil && name == "new"
	}) {
		t.Fatalf("client cannot reach the new container on %s within 2 s: %v", target, err)
	}
	t.Logf("new container reachable over IPv6 %v after its setup began", time.Since(set))
	mustEcho(t, sb.Client, "udp", target, "new")
	if src, err := dialFrom(nw.proc, net.JoinHostPort(client6, "9000")); err != nil || src != host6 {
		t.Errorf("new container's outgoing IPv6 connection: source %q, err %v; want %s", src, err, host6)
	} else if peer := <-out.peers; peer != host6 {
		t.Errorf("server saw the new container as %s", peer)
	}
	mustEcho(t, sb.Client, "tcp", hostAddr(8081), "new")

	// The container set up before gains IPv6 as a host process would,
	// with no address of its own, and keeps working over IPv4.
	wait.For(t, followWithin, "every container in line", func() bool { return fe.d.FollowStats().Pending == 0 })
	if got, err := globals6(old.proc); err != nil || fmt.Sprint(got) != fmt.Sprint([]string{host6 + "/64"}) {
		t.Errorf("old container's global IPv6 addresses: %v (err %v); want %s/64", got, err, host6)
	}
	hostLL := fe.d.IPv6().LinkLocal.String()
	if all, err := addrs6Of(old.proc); err != nil || fmt.Sprint(all) != fmt.Sprint([]string{host6 + "/64", hostLL}) {
		t.Errorf("old container's eth0 IPv6 addresses: %v (err %v); want %s/64 and the host's %s only", all, err, host6, hostLL)
	}
	mustEcho(t, sb.Client, "tcp", hostAddr(8080), "old")
	mustEcho(t, sb.Client, "udp", hostAddr(8080), "old")
	old6 := net.JoinHostPort(host6, "8080")
	if !wait.Until(2*time.Second, func() bool {
		var name string
		name, err = echo(sb.Client, "tcp", old6)
		return err == nil && name == "old"
	}) {
		t.Fatalf("client cannot reach the old container on %s: %v", old6, err)
	}
	mustEcho(t, sb.Client, "udp", old6, "old")
	if src, err := dialFrom(old.proc, net.JoinHostPort(client6, "9000")); err != nil || src != host6 {
		t.Errorf("old container's outgoing IPv6 connection: source %q, err %v; want %s", src, err, host6)
	} else if peer := <-out.peers; peer != host6 {
		t.Errorf("server saw the old container as %s", peer)
	}
}

// addrs6Of are the IPv6 addresses of p's eth0 (multicast aside), sorted.
func addrs6Of(p *sandbox.Container) ([]string, error) {
	h, err := p.Netlink()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	eth, err := h.LinkByName(ContainerEth0)
	if err != nil {
		return nil, err
	}
	as, err := h.AddrList(eth, netlink.FAMILY_V6)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range as {
		if !a.IP.IsMulticast() {
			out = append(out, a.IPNet.String())
		}
	}
	sort.Strings(out)
	return out, nil
}

// TestFollowIPv6AppearsOff: with --ipv6=false the host gaining a global
// IPv6 address changes nothing: IPv6 stays off for the data plane, the
// facts reported and a container set up afterwards.
func TestFollowIPv6AppearsOff(t *testing.T) {
	checkRootUnchanged(t)
	fe := newFollowEnvMode(t, IPv6Off)
	sb := fe.sb
	ip(t, sb.Host, "-6", "addr", "add", "2001:db8:33:c::1/64", "dev", "eth0", "nodad")
	ip(t, sb.Host, "-6", "route", "add", "default", "via", sandbox.RouterLinkLocal6, "dev", "eth0")
	// A change the follower reports, after the address: its pass read
	// the host with the address there.
	ip(t, sb.Host, "link", "set", "eth0", "mtu", "1400")
	wait.For(t, followWithin, "a pass after the change", func() bool { return fe.host().MTU == 1400 })
	if v6 := fe.d.IPv6(); v6 != nil || len(fe.host().IPv6) != 0 {
		t.Fatalf("--ipv6=false: IPv6 on after the host gained an address: %v %v", v6, fe.host().IPv6)
	}
	c := fe.start("v4", 1, "40000-40063", "8080", "", 8080)
	if got, err := addrs6Of(c.proc); err != nil || len(got) != 0 {
		t.Errorf("--ipv6=false: container's IPv6 addresses %v (err %v)", got, err)
	}
	mustEcho(t, sb.Client, "tcp", hostAddr(8080), "v4")
}

// wantLoMTU is the MTU a container's lo has on d with the host at mtu.
func wantLoMTU(d *DataPlane, mtu int) int {
	if m := d.loMTU(); m > 0 {
		return m
	}
	return mtu
}
