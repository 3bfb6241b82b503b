package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// clientFlow is the flow from the sandbox client's source port src, as a
// pin matches it.
func clientFlow(src int) spread.Flow {
	a, _ := netip.AddrFromSlice(sandbox.ClientIP.To4())
	return netip.AddrPortFrom(a, uint16(src))
}

// openFlow connects from the client's port src to addr and learns who answers.
func openFlow(t testing.TB, ns doer, addr string, src int) *traffic.Flow {
	t.Helper()
	return traffic.OpenFlow(t, ns.Do, &net.TCPAddr{Port: src}, addr)
}

// withReconcile replaces the env's data plane by one whose shared-port
// reconciler runs every `every` (negative: never).
func (e *env) withReconcile(every time.Duration) {
	e.t.Helper()
	d, err := New(Config{HostNS: e.sb.Host.Path, Logger: quietLogger(e.t), SharedReconcile: every})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { d.Close() })
	if _, err := d.PrepareHost(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.d = d
}

// TestSharedJoinLeaveKeepsFlows: 60 TCP connections are open to a port
// shared by A, B and C. D joins: every connection keeps its container and
// new connections reach D. B leaves: exactly B's connections break. Once
// the connections end, one reconciler pass removes every pin.
func TestSharedJoinLeaveKeepsFlows(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	e.withReconcile(-1) // passes run by hand below
	const port = 9000
	ctx := context.Background()
	a := e.start("A", 1, "40960-41983", "", "9000", port)
	b := e.start("B", 2, "41984-43007", "", "9000", port)
	c := e.start("C", 3, "43008-44031", "", "9000", port)
	d := e.start("D", 4, "44032-45055", "31000", "", port) // not a holder yet

	var flows []*traffic.Flow
	count := map[string]int{}
	for i := 0; i < 60; i++ {
		f := openFlow(t, e.sb.Client, hostAddr(port), 20000+i*6)
		flows = append(flows, f)
		count[f.Name]++
	}
	if count["A"] == 0 || count["B"] == 0 || count["C"] == 0 || count["D"] != 0 {
		t.Fatalf("60 connections answered by %v", count)
	}

	// D joins (an update of a running container).
	if err := e.d.SetPorts(ctx, d.c, ephemeral.MustParseSet("31000"), ephemeral.MustParseSet("9000")); err != nil {
		t.Fatal(err)
	}
	d.c.Shared = ephemeral.MustParseSet("9000")
	st, ok := e.d.Shared(port)
	if !ok || len(st.Holders) != 4 || len(st.Spread.Pins) == 0 || st.Settled {
		t.Fatalf("after the join: %d holders, %d pins, settled %v: the join moved no bucket with a live flow", len(st.Holders), len(st.Spread.Pins), st.Settled)
	}
	for _, f := range flows {
		if got, err := f.Ask("again"); err != nil || got != f.Name {
			t.Errorf("connection from port %d answered by %q (%v) after D joined, was %q", f.Src, got, err, f.Name)
		}
	}
	spread := map[string]int{}
	for i := 0; i < 100; i++ {
		got, err := echo(e.sb.Client, "tcp", hostAddr(port), traffic.WithSource("198.18.0.2:"+strconv.Itoa(30000+2*i)))
		if err != nil {
			t.Fatal(err)
		}
		spread[got]++
	}
	if spread["D"] < 10 {
		t.Errorf("new connections after the join: %v; D gets too few", spread)
	}

	// B leaves: only its connections break.
	if _, err := e.d.Teardown(ctx, b.c); err != nil {
		t.Fatal(err)
	}
	broken := 0
	for _, f := range flows {
		got, err := f.Ask("again")
		switch {
		case f.Name == "B" && err == nil:
			t.Errorf("B's connection from port %d still answered by %q after B left", f.Src, got)
		case f.Name == "B":
			broken++
		case err != nil || got != f.Name:
			t.Errorf("connection from port %d answered by %q (%v) after B left, was %q", f.Src, got, err, f.Name)
		}
	}
	if broken != count["B"] {
		t.Errorf("%d of B's %d connections broke", broken, count["B"])
	}

	// The connections end (the servers' sockets go through CLOSE_WAIT and
	// LAST_ACK, which still count as live); reconciler passes settle the port.
	for _, f := range flows {
		f.Close()
	}
	pass := 0
	wait.For(t, 2*time.Second, "the port settled by reconciler passes", func() bool {
		pass++
		e.d.mu.Lock()
		changed, unsettled, err := e.d.reconcileShared()
		e.d.mu.Unlock()
		if err != nil || changed > 1 || unsettled > 1 {
			t.Fatalf("reconciler pass %d: changed %d, unsettled %d, %v", pass, changed, unsettled, err)
		}
		return unsettled == 0
	})
	if st, _ := e.d.Shared(port); !st.Settled || len(st.Holders) != 3 {
		t.Fatalf("not settled after the flows ended: %d pins", len(st.Spread.Pins))
	}
	if show := e.tcShow("lo"); strings.Count(show, "flowid 1:") == 0 {
		t.Fatal("lo demux lost the shared port")
	}
	for _, x := range []ctr{a, c, d} {
		e.d.Teardown(ctx, x.c)
	}
	if _, ok := e.d.Shared(port); ok {
		t.Error("port still shared after every holder left")
	}
}

