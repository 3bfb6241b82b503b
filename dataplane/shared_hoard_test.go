package dataplane

import (
	"context"
	"math/rand"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// withShared replaces the env's data plane by one whose shared-port
// reconciler runs every `every` (negative: never) with SharedIdle idle.
func (e *env) withShared(every, idle time.Duration) {
	e.t.Helper()
	d, err := New(Config{HostNS: e.sb.Host.Path, Logger: quietLogger(e.t), SharedReconcile: every, SharedIdle: idle})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { d.Close() })
	if _, err := d.PrepareHost(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.d = d
}

// hoardUDP opens n UDP sockets in c's namespace bound to port (beside its
// server, SO_REUSEPORT) and connected to the client's address at random
// ports below 20000 (the measures use others: a datagram from a port a
// hoarding socket is connected to would reach it), without sending
// anything: n "flows" in its socket table.
func hoardUDP(t *testing.T, c *sandbox.Container, port, n int, rnd *rand.Rand) {
	t.Helper()
	var fds []int
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	err := c.Do(func() error {
		for range n {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
			for _, o := range []int{unix.SO_REUSEADDR, unix.SO_REUSEPORT} {
				if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, o, 1); err != nil {
					return err
				}
			}
			if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
				return err
			}
			to := &unix.SockaddrInet4{Port: 1024 + rnd.Intn(20000-1024)}
			copy(to.Addr[:], sandbox.ClientIP.To4())
			if err := unix.Connect(fd, to); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("hoarding UDP sockets: %v", err)
	}
}

// idleTCP opens n TCP connections from the client to addr from random
// source ports of [lo, hi) and leaves them open and silent.
func idleTCP(t *testing.T, client doer, addr string, n, lo, hi int, rnd *rand.Rand) {
	t.Helper()
	used := map[int]bool{}
	err := client.Do(func() error {
		for len(used) < n {
			src := lo + rnd.Intn(hi-lo)
			if used[src] {
				continue
			}
			used[src] = true
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{Port: src},
				Control: func(_, _ string, rc syscall.RawConn) error {
					var serr error
					rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
					return serr
				}}
			c, err := d.Dial("tcp4", addr)
			if err != nil {
				return err
			}
			t.Cleanup(func() { c.Close() })
		}
		return nil
	})
	if err != nil {
		t.Fatalf("idle TCP connections: %v", err)
	}
}

// share measures who answers n new TCP and n new UDP exchanges from
// random client source ports in [lo, hi).
func share(t *testing.T, client doer, addr string, n, lo, hi int, rnd *rand.Rand) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := 0; i < n; i++ {
		for _, nw := range []string{"tcp", "udp"} {
			src := lo + rnd.Intn(hi-lo)
			name, err := echo(client, nw, addr, traffic.WithSource(sandbox.ClientIP.String()+":"+strconv.Itoa(src)))
			if err != nil {
				t.Fatalf("%s from port %d: %v", nw, src, err)
			}
			got[name]++
		}
	}
	return got
}

// TestSharedJoinHoarder: A holds port 9300 alone with 5,000 connected,
// silent UDP sockets on it and 400 idle TCP connections (more "flows" than
// fit in any bucket's pins, in every bucket). B joins: at once, and again
// after a reconciler pass, B answers at least 40% of new connections
// (TCP and UDP), A keeps back no bucket and holds no pin: the host saw no
// traffic for those flows within SharedIdle.
func TestSharedJoinHoarder(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	const idle = time.Second
	e.withShared(-1, idle)
	const port = 9300
	ctx := context.Background()
	rnd := rand.New(rand.NewSource(30))
	a := e.start("A", 1, "40960-41983", "", "9300", port)
	b := e.start("B", 2, "41984-43007", "31000", "", port)
	hoardUDP(t, a.proc, port, 5000, rnd)
	idleTCP(t, e.sb.Client, hostAddr(port), 400, 20000, 40000, rnd)

	// Nothing passes the shared port's filters for SharedIdle.
	wait.For(t, 20*time.Second, "the shared port's buckets idle for SharedIdle", func() bool {
		u, err := e.d.eth0.SpreadUse(port)
		if err != nil || u[port] == nil {
			t.Fatalf("SpreadUse: %v", err)
		}
		for _, age := range u[port].Buckets {
			if age < idle+100*time.Millisecond {
				return false
			}
		}
		return true
	})
	if err := e.d.SetPorts(ctx, b.c, ephemeral.MustParseSet("31000"), ephemeral.MustParseSet("9300")); err != nil {
		t.Fatal(err)
	}
	want, _ := spread.Assign(port, []spread.Holder{{Slot: 1}, {Slot: 2}})
	st, _ := e.d.Shared(port)
	if !st.Settled || len(st.Spread.Pins) != 0 {
		held := 0
		for bk, h := range st.Spread.Buckets {
			if h.Slot != want[bk].Slot {
				held++
			}
		}
		t.Errorf("after the join: %d buckets held back, %d pins, for flows the host never saw", held, len(st.Spread.Pins))
	}
	// B is due 140 of 256 buckets: 200 exchanges put 40% 4 sigma below.
	check := func(when string) {
		t.Helper()
		got := share(t, e.sb.Client, hostAddr(port), 100, 40000, 60000, rnd)
		if total := got["A"] + got["B"]; got["B"]*100 < 40*total {
			t.Errorf("%s: new connections answered %v: B gets under 40%%", when, got)
		} else {
			t.Logf("%s: new connections answered %v", when, got)
		}
	}
	check("right after the join")
	e.pass()
	check("after a reconciler pass")
}

