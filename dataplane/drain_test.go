package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// TestDrainHandoff: A holds port 9000 exclusively with 40 long-lived TCP
// connections and a UDP flow. The port becomes shared, B joins it and A
// drains: every old flow keeps reaching A, every new connection reaches
// B (none A, no reset). The kernel's marker says A drains. Once A's
// flows end the reconciler removes its pins; A's teardown leaves B
// alone with nothing of A's slot on the host demuxes. Then B drains with
// no successor: a new connection is refused by the host (RST).
func TestDrainHandoff(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	e.withReconcile(-1) // passes run by hand below
	const port = 9000
	ctx := context.Background()
	pa := e.spawn("A", []uint16{port}, true)
	a := ctr{pa, e.spec("A", pa, 1, "40960-41983", "9000", "")}
	pl := e.setup(a.c)
	a.c.Pin, a.c.PinOwned = pl.Mount, pl.PinOwned

	var flows []*traffic.Flow
	for i := 0; i < 40; i++ {
		f := openFlow(t, e.sb.Client, hostAddr(port), 20000+i*7)
		if f.Name != "A" {
			t.Fatalf("connection %d answered by %q before the handoff", i, f.Name)
		}
		flows = append(flows, f)
	}
	uf := traffic.OpenUDPFlow(t, pa.Do, e.sb.Client.Do, "A", sandbox.HostIP, sandbox.ClientIP, port, 33333)
	if got, err := uf.Ask(); err != nil || got != "A" {
		t.Fatalf("UDP flow answered by %q (%v) before the handoff", got, err)
	}

	// The handoff: A's port becomes shared (its one holder), B joins, A drains.
	start := time.Now()
	if err := e.d.SetPorts(ctx, a.c, ephemeral.Set{}, ephemeral.MustParseSet("9000")); err != nil {
		t.Fatal(err)
	}
	a.c.Ports, a.c.Shared = ephemeral.Set{}, ephemeral.MustParseSet("9000")
	b := e.start("B", 2, "41984-43007", "", "9000", port)
	if err := e.d.Drain(ctx, a.c, port, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("handoff (share, join, drain) took %v", time.Since(start))
	if !e.d.eth0.Draining(port)[1] || !e.d.lo.Draining(port)[1] {
		t.Fatal("no drain marker for A's slot in the kernel")
	}
	ds := e.d.DrainState(a.c.ID)
	if len(ds) != 1 || ds[0].Port != port || ds[0].LiveFlows < 40 {
		t.Fatalf("DrainState(A) = %+v, want port %d with >= 40 live flows", ds, port)
	}
	for _, f := range flows {
		if got, err := f.Ask("again"); err != nil || got != "A" {
			t.Errorf("connection from port %d answered by %q (%v) after the handoff", f.Src, got, err)
		}
	}
	if got, err := uf.Ask(); err != nil || got != "A" {
		t.Errorf("UDP flow answered by %q (%v) after the handoff", got, err)
	}
	newAt := map[string]int{}
	for i := 0; i < 100; i++ {
		got, err := echo(e.sb.Client, "tcp", hostAddr(port), traffic.WithSource(clientAddr(40000+i)))
		if err != nil {
			t.Fatalf("new connection %d after the handoff: %v", i, err)
		}
		newAt[got]++
	}
	if newAt["B"] != 100 {
		t.Fatalf("new connections after the handoff: %v, want all 100 at B", newAt)
	}
	// A hostile client: another address on the client side using the
	// source ports of A's live flows. Pins match the client's address and
	// port (read from A's sockets): its new connections reach B, and A's
	// flows from those ports still reach A.
	const other = "198.18.1.77" // off the /24: containers reach it through the gateway
	e.sb.Client.Run(t, "ip", "addr", "add", other+"/32", "dev", "eth0")
	for _, f := range flows[:10] {
		got, err := echo(e.sb.Client, "tcp", hostAddr(port), traffic.WithSource(net.JoinHostPort(other, fmt.Sprint(f.Src))))
		if err != nil || got != "B" {
			t.Errorf("new connection from %s:%d (a source port A's flow pins) answered by %q (%v), want B", other, f.Src, got, err)
		}
		if got, err := f.Ask("again"); err != nil || got != "A" {
			t.Errorf("A's connection from port %d answered by %q (%v) after another client used its port", f.Src, got, err)
		}
	}

	// A's flows end; reconciler passes drop its pins.
	for _, f := range flows {
		f.Close()
	}
	uf.Close()
	var rerr error
	wait.For(t, 20*time.Second, "A's pins to go after its flows ended", func() bool {
		e.d.mu.Lock()
		_, _, rerr = e.d.reconcileShared()
		e.d.mu.Unlock()
		ds := e.d.DrainState(a.c.ID)
		return rerr == nil && len(ds) == 1 && ds[0].LiveFlows == 0
	})
	if _, err := e.d.Teardown(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	st, ok := e.d.Shared(port)
	if !ok || len(st.Holders) != 1 || st.Holders[0].Slot != 2 || !st.Settled {
		t.Fatalf("after A's cleanup: %+v", st)
	}
	for _, dm := range e.d.demuxes() {
		if hs := dm.d.SharedHolders(port); len(hs) != 1 || !hs[2] {
			t.Errorf("%s demux: holders of %d %v, want B's slot alone", dm.name, port, hs)
		}
	}
	if strings.Contains(e.tcShow("eth0"), "flowid 1:1 ") {
		t.Errorf("a node of A's slot is left on eth0:\n%s", e.tcShow("eth0"))
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(port), "B")

	// B drains with no successor: new connections are refused by the host.
	if err := e.d.Drain(ctx, b.c, port, true); err != nil {
		t.Fatal(err)
	}
	_, err := echo(e.sb.Client, "tcp", hostAddr(port), traffic.WithSource(clientAddr(45000)))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("new connection to a port whose last holder drains: %v, want connection refused", err)
	}
	if err := e.d.Drain(ctx, b.c, port, false); err != nil {
		t.Fatal(err)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(port), "B", traffic.WithSource(clientAddr(45002)))
}
