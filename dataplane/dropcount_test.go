package dataplane

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// sendUnowned makes c send one datagram from a port it does not own.
func sendUnowned(t *testing.T, c ctr) {
	t.Helper()
	if err := c.proc.Do(func() error {
		u, err := net.DialUDP("udp4", &net.UDPAddr{Port: 45000}, &net.UDPAddr{IP: sandbox.ClientIP, Port: 9})
		if err != nil {
			return err
		}
		defer u.Close()
		_, err = u.Write([]byte("not my port"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// dropPort makes c send one datagram from a port it does not own and
// waits until Stats counts it (want: the port count then).
func dropPort(t *testing.T, e *env, c ctr, want uint64) {
	t.Helper()
	sendUnowned(t, c)
	wait.For(t, 5*time.Second, "the datagram counted as port", func() bool {
		st, err := e.d.Stats(context.Background(), c.c)
		if err != nil {
			t.Fatal(err)
		}
		return st.Dropped[tcfilter.DropPort] == want
	})
}

// TestDropCountsWithoutNetlink: Stats (Usage) and DropTotals (the
// Prometheus counters) read the drop counts with no netlink request at all,
// so they never wait for rtnl behind setups and teardowns: with both of
// the data plane's netlink handles pointed at an empty namespace (where
// every link, filter and action lookup would fail) they still return the
// right counts, the attacker's counted and the other container's zero.
func TestDropCountsWithoutNetlink(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	if !e.info.Features[plane.FeatureClsBPF] {
		t.Skip("the kernel does not load cls_bpf programs")
	}
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	b := e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	dropPort(t, e, a, 1)

	empty, err := nshandle.New()
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	nh, err := empty.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	e.d.mu.Lock()
	h, hr := e.d.h, e.d.hr
	e.d.h, e.d.hr = nh, nh
	e.d.mu.Unlock()
	ctx := context.Background()
	sa, errA := e.d.Stats(ctx, a.c)
	sb, errB := e.d.Stats(ctx, b.c)
	totals, errT := e.d.DropTotals(ctx)
	e.d.mu.Lock()
	e.d.h, e.d.hr = h, hr
	e.d.mu.Unlock()
	if errA != nil || errB != nil || errT != nil {
		t.Fatalf("reads with no usable netlink handle: %v / %v / %v", errA, errB, errT)
	}
	if sa.Dropped[tcfilter.DropPort] != 1 || len(sa.Dropped) != len(tcfilter.DropReasons) {
		t.Errorf("A's drops %v, want port 1 and every reason", sa.Dropped)
	}
	for r, n := range sb.Dropped {
		if n != 0 {
			t.Errorf("B (not attacking) counts %d %s drops", n, r)
		}
	}
	if totals[tcfilter.DropPort] != 1 {
		t.Errorf("totals %v, want port 1", totals)
	}
}

// TestTeardownReleasesDropCounts: a torn-down container's entries leave
// the count map (its ifindex may be handed out again), its counts stay in
// the totals, and a new container starts from zero.
func TestTeardownReleasesDropCounts(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	if !e.info.Features[plane.FeatureClsBPF] {
		t.Skip("the kernel does not load cls_bpf programs")
	}
	ctx := context.Background()
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	veth := e.d.ctrs[a.c.ID].veth
	dropPort(t, e, a, 1)
	if all, err := e.d.drops.All(); err != nil || all[veth][tcfilter.DropPort] != 1 {
		t.Fatalf("count map before teardown: %v (%v)", all, err)
	}
	if _, err := e.d.Teardown(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if all, err := e.d.drops.All(); err != nil || all[veth] != nil {
		t.Errorf("entries of the torn-down veth %d left: %v (%v)", veth, all[veth], err)
	}
	if totals, err := e.d.DropTotals(ctx); err != nil || totals[tcfilter.DropPort] != 1 {
		t.Errorf("totals after teardown %v (%v), want the departed port drop kept", totals, err)
	}
	b := e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	if st, err := e.d.Stats(ctx, b.c); err != nil || st.Dropped[tcfilter.DropPort] != 0 {
		t.Errorf("a new container's drops %v (%v), want zero", st.Dropped, err)
	}
	dropPort(t, e, b, 1)
}