// TestSharedReconcilerRuns: the reconciler goroutine settles a port on its
// own once the pinned flows end, and Close stops it.
func TestSharedReconcilerRuns(t *testing.T) {
	e := newEnv(t)
	e.withReconcile(100 * time.Millisecond)
	const port = 9100
	ctx := context.Background()
	e.start("A", 1, "40960-41983", "", "9100", port)
	b := e.start("B", 2, "41984-43007", "31000", "", port)
	var flows []*traffic.Flow
	for i := 0; i < 40; i++ {
		flows = append(flows, openFlow(t, e.sb.Client, hostAddr(port), 21000+i*6))
	}
	if err := e.d.SetPorts(ctx, b.c, ephemeral.MustParseSet("31000"), ephemeral.MustParseSet("9100")); err != nil {
		t.Fatal(err)
	}
	// While the flows live, passes keep their pins. The time is what is
	// under test: four periods of the reconciler (it has no pass count to
	// wait for), after which the pins must all still be there.
	time.Sleep(400 * time.Millisecond)
	st, _ := e.d.Shared(port)
	if st.Settled || len(st.Spread.Pins) == 0 {
		t.Fatalf("pins gone while their flows live: settled %v, %d pins", st.Settled, len(st.Spread.Pins))
	}
	for _, f := range flows {
		if got, err := f.Ask("again"); err != nil || got != "A" {
			t.Errorf("connection from %d answered by %q (%v)", f.Src, got, err)
		}
		f.Close()
	}
	wait.For(t, 5*time.Second, "the reconciler settles the port after the flows ended", func() bool {
		st, _ := e.d.Shared(port)
		return st.Settled
	})
	done := e.d.reconcileDone
	if err := e.d.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("Close returned with the reconciler still running")
	}
}

// TestSetPortsExclusiveSharedSwitch moves a port of a running container
// between exclusive and shared in one SetPorts each way (its old exclusive
// range covered the port: the make-before-break order needs the demux to
// let the port's only holder keep both for a moment), with traffic
// checked after each change; going back to exclusive while another holder
// shares the port fails and changes nothing.
func TestSetPortsExclusiveSharedSwitch(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	ctx := context.Background()
	a := e.start("A", 4, "40960-41983", "31000-31001", "", 31000, 31001)
	both := func(want string) {
		t.Helper()
		for _, nw := range []string{"tcp", "udp"} {
			mustEcho(t, e.sb.Client, nw, hostAddr(31000), want)
			mustEcho(t, e.sb.Client, nw, hostAddr(31001), "A")
		}
	}
	both("A")
	if err := e.d.SetPorts(ctx, a.c, ephemeral.MustParseSet("31001"), ephemeral.MustParseSet("31000")); err != nil {
		t.Fatalf("exclusive -> shared: %v", err)
	}
	a.c.Ports, a.c.Shared = ephemeral.MustParseSet("31001"), ephemeral.MustParseSet("31000")
	both("A")
	if st, ok := e.d.Shared(31000); !ok || len(st.Holders) != 1 || st.Holders[0].Slot != 4 {
		t.Fatalf("31000 not shared by A alone: %+v", st)
	}

	// B shares it too; A cannot take it back exclusively now.
	b := e.start("B", 5, "41984-43007", "", "31000", 31000)
	before := e.hostFilters()
	err := e.d.SetPorts(ctx, a.c, ephemeral.MustParseSet("31000-31001"), ephemeral.Set{})
	if !errors.Is(err, tcfilter.ErrOverlap) {
		t.Fatalf("exclusive over a port B shares: %v", err)
	}
	if after := e.hostFilters(); after != before {
		t.Fatalf("failed SetPorts changed the host filters:\n%s", lineDiff(before, after))
	}
	if _, err := e.d.Teardown(ctx, b.c); err != nil {
		t.Fatal(err)
	}
	if err := e.d.SetPorts(ctx, a.c, ephemeral.MustParseSet("31000-31001"), ephemeral.Set{}); err != nil {
		t.Fatalf("shared -> exclusive: %v", err)
	}
	both("A")
	if _, ok := e.d.Shared(31000); ok {
		t.Error("31000 still shared")
	}
}

