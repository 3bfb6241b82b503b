package tcfilter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestTrafficDrainMarkers: a shared port whose holder A drains: its
// marker node is in the kernel after every bucket node (no packet reaches
// it), A's pinned connections keep reaching it, new connections reach B;
// with every holder draining the buckets hand new connections to the
// host's stack (refused: nothing listens there); a restarted demux reads
// the markers and the refusing buckets back; unsharing removes them.
func TestTrafficDrainMarkers(t *testing.T) {
	w := newWire(t)
	const port = 9292
	a := w.plumb(t, "ca", 1, rg(32768, 33023))
	b := w.plumb(t, "cb", 2, rg(33024, 33279))
	holdPort(t, port, a, b)
	ha, hb := spread.Holder{Slot: a.slot, Target: a.veth}, spread.Holder{Slot: b.slot, Target: b.veth}
	if err := w.eth0D.setShared(port, []spread.Holder{ha}); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(w.s.HostIP.String(), fmt.Sprint(port))
	var conns []*liveConn
	var srcs []uint16
	for i := range 8 {
		l := dialLive(t, w, addr, uint16(50000+i*10))
		conns, srcs = append(conns, l), append(srcs, l.src)
	}
	cur, _ := w.eth0D.Spread(port)
	drainA := map[uint16]bool{a.slot: true}
	flows := func(slot uint16) ([]spread.Flow, bool) {
		if slot == a.slot {
			return fls(srcs...), true
		}
		return nil, true
	}
	plan, err := spread.PlanFacts(port, []spread.Holder{ha, hb}, &cur, spread.Facts{Flows: flows, Draining: drainA})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.eth0D.SetSpread(port, plan); err != nil {
		t.Fatal(err)
	}
	table := w.eth0D.shared[port].table
	marker := "fh " + FormatHandle(drainHandle(table, a.slot)) + " "
	if show := w.tcShow(t, "eth0"); !strings.Contains(show, marker) {
		t.Fatalf("no drain marker %s in the kernel:\n%s", marker, show)
	}
	for _, l := range conns {
		if got, err := l.ask("again"); err != nil || got != "ca" {
			t.Errorf("A's connection from %d answered by %q (%v) while A drains", l.src, got, err)
		}
	}
	newConnFrom := func(ip string, src int) (string, error) {
		var reply string
		err := w.s.Client.Do(func() (err error) {
			reply, err = traffic.Echo(context.Background(), "tcp", addr, "x", traffic.WithSource(net.JoinHostPort(ip, fmt.Sprint(src))), traffic.WithTimeout(2*time.Second))
			return err
		})
		return traffic.ReplyName(reply), err
	}
	newConn := func(src int) (string, error) { return newConnFrom("", src) }
	for i := range 20 {
		if got, err := newConn(40000 + 2*i); err != nil || got != "cb" {
			t.Fatalf("new connection %d answered by %q (%v), want cb", i, got, err)
		}
	}
	// A hostile client: another address of the client side, from the
	// source port of one of A's pinned flows. Pins match the client's
	// address and port: its new connection reaches B, and A's flow from
	// that port still reaches A.
	other := "198.18.1.77" // off the /24: containers reach it through the gateway
	w.s.Client.Run(t, "ip", "addr", "add", other+"/32", "dev", "eth0")
	for i, l := range conns[:4] {
		if got, err := newConnFrom(other, int(l.src)); err != nil || got != "cb" {
			t.Errorf("new connection from %s:%d (A's pinned port) answered by %q (%v), want cb", other, l.src, got, err)
		}
		if got, err := l.ask(fmt.Sprint("after", i)); err != nil || got != "ca" {
			t.Errorf("A's pinned connection from %d answered by %q (%v) after another client used its port", l.src, got, err)
		}
	}

	// Every holder drains: new connections go to the host, which refuses them.
	cur, _ = w.eth0D.Spread(port)
	all := map[uint16]bool{a.slot: true, b.slot: true}
	plan, err = spread.PlanFacts(port, []spread.Holder{ha, hb}, &cur, spread.Facts{Flows: flows, Draining: all})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.eth0D.SetSpread(port, plan); err != nil {
		t.Fatal(err)
	}
	if _, err := newConn(41000); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("new connection with every holder draining: %v, want refused", err)
	}
	if got, err := conns[0].ask("still"); err != nil || got != "ca" {
		t.Errorf("A's connection with every holder draining: %q, %v", got, err)
	}

	// A restarted demux reads markers and refusing buckets back.
	again := NewHostDemux(w.h, w.eth0, "eth0", w.s.HostIP, nil)
	if err := again.Init(); err != nil {
		t.Fatal(err)
	}
	got, ok := again.Spread(port)
	if !ok || !got.Equal(&plan) {
		t.Fatalf("restarted demux: %v, draining %v, %d pins; want draining %v, %d pins", ok, got.Draining, len(got.Pins), plan.Draining, len(plan.Pins))
	}
	if hs := again.SharedHolders(port); !hs[a.slot] || !hs[b.slot] || hs[0] {
		t.Errorf("holders from the kernel: %v", hs)
	}
	if err := again.Unshare(port); err != nil {
		t.Fatal(err)
	}
	if show := w.tcShow(t, "eth0"); strings.Contains(show, marker) {
		t.Errorf("drain marker left after unsharing:\n%s", show)
	}
}