// pass runs one reconciler pass by hand.
func (e *env) pass() {
	e.t.Helper()
	e.d.mu.Lock()
	_, _, err := e.d.reconcileShared()
	e.d.mu.Unlock()
	if err != nil {
		e.t.Fatal(err)
	}
}

// TestSharedJoinHoarderBusy: the same hoarder, but every bucket of the
// port has just carried traffic, so the host's evidence cannot tell its
// fabricated flows from real ones. B still gets all but MaxHeld(2) of its
// buckets at once, each moved bucket carries at most MaxPinsPerBucket
// pins, and once SharedIdle has passed one reconciler pass gives B every
// bucket and drops the pins that saw no traffic.
func TestSharedJoinHoarderBusy(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	const idle = time.Second
	e.withShared(-1, idle)
	const port = 9310
	ctx := context.Background()
	rnd := rand.New(rand.NewSource(31))
	a := e.start("A", 1, "40960-41983", "", "9310", port)
	b := e.start("B", 2, "41984-43007", "31000", "", port)
	hoardUDP(t, a.proc, port, 5000, rnd)
	// Traffic in every bucket, from ports the hoarder does not list.
	for bk := range spread.Buckets {
		src := 40000 + bk<<1
		if _, err := echo(e.sb.Client, "udp", hostAddr(port), traffic.WithSource(sandbox.ClientIP.String()+":"+strconv.Itoa(src))); err != nil {
			t.Fatal(err)
		}
	}
	hs := []spread.Holder{{Slot: 1}, {Slot: 2}}
	want, err := spread.Assign(port, hs)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.d.SetPorts(ctx, b.c, ephemeral.MustParseSet("31000"), ephemeral.MustParseSet("9310")); err != nil {
		t.Fatal(err)
	}
	st, ok := e.d.Shared(port)
	if !ok {
		t.Fatalf("port %d is not shared after the join", port)
	}
	held, due := 0, 0
	for bk, h := range st.Spread.Buckets {
		if want[bk].Slot == 2 {
			due++
			if h.Slot != 2 {
				held++
			}
		}
	}
	if due == 0 {
		t.Fatal("B is due no bucket: the check below would check nothing")
	}
	if held > spread.MaxHeld(2) {
		t.Errorf("A kept back %d of B's %d buckets, at most %d allowed", held, due, spread.MaxHeld(2))
	}
	per := map[int]int{}
	for p := range st.Spread.Pins {
		if per[spread.Bucket(p.Port())]++; per[spread.Bucket(p.Port())] > spread.MaxPinsPerBucket {
			t.Fatalf("bucket %d over the pin bound", spread.Bucket(p.Port()))
		}
	}
	t.Logf("after the join: %d of B's %d buckets held back, %d pins", held, due, len(st.Spread.Pins))
	// SharedIdle later, one pass: the holds have ended, the pins of
	// flows that carried nothing are gone.
	wait.For(t, 20*time.Second, "the holds end after SharedIdle", func() bool {
		e.pass()
		st, _ = e.d.Shared(port)
		return st.Settled
	})
	// B is due 128 of 256 buckets: 300 exchanges put 40% 3.5 sigma below.
	got := share(t, e.sb.Client, hostAddr(port), 150, 40000, 60000, rnd)
	if total := got["A"] + got["B"]; got["B"]*100 < 40*total {
		t.Errorf("after the holds: new connections answered %v: B gets under 40%%", got)
	}
}

// TestSharedPinsFollowTraffic: connections pinned at a join keep their
// pins while they carry traffic, and lose them once the host has seen
// none for SharedIdle (the socket stays open).
func TestSharedPinsFollowTraffic(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	const idle = time.Second
	e.withShared(-1, idle)
	const port = 9320
	ctx := context.Background()
	e.start("A", 1, "40960-41983", "", "9320", port)
	b := e.start("B", 2, "41984-43007", "31000", "", port)
	var flows []*traffic.Flow
	for i := 0; i < 40; i++ {
		flows = append(flows, openFlow(t, e.sb.Client, hostAddr(port), 22000+i*6))
	}
	if err := e.d.SetPorts(ctx, b.c, ephemeral.MustParseSet("31000"), ephemeral.MustParseSet("9320")); err != nil {
		t.Fatal(err)
	}
	st, _ := e.d.Shared(port)
	var talk, quiet []*traffic.Flow
	for _, f := range flows {
		if _, ok := st.Spread.Pins[clientFlow(f.Src)]; ok {
			if len(talk) <= len(quiet) {
				talk = append(talk, f)
			} else {
				quiet = append(quiet, f)
			}
		}
	}
	if len(talk) == 0 || len(quiet) == 0 {
		t.Fatalf("%d pins after the join: the test needs two", len(st.Spread.Pins))
	}
	wait.For(t, 20*time.Second, "the quiet connections' pins go", func() bool {
		for _, f := range talk {
			if got, err := f.Ask("again"); err != nil || got != "A" {
				t.Fatalf("talking connection from %d answered by %q (%v)", f.Src, got, err)
			}
		}
		e.pass()
		st, _ = e.d.Shared(port)
		for _, f := range talk {
			if _, ok := st.Spread.Pins[clientFlow(f.Src)]; !ok {
				t.Fatalf("talking connection from %d lost its pin", f.Src)
			}
		}
		for _, f := range quiet {
			if _, ok := st.Spread.Pins[clientFlow(f.Src)]; ok {
				return false
			}
		}
		return true
	})
	for _, f := range talk {
		if got, err := f.Ask("again"); err != nil || got != "A" {
			t.Errorf("talking connection from %d answered by %q (%v) at the end", f.Src, got, err)
		}
	}
}
