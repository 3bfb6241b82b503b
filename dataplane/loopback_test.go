package dataplane

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// TestHostLoopbackPorts: with the daemon's port space (ContainerPorts), a
// container reaches only the host loopback ports the operator opened
// (HostLoopbackPorts, then SetHostLoopbackPorts); the others are dropped
// and counted as loopback. Containers keep reaching each other and the
// host keeps reaching them through 127.0.0.1. A data plane restarted with
// other open ports re-installs the veths' table (their alias tag differs).
func TestHostLoopbackPorts(t *testing.T) {
	checkRootUnchanged(t)
	sb := sandbox.New(t)
	e := &env{t: t, sb: sb, ops: new(atomic.Int64), errs: new(atomic.Int64)}
	open := func(cfg string) *DataPlane {
		d, err := New(Config{HostNS: sb.Host.Path, Logger: quietLogger(t),
			ContainerPorts:    ephemeral.MustParseSet("31000-31999,40960-45055"),
			HostLoopbackPorts: ephemeral.MustParseSet(cfg)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if e.info, err = d.PrepareHost(context.Background()); err != nil {
			t.Fatal(err)
		}
		return d
	}
	e.d = open("7001")
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	b := e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	serveIn(t, e.sb.Host, loAddr(7001), "h7001")
	serveIn(t, e.sb.Host, "127.0.0.53:7002", "h7002")
	closed := func(p doer, addr string) {
		t.Helper()
		for _, nw := range []string{"tcp", "udp"} {
			if got, err := echo(p, nw, addr); err == nil {
				t.Errorf("%s %s answered by %q: not opened", nw, addr, got)
			}
		}
	}
	before, err := e.d.DropTotals(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, a.proc, nw, loAddr(7001), "h7001")
		mustEcho(t, a.proc, nw, loAddr(31010), "B")
		mustEcho(t, b.proc, nw, loAddr(31000), "A")
		mustEcho(t, e.sb.Host, nw, loAddr(31000), "A")
	}
	closed(a.proc, "127.0.0.53:7002")
	after, err := e.d.DropTotals(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := after[tcfilter.DropLoopback] - before[tcfilter.DropLoopback]; n < 2 {
		t.Errorf("loopback drops rose by %d, want >= 2", n)
	}
	if got := e.d.HostLoopbackPorts().String(); got != "7001" {
		t.Errorf("HostLoopbackPorts %q, want 7001", got)
	}

	// a reload opens 7002 instead
	if err := e.d.SetHostLoopbackPorts(context.Background(), ephemeral.MustParseSet("7002")); err != nil {
		t.Fatal(err)
	}
	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, b.proc, nw, "127.0.0.53:7002", "h7002")
		mustEcho(t, a.proc, nw, loAddr(31010), "B")
	}
	closed(b.proc, loAddr(7001))
	// the veths' aliases carry the new tag (a restart trusts them)
	for _, c := range []ctr{a, b} {
		l, err := e.d.h.LinkByName(plane.VethName(c.c.ID))
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := parseAlias(l.Attrs().Alias); !ok || m.ID != c.c.ID || m.Loop != e.d.loopTag() || m.Layout != tcfilter.VethLayout {
			t.Errorf("alias of %s after the reload: %q", c.c.ID, l.Attrs().Alias)
		}
	}

	// a restart with 7001 open again: Adopt brings the veths in line
	e.d.Close()
	e.d = open("7001")
	for _, c := range []ctr{a, b} {
		if err := e.d.Adopt(context.Background(), c.c); err != nil {
			t.Fatalf("adopt %s: %v", c.c.ID, err)
		}
	}
	wait.Until(10*time.Second, func() bool {
		got, err := echo(a.proc, "tcp", loAddr(7001))
		return err == nil && got == "h7001"
	}) // mustEcho below fails the test naming what came back
	mustEcho(t, a.proc, "udp", loAddr(7001), "h7001")
	closed(a.proc, "127.0.0.53:7002")
}