// TestSharedJoinPinsLateFlows opens a connection in the moment between the
// reading of the holders' sockets and the move of the buckets (the test
// hook runs there), from a source port whose bucket moves to the joining
// holder: the second reading after the move pins it, so it keeps talking
// to the holder that accepted it.
func TestSharedJoinPinsLateFlows(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	e.withReconcile(-1)
	const port = 9200
	ctx := context.Background()
	e.start("A", 1, "40960-41983", "", "9200", port)
	b := e.start("B", 2, "41984-43007", "31000", "", port)
	want, err := spread.Assign(port, []spread.Holder{{Slot: 1, Target: 1}, {Slot: 2, Target: 2}})
	if err != nil {
		t.Fatal(err)
	}
	src := 0
	for p := 26000; src == 0; p += 2 {
		if want[spread.Bucket(uint16(p))].Slot == 2 {
			src = p
		}
	}
	var late *traffic.Flow
	e.d.planned = func(uint16) { late = openFlow(t, e.sb.Client, hostAddr(port), src) }
	err = e.d.SetPorts(ctx, b.c, ephemeral.MustParseSet("31000"), ephemeral.MustParseSet("9200"))
	e.d.planned = nil
	if err != nil {
		t.Fatal(err)
	}
	if late == nil || late.Name != "A" {
		t.Fatalf("the connection opened during the change was not answered by A first: %+v", late)
	}
	st, _ := e.d.Shared(port)
	if h, ok := st.Spread.Pins[clientFlow(src)]; !ok || h.Slot != 1 {
		t.Fatalf("source port %d (bucket moved to B) not pinned to A: %v", src, st.Spread.Pins)
	}
	if got, err := late.Ask("again"); err != nil || got != "A" {
		t.Errorf("the late connection answered by %q (%v) after the move", got, err)
	}
	// A new connection from the next port of that bucket reaches B.
	if got, err := echo(e.sb.Client, "tcp", hostAddr(port), traffic.WithSource("198.18.0.2:"+strconv.Itoa(src+512))); err != nil || got != "B" {
		t.Errorf("new connection in the moved bucket answered by %q (%v), want B", got, err)
	}
}

// BenchmarkSharedJoinLeave times a running container joining a shared port
// (SetPorts adding it) and leaving it again, with 1 and 15 holders present
// and no connections open (join-ms, leave-ms), and how long reading one
// holder's live flows takes (read-ms: the sock_diag dumps of nsstats.Conns
// inside its namespace; a join reads each staying holder twice) and how
// long reading the last use of the port's filters takes (use-ms: a dump of
// eth0's and of lo's ingress filters, once per change and reconciler
// pass).
func BenchmarkSharedJoinLeave(b *testing.B) {
	for _, present := range []int{1, 15} {
		b.Run(fmt.Sprintf("holders=%d", present), func(b *testing.B) {
			e := newEnv(b)
			e.withReconcile(-1)
			const port = 9300
			ctx := context.Background()
			for i := 0; i < present; i++ {
				e.start(fmt.Sprintf("H%d", i), uint16(i+1), fmt.Sprintf("%d-%d", 40960+i*256, 40960+i*256+255), "", "9300", port)
			}
			j := e.start("J", 100, "49152-49407", "31000", "", port)
			var join, leave, read, use time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := e.d.SetPorts(ctx, j.c, ephemeral.MustParseSet("31000"), ephemeral.MustParseSet("9300")); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				j.c.Shared = ephemeral.MustParseSet("9300")
				if err := e.d.SetPorts(ctx, j.c, ephemeral.MustParseSet("31000"), ephemeral.Set{}); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				j.c.Shared = ephemeral.Set{}
				e.d.mu.Lock()
				fc := e.d.newFlowCache(port)
				fc.source(port)(1)
				e.d.mu.Unlock()
				t3 := time.Now()
				e.d.mu.Lock()
				e.d.spreadUse(port)
				e.d.mu.Unlock()
				join += t1.Sub(t0)
				leave += t2.Sub(t1)
				read += t3.Sub(t2)
				use += time.Since(t3)
			}
			b.ReportMetric(float64(join.Microseconds())/1000/float64(b.N), "join-ms")
			b.ReportMetric(float64(leave.Microseconds())/1000/float64(b.N), "leave-ms")
			b.ReportMetric(float64(read.Microseconds())/1000/float64(b.N), "read-ms")
			b.ReportMetric(float64(use.Microseconds())/1000/float64(b.N), "use-ms")
		})
	}
}
