package tcfilter

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
)

// liveConn is a TCP connection from the client namespace that stays open.
type liveConn struct {
	src  uint16
	c    net.Conn
	r    *bufio.Reader
	name string // who answered first
}

func (l *liveConn) ask(msg string) (string, error) {
	l.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := l.c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := l.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	name, _, _ := strings.Cut(line, " ")
	return name, nil
}

func dialLive(t *testing.T, w *wire, addr string, src uint16) *liveConn {
	t.Helper()
	var c net.Conn
	err := w.s.Client.Do(func() (err error) {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: int(src)},
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
				return serr
			}}
		c, err = d.Dial("tcp4", addr)
		return err
	})
	if err != nil {
		t.Fatalf("connect from port %d: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	l := &liveConn{src: src, c: c, r: bufio.NewReader(c)}
	if l.name, err = l.ask("hello"); err != nil {
		t.Fatalf("first request from port %d: %v", src, err)
	}
	return l
}

// holdPort gives each container port beside its ranges and serves it
// there (each answers with its name).
func holdPort(t *testing.T, port uint16, xs ...*ctr) {
	t.Helper()
	for _, x := range xs {
		if err := x.vf.SetRanges(x.ranges, append(x.ranges, rg(port, port))); err != nil {
			t.Fatal(err)
		}
		serve(t, x.c.Do, x.name, int(port))
	}
}

// TestTrafficSpreadPins joins a third holder to a shared port while 48 TCP
// connections are open: the plan pins the connections whose buckets move,
// every one keeps talking to its container, new connections in the moved
// buckets reach the newcomer, a restarted demux finds the pins, and once
// the connections end the next plan removes them.
func TestTrafficSpreadPins(t *testing.T) {
	w := newWire(t)
	const port = 9191
	a := w.plumb(t, "ca", 1, rg(32768, 33023))
	b := w.plumb(t, "cb", 2, rg(33024, 33279))
	c := w.plumb(t, "cc", 3, rg(33280, 33535))
	slotOf := map[string]uint16{"ca": 1, "cb": 2, "cc": 3}
	holdPort(t, port, a, b, c)
	two := []spread.Holder{{Slot: a.slot, Target: a.veth}, {Slot: b.slot, Target: b.veth}}
	three := append(two, spread.Holder{Slot: c.slot, Target: c.veth})
	if err := w.eth0D.setShared(port, two); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(w.s.HostIP.String(), fmt.Sprint(port))
	var conns []*liveConn
	flows := map[uint16][]uint16{}
	for i := 0; i < 48; i++ {
		l := dialLive(t, w, addr, uint16(50000+i*10)) // buckets 0, 5, 10, ...
		conns = append(conns, l)
		flows[slotOf[l.name]] = append(flows[slotOf[l.name]], l.src)
	}
	cur, ok := w.eth0D.Spread(port)
	if !ok {
		t.Fatal("the shared port is not in the index")
	}
	plan, err := spread.Plan(port, three, &cur, flowsOf(flows, nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Pins) == 0 {
		t.Fatal("no connection's bucket moves to the newcomer: the test proves nothing")
	}
	if err := w.eth0D.SetSpread(port, plan); err != nil {
		t.Fatal(err)
	}
	show := w.tcShow(t, "eth0")
	for p := range plan.Pins {
		h := FormatHandle(MakeU32Handle(w.eth0D.shared[port].table, uint32(spread.Bucket(p.Port())), w.eth0D.shared[port].pinIDs[p]))
		if !strings.Contains(show, "fh "+h+" ") {
			t.Fatalf("pin of %s (%s) not in the kernel:\n%s", p, h, show)
		}
	}
	for _, l := range conns {
		if got, err := l.ask("again"); err != nil || got != l.name {
			t.Errorf("connection from port %d answered by %q (%v) after the join, was %q", l.src, got, err, l.name)
		}
	}
	// A new connection from a free port of a moved bucket reaches the newcomer.
	newcomer := 0
	for p := uint16(50001); p < 50400; p += 2 {
		if _, pinned := plan.Pins[fl(p)]; pinned || plan.Holder(fl(p)).Slot != c.slot {
			continue
		}
		if got := dialLive(t, w, addr, p); got.name != "cc" {
			t.Errorf("new connection from port %d (bucket of the newcomer) answered by %q", p, got.name)
		}
		if newcomer++; newcomer == 5 {
			break
		}
	}
	if newcomer == 0 {
		t.Fatal("no free port in the newcomer's buckets was tried")
	}
	// A restarted demux reads the pins back.
	again := NewHostDemux(w.h, w.eth0, "eth0", w.s.HostIP, nil)
	if err := again.Init(); err != nil {
		t.Fatal(err)
	}
	if got, _ := again.Spread(port); !got.Equal(&plan) {
		t.Fatalf("recovered spread differs: %d pins, want %d", len(got.Pins), len(plan.Pins))
	}
	// The connections end: the next plan settles and removes every pin.
	for _, l := range conns {
		l.c.Close()
	}
	settled, _ := spread.Plan(port, three, &plan, flowsOf(map[uint16][]uint16{1: nil, 2: nil, 3: nil}, nil))
	if err := again.SetSpread(port, settled); err != nil {
		t.Fatal(err)
	}
	want, _ := spread.Assign(port, three)
	if got, _ := again.Spread(port); !got.Settled(&want) {
		t.Fatal("not settled")
	}
	for _, h := range handles(w.tcShow(t, "eth0")) {
		htid, _, nid := SplitU32Handle(parseHandle(t, h))
		if htid >= TableSpreadFirst && htid <= TableSpreadLast && nid != nodeSpread {
			t.Errorf("pin node %s left after settling", h)
		}
	}
	// Control: the same join without looking at flows (setShared) breaks
	// the connections whose buckets move, so the pins above did the work.
	if err := again.setShared(port, two); err != nil {
		t.Fatal(err)
	}
	var ctl []*liveConn
	for i := 0; i < 48; i++ {
		ctl = append(ctl, dialLive(t, w, addr, uint16(52000+i*10)))
	}
	if err := again.setShared(port, three); err != nil {
		t.Fatal(err)
	}
	broken := 0
	for _, l := range ctl {
		if got, err := l.ask("again"); err != nil || got != l.name {
			broken++
		}
	}
	if broken == 0 {
		t.Error("a stateless join broke no connection: the pinned join above proved nothing")
	}
	t.Logf("pinned join: %d pins, 0 of %d connections broken; stateless join: %d of %d broken", len(plan.Pins), len(conns), broken, len(ctl))
	if err := again.setShared(port, nil); err != nil {
		t.Fatal(err)
	}
}

func parseHandle(t *testing.T, s string) uint32 {
	t.Helper()
	var htid, bkt, nid uint32
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		t.Fatalf("handle %q", s)
	}
	for i, p := range parts {
		var v uint32
		if p != "" {
			if _, err := fmt.Sscanf(p, "%x", &v); err != nil {
				t.Fatalf("handle %q: %v", s, err)
			}
		}
		switch i {
		case 0:
			htid = v
		case 1:
			bkt = v
		default:
			nid = v
		}
	}
	return MakeU32Handle(htid, bkt, nid)
}

// TestTrafficSharedExclusiveSwitch moves a port between exclusive and
// shared for one container the way the data plane's SetPorts does
// (make-before-break): the old range and the new spread coexist for a
// moment, which only the port's sole holder may do, and traffic reaches the
// container at every step.
func TestTrafficSharedExclusiveSwitch(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33023), rg(9292, 9293))
	b := w.plumb(t, "cb", 2, rg(33024, 33279))
	serve(t, a.c.Do, "ca", 9292)
	addr := net.JoinHostPort(w.s.HostIP.String(), "9292")
	reach := func(step string) {
		t.Helper()
		for _, nw := range []string{"tcp", "udp"} {
			if got, err := echo(w.s.Client.Do, nw, addr); err != nil || got != "ca" {
				t.Fatalf("%s: %s to 9292 answered by %q (%v)", step, nw, got, err)
			}
		}
	}
	ha, hb := spread.Holder{Slot: a.slot, Target: a.veth}, spread.Holder{Slot: b.slot, Target: b.veth}
	reach("exclusive")
	// exclusive 9292-9293 -> exclusive 9293 + shared 9292
	if err := w.eth0D.AddRanges(1, a.veth, []ephemeral.Range{rg(9293, 9293)}); err != nil {
		t.Fatal(err)
	}
	if err := w.eth0D.setShared(9292, []spread.Holder{ha, hb}); !errors.Is(err, ErrOverlap) {
		t.Fatalf("sharing with another holder a port still routed exclusively: %v", err)
	}
	if err := w.eth0D.setShared(9292, []spread.Holder{ha}); err != nil {
		t.Fatalf("the range's own slot could not share its port: %v", err)
	}
	reach("range and spread")
	if _, err := w.eth0D.DelRanges(1, []ephemeral.Range{rg(9292, 9293)}); err != nil {
		t.Fatal(err)
	}
	reach("shared")
	if err := w.eth0D.AddRanges(2, b.veth, []ephemeral.Range{rg(9292, 9292)}); !errors.Is(err, ErrOverlap) {
		t.Fatalf("another slot took a shared port: %v", err)
	}
	// and back: exclusive 9292-9293 again
	if err := w.eth0D.AddRanges(1, a.veth, []ephemeral.Range{rg(9292, 9293)}); err != nil {
		t.Fatalf("the sole holder could not take its shared port back: %v", err)
	}
	reach("spread and range")
	if err := w.eth0D.setShared(9292, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := w.eth0D.DelRanges(1, []ephemeral.Range{rg(9293, 9293)}); err != nil {
		t.Fatal(err)
	}
	reach("exclusive again")
}

// BenchmarkShared times making a port shared by two holders and unsharing
// it (share-ms: 256 bucket nodes plus the link), and a third holder joining
// and leaving with no live flows (join-µs, leave-µs: ~1/3 of the buckets
// replaced each way).
func BenchmarkShared(b *testing.B) {
	e := newKernelEnv(b, 3)
	d := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil)
	if err := d.Init(); err != nil {
		b.Fatal(err)
	}
	two := []spread.Holder{{Slot: 1, Target: e.targets[0]}, {Slot: 2, Target: e.targets[1]}}
	three := append(two, spread.Holder{Slot: 3, Target: e.targets[2]})
	var share, join, leave time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := d.setShared(9000, two); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := d.setShared(9000, three); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := d.setShared(9000, two); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		if err := d.setShared(9000, nil); err != nil {
			b.Fatal(err)
		}
		share += t1.Sub(t0)
		join += t2.Sub(t1)
		leave += t3.Sub(t2)
	}
	b.ReportMetric(float64(share.Microseconds())/1000/float64(b.N), "share-ms")
	b.ReportMetric(float64(join.Microseconds())/float64(b.N), "join-µs")
	b.ReportMetric(float64(leave.Microseconds())/float64(b.N), "leave-µs")
}
