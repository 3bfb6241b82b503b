package tcfilter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestLimitValidate(t *testing.T) {
	for _, c := range []struct {
		l  Limit
		ok bool
	}{
		{Limit{}, true},
		{Limit{Rate: 2_000_000}, true},
		{Limit{Rate: 2_000_000, Ceil: 4_000_000, Burst: 100_000}, true},
		{Limit{Rate: 2_000_000, Ceil: 2_000_000}, true},
		{Limit{Rate: MinRate}, true},
		{Limit{Rate: MinRate - 1}, false},
		{Limit{Burst: 10000}, false},
		{Limit{Ceil: 10000}, false},
		{Limit{Rate: 2_000_000, Ceil: 1_000_000}, false},
		{Limit{Rate: 2_000_000, Burst: 100}, false},
		{Limit{Rate: 1000, Burst: 61_000}, false},
		{Limit{Rate: 1 << 32}, true},
		{Limit{Rate: 1 << 33, Ceil: 1 << 34}, true},
		{Limit{Rate: 1000, Burst: 60_000}, true},
		{Limit{Rate: 1 << 63}, false},
	} {
		err := c.l.Validate()
		if (err == nil) != c.ok {
			t.Errorf("%+v.Validate() = %v, want ok=%v", c.l, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrBadLimit) {
			t.Errorf("%+v: %v does not wrap ErrBadLimit", c.l, err)
		}
	}
}

func TestLimitClassAndQueue(t *testing.T) {
	l := Limit{Rate: 2_000_000}
	c := l.class(7)
	if c.Rate != 2_000_000 || c.Ceil != 2_000_000 || c.Buffer != c.Cbuffer || c.Buffer == 0 {
		t.Errorf("no ceil: class %+v, want ceil = rate and cburst = burst", c)
	}
	if got := l.EffectiveBurst(); got != 64<<10 {
		t.Errorf("default burst at 2MB/s = %d, want 64KiB", got)
	}
	if got := (Limit{Rate: 100_000_000}).EffectiveBurst(); got != 1_000_000 {
		t.Errorf("default burst at 100MB/s = %d, want 10 ms = 1MB", got)
	}
	p := Limit{Rate: 2_000_000, Ceil: 8_000_000}.class(7)
	if p.Ceil != 8_000_000 || p.Cbuffer >= p.Buffer {
		t.Errorf("ceil: class %+v, want ceil 8MB/s with a small cburst", p)
	}
	if q := (Limit{Rate: 2_000_000}).QueueBytes(); q != 200_000 {
		t.Errorf("queue at 2MB/s = %d, want 100 ms = 200000", q)
	}
	if q := (Limit{Rate: 100_000}).QueueBytes(); q != minQueue {
		t.Errorf("queue at 100kB/s = %d, want the floor %d", q, minQueue)
	}
	if q := (Limit{Rate: 10_000_000_000}).QueueBytes(); q != maxQueue {
		t.Errorf("queue at 10GB/s = %d, want the ceiling %d", q, maxQueue)
	}
	// the burst read back from the kernel's buffer time is the burst set
	st := ShapeState{Class: Limit{Rate: 2_000_000, Burst: 300_000}.class(1)}
	if got := st.Limit(); got.Rate != 2_000_000 || got.Ceil != 0 || got.Burst < 299_000 || got.Burst > 301_000 {
		t.Errorf("read back %+v, want rate 2MB/s burst ~300000", got)
	}
}

// shapeEnv is a sandbox host with a veth pair to shape.
func shapeEnv(t *testing.T) (*kernelEnv, Shaper, netns.NsHandle) {
	e := newKernelEnv(t, 1)
	fd, err := netns.GetFromPath(e.s.Host.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fd.Close() })
	return e, Shaper{H: e.h, NS: int(fd), Link: e.targets[0], Leaf: LeafFIFO}, fd
}

func TestShaperKernel(t *testing.T) {
	e, s, _ := shapeEnv(t)
	show := func() string {
		return e.s.Host.Run(t, "tc", "qdisc", "show", "dev", "tgt0") + e.s.Host.Run(t, "tc", "class", "show", "dev", "tgt0")
	}
	if ok, err := s.InSync(Limit{}); err != nil || !ok {
		t.Fatalf("fresh device: InSync(none) = %v, %v", ok, err)
	}
	l := Limit{Rate: 2_000_000}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	out := show()
	for _, want := range []string{
		"qdisc htb 1: root", "default 0x1",
		"qdisc bfifo 10: parent 1:1 limit 200000b",
		"class htb 1:1 root leaf 10: prio 0 rate 16Mbit ceil 16Mbit burst 64Kb cburst 64Kb",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("after Apply(2MB/s), tc shows no %q:\n%s", want, out)
		}
	}
	if ok, err := s.InSync(l); err != nil || !ok {
		t.Errorf("InSync(applied) = %v, %v", ok, err)
	}
	if ok, _ := s.InSync(Limit{Rate: 4_000_000}); ok {
		t.Error("InSync(other rate) = true")
	}
	st, err := s.Read()
	if err != nil || !st.Present || st.Leaf != "bfifo" || st.Limit().Rate != 2_000_000 {
		t.Errorf("Read = %+v, %v", st, err)
	}

	// Push packets through, then change: counters survive (the qdisc is
	// not recreated) and the leaf is resized in place.
	send := func(n int) {
		t.Helper()
		if err := e.s.Host.Do(func() error {
			c, err := net.Dial("udp", "198.18.5.5:9") // nothing answers; routed out of tgt0 below
			if err != nil {
				return err
			}
			defer c.Close()
			for i := 0; i < n; i++ {
				c.Write(make([]byte, 1000))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	tl, _ := e.h.LinkByIndex(s.Link)
	if err := e.h.RouteAdd(&netlink.Route{LinkIndex: s.Link, Dst: &net.IPNet{IP: net.IPv4(198, 18, 5, 0), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	e.h.NeighAdd(&netlink.Neigh{LinkIndex: s.Link, State: netlink.NUD_PERMANENT, IP: net.IPv4(198, 18, 5, 5), HardwareAddr: tl.Attrs().HardwareAddr})
	send(20)
	before, _ := s.Read()
	if before.Packets < 20 {
		t.Fatalf("qdisc counted %d packets, want >= 20", before.Packets)
	}
	l2 := Limit{Rate: 4_000_000, Ceil: 8_000_000, Burst: 100_000}
	if err := s.Apply(l2); err != nil {
		t.Fatal(err)
	}
	after, _ := s.Read()
	if after.Packets < before.Packets {
		t.Errorf("class change reset the qdisc counters (%d -> %d packets): it was recreated", before.Packets, after.Packets)
	}
	out = show()
	for _, want := range []string{"bfifo 10: parent 1:1 limit 800000b", "rate 32Mbit ceil 64Mbit burst 100000b"} {
		if !strings.Contains(out, want) {
			t.Errorf("after Apply(%+v), tc shows no %q:\n%s", l2, want, out)
		}
	}
	if ok, err := s.InSync(l2); err != nil || !ok {
		t.Errorf("InSync after change = %v, %v", ok, err)
	}
	if got := after.Limit(); got.Rate != l2.Rate || got.Ceil != l2.Ceil || got.Burst/1000 != l2.Burst/1000 {
		t.Errorf("Limit read back %+v, want %+v", got, l2)
	}

	// Apply again: nothing to change.
	if err := s.Apply(l2); err != nil {
		t.Fatal(err)
	}

	// Drain and remove.
	if err := s.Drain(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}
	if out := show(); strings.Contains(out, "htb") || strings.Contains(out, "bfifo") {
		t.Errorf("after Remove:\n%s", out)
	}
	if ok, err := s.InSync(Limit{}); err != nil || !ok {
		t.Errorf("after Remove: InSync(none) = %v, %v", ok, err)
	}
	if err := s.Remove(); err != nil {
		t.Errorf("second Remove: %v", err)
	}

	// Zero limit through Apply removes; invalid limits change nothing.
	if err := s.Apply(Limit{Rate: 10}); !errors.Is(err, ErrBadLimit) {
		t.Errorf("Apply(10 B/s) = %v, want ErrBadLimit", err)
	}
	if out := show(); strings.Contains(out, "htb") {
		t.Errorf("a refused limit changed the device:\n%s", out)
	}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(Limit{}); err != nil {
		t.Fatal(err)
	}
	if out := show(); strings.Contains(out, "htb") {
		t.Errorf("Apply(none) left:\n%s", out)
	}
}

// A half-built shaping (root without class, a foreign leaf) is repaired.
func TestShaperRepairs(t *testing.T) {
	e, s, _ := shapeEnv(t)
	q := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: ShapeRoot})
	q.Defcls = 1
	if err := e.h.QdiscAdd(q); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Read(); !st.Root || st.Present {
		t.Fatalf("root without class: %+v", st)
	}
	l := Limit{Rate: 3_000_000}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.InSync(l); !ok || err != nil {
		t.Errorf("repaired: InSync = %v, %v", ok, err)
	}
	// another default class: recreated
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}
	q = netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: ShapeRoot})
	q.Defcls = 0x20
	if err := e.h.QdiscAdd(q); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.InSync(l); !ok || err != nil {
		t.Errorf("default class fixed: InSync = %v, %v", ok, err)
	}
	// a foreign root qdisc is replaced
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := e.h.QdiscAdd(&netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(5, 0)},
		Rate: 1 << 20, Limit: 1 << 16, Buffer: 1 << 14}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.InSync(l); !ok || err != nil {
		t.Errorf("foreign root replaced: InSync = %v, %v", ok, err)
	}
}

// ---- traffic ----

// meter counts bytes received on one TCP connection.
type meter struct {
	n    atomic.Int64
	done chan struct{}
}

// sample is a (time, bytes) point.
type sample struct {
	t time.Time
	n int64
}

func (m *meter) sample() sample { return sample{time.Now(), m.n.Load()} }

// rateBetween is the receive rate between two samples, bytes/s.
func rateBetween(a, b sample) float64 { return float64(b.n-a.n) / b.t.Sub(a.t).Seconds() }

// stream is one bulk TCP connection from the namespace of `from` to a
// receiver listening on listen in the namespace of `to`, dialled at
// dialAddr, sending until stop is called. m counts what arrives.
type stream struct {
	m    *meter
	stop func()
	err  atomic.Value
}

func startStream(t testing.TB, to, from func(func() error) error, listen, dialAddr string) *stream {
	t.Helper()
	var ln net.Listener
	if err := to(func() (err error) {
		// A small receive buffer bounds how much a reader that falls behind
		// (2 busy cores) can catch up on inside a window, which would
		// inflate a measured rate.
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 256<<10)
			})
			return errors.Join(err, serr)
		}}
		ln, err = lc.Listen(context.Background(), "tcp", listen)
		return err
	}); err != nil {
		t.Fatalf("listen %s: %v", listen, err)
	}
	s := &stream{m: &meter{done: make(chan struct{})}}
	go func() {
		defer close(s.m.done)
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			s.m.n.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	var c net.Conn
	if err := from(func() (err error) {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err = d.Dial("tcp", dialAddr)
		return err
	}); err != nil {
		ln.Close()
		t.Fatalf("dial %s: %v", dialAddr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		buf := make([]byte, 64<<10)
		for ctx.Err() == nil {
			c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := c.Write(buf); err != nil && !os.IsTimeout(err) {
				s.err.Store(err)
				return
			}
		}
	}()
	s.stop = func() {
		cancel()
		<-sent
		c.Close()
		select {
		case <-s.m.done:
		case <-time.After(3 * time.Second):
		}
	}
	t.Cleanup(s.stop)
	return s
}

// measure waits skip (the HTB burst and TCP's start), then returns the
// receive rate over window.
func (s *stream) measure(skip, window time.Duration) float64 {
	time.Sleep(skip)
	a := s.m.sample()
	time.Sleep(window)
	return rateBetween(a, s.m.sample())
}

func (s *stream) failed() error {
	if e, ok := s.err.Load().(error); ok {
		return e
	}
	return nil
}

// within reports whether got is within frac of want.
func within(got, want, frac float64) bool { return got >= want*(1-frac) && got <= want*(1+frac) }

// shaperPair creates the egress shaper pair of the test container slot in
// the sandbox host the way the data plane does: both ends with the host
// MAC, up, IPv6 off.
func (w *wire) shaperPair(t *testing.T, slot uint16) (entry, exit int) {
	t.Helper()
	a, b := fmt.Sprintf("isxt%d", slot), fmt.Sprintf("isyt%d", slot)
	if err := w.h.LinkAdd(&netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: a, HardwareAddr: w.mac, TxQLen: -1},
		PeerName:  b, PeerHardwareAddr: w.mac,
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.s.Host.Do(func() error {
		return sysctls(map[string]string{"net/ipv6/conf/" + a + "/disable_ipv6": "1", "net/ipv6/conf/" + b + "/disable_ipv6": "1"})
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{a, b} {
		l, err := w.h.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	return w.index(t, a), w.index(t, b)
}

// deleteAllQdiscs runs, as root inside the container's namespace, what a
// hostile process would: delete every qdisc tc can see on every link.
func deleteAllQdiscs(t *testing.T, netnsPath string) string {
	t.Helper()
	script := `for d in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
  for q in root clsact ingress; do tc qdisc del dev "$d" $q 2>/dev/null; done
done
tc qdisc show`
	out, err := exec.Command("nsenter", "--net="+netnsPath, "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("hostile script: %v\n%s", err, out)
	}
	return string(out)
}

// TestShapingTraffic measures both directions of a container's limits with
// real TCP through the tcfilter layer: egress through a shaper pair entered
// and left on live connections, a hostile container, ingress with HTB on
// the veth. Rate changes, restarts and the full lifecycle are measured in
// dataplane's TestBandwidthLimits. Timing-sensitive: one sequential test.
func TestShapingTraffic(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	serve(t, w.s.Host.Do, "host", 7000)
	serve(t, w.s.Client.Do, "client", 9000)
	hostNS, err := netns.GetFromPath(w.s.Host.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer hostNS.Close()
	const mb = 1_000_000.0
	// Each reading right after a change is taken once more if it misses:
	// on a busy machine TCP can still be ramping after the skipped time.
	full := func(what string, s *stream, skip, window time.Duration) {
		t.Helper()
		r := s.measure(skip, window)
		if r < 12*mb {
			t.Logf("%s: %.2f MB/s while settling; measuring again", what, r/mb)
			r = s.measure(0, window)
		}
		t.Logf("%s: %.2f MB/s", what, r/mb)
		if r < 12*mb {
			t.Errorf("%s: %.2f MB/s, want full speed (> 12 MB/s)", what, r/mb)
		}
	}
	near := func(what string, s *stream, skip, window time.Duration, want float64) {
		t.Helper()
		r := s.measure(skip, window)
		if !within(r, want, 0.15) {
			t.Logf("%s: %.3f MB/s while settling; measuring again", what, r/mb)
			r = s.measure(0, window)
		}
		t.Logf("%s: %.3f MB/s (want %.1f within 15%%)", what, r/mb, want/mb)
		if !within(r, want, 0.15) {
			t.Errorf("%s: %.3f MB/s, want %.1f MB/s within 15%%", what, r/mb, want/mb)
		}
	}

	// Egress. A connection running at full speed survives the switch to
	// the shaper (Retarget on a live connection); the rate is then
	// measured on a fresh connection (a flow cut from ~1 GB/s to 2 MB/s
	// first spends a while in TCP loss recovery).
	s1 := startStream(t, w.s.Client.Do, a.c.Do, "198.18.0.2:9100", "198.18.0.2:9100")
	full("egress unlimited", s1, 500*time.Millisecond, time.Second)

	entry, exit := w.shaperPair(t, 1)
	sh := Shaper{H: w.h, NS: int(hostNS), Link: entry, Leaf: LeafFIFO}
	if err := sh.Apply(Limit{Rate: 2_000_000}); err != nil {
		t.Fatal(err)
	}
	if err := (ShaperExit{H: w.h, Dev: exit, Eth0: w.eth0, Lo: w.lo, HostIP: w.s.HostIP, Slot: 1}).Install(); err != nil {
		t.Fatal(err)
	}
	vf := a.vf
	vf.Via = entry
	if err := vf.Retarget(a.ranges); err != nil {
		t.Fatal(err)
	}
	if r := s1.measure(time.Second, time.Second); r <= 0 || s1.failed() != nil {
		t.Errorf("the running connection stalled or broke when the limit was switched on: %.0f B/s, %v", r, s1.failed())
	}
	s1.stop()
	eg := startStream(t, w.s.Client.Do, a.c.Do, "198.18.0.2:9101", "198.18.0.2:9101")
	near("egress 2MB/s", eg, time.Second, 2*time.Second, 2*mb)

	// Every path still works through the shaper.
	for _, c := range []struct{ network, addr, want string }{
		{"tcp", "198.18.0.1:7000", "host"}, {"udp", "198.18.0.1:7000", "host"},
		{"tcp", "127.0.0.1:7000", "host"}, {"udp", "127.0.0.1:7000", "host"},
		{"tcp", "198.18.0.1:20005", "ca"},
		{"tcp", "198.18.0.2:9000", "client"}, {"udp", "198.18.0.2:9000", "client"},
	} {
		if c.want == "ca" {
			serve(t, a.c.Do, "ca", 20005)
		}
		if got, err := echo(a.c.Do, c.network, c.addr); err != nil || got != c.want {
			t.Errorf("limited container -> %s %s: %q, %v; want %s", c.network, c.addr, got, err, c.want)
		}
	}
	if st, _ := sh.Read(); st.Packets == 0 || st.Overlimits == 0 {
		t.Errorf("shaper counters %+v: want packets and overlimits", st)
	}

	// A root process in the container deletes every qdisc it can see.
	left := deleteAllQdiscs(t, a.c.NetNS)
	if strings.Contains(left, "clsact") || strings.Contains(left, "htb") {
		t.Errorf("qdiscs left in the container:\n%s", left)
	}
	near("egress 2MB/s after the container deleted its qdiscs", eg, 500*time.Millisecond, 2*time.Second, 2*mb)

	// Lift: back to eth0/lo, drain, remove the pair.
	vf.Via = 0
	if err := vf.Retarget(a.ranges); err != nil {
		t.Fatal(err)
	}
	if err := sh.Drain(time.Second); err != nil {
		t.Error(err)
	}
	if err := w.h.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: entry}}); err != nil {
		t.Fatal(err)
	}
	full("egress after removal", eg, 300*time.Millisecond, 700*time.Millisecond)
	if err := eg.failed(); err != nil {
		t.Errorf("the egress connection broke: %v", err)
	}
	eg.stop()

	// Ingress: client -> container port 20001, HTB on the veth.
	vs := Shaper{H: w.h, NS: int(hostNS), Link: a.veth, Leaf: LeafFIFO}
	if err := vs.Apply(Limit{Rate: 2_000_000}); err != nil {
		t.Fatal(err)
	}
	in := startStream(t, a.c.Do, w.s.Client.Do, "0.0.0.0:20001", "198.18.0.1:20001")
	near("ingress 2MB/s", in, time.Second, 2*time.Second, 2*mb)
	if err := vs.Drain(time.Second); err != nil {
		t.Error(err)
	}
	if err := vs.Remove(); err != nil {
		t.Fatal(err)
	}
	full("ingress after removal", in, 300*time.Millisecond, 700*time.Millisecond)
	if err := in.failed(); err != nil {
		t.Errorf("the ingress connection broke: %v", err)
	}
}

// Retarget changes only the redirect targets of the veth's IP nodes, and
// back again gives the same filters.
func TestRetargetKernel(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	entry, _ := w.shaperPair(t, 1)
	strip := func(s string) string { return actionIndexRE.ReplaceAllString(s, "") }
	before := strip(w.tcShow(t, "vc1"))
	vf := a.vf
	vf.Via = entry
	if err := vf.Retarget(a.ranges); err != nil {
		t.Fatal(err)
	}
	via := strip(w.tcShow(t, "vc1"))
	if handles(via) == nil || strings.Join(handles(via), " ") != strings.Join(handles(before), " ") {
		t.Errorf("Retarget changed the node handles:\n%v\n%v", handles(before), handles(via))
	}
	keys := regexp.MustCompile(`(?m)^\s*match .*$`)
	if strings.Join(keys.FindAllString(via, -1), "\n") != strings.Join(keys.FindAllString(before, -1), "\n") {
		t.Errorf("Retarget changed match keys")
	}
	// 5 range nodes (four 256-port chunks and a 16-port range) in each of
	// the local, out and ICMP-error tables, echo request and reply, two
	// local fragment nodes, other fragments, and ARP (shaped too)
	if n := strings.Count(via, "to device isxt1"); n != 3*5+2+3+1 {
		t.Errorf("%d redirects to the shaper, want 21:\n%s", n, via)
	}
	if n := strings.Count(via, "to device eth0"); n != 0 {
		t.Errorf("%d redirects left to eth0, want 0:\n%s", n, via)
	}
	if strings.Contains(via, "to device lo") {
		t.Errorf("a redirect still goes to lo:\n%s", via)
	}
	// idempotent, and back
	if err := vf.Retarget(a.ranges); err != nil {
		t.Fatal(err)
	}
	vf.Via = 0
	if err := vf.Retarget(a.ranges); err != nil {
		t.Fatal(err)
	}
	if after := strip(w.tcShow(t, "vc1")); after != before {
		t.Errorf("Retarget back differs:\n%s", lineDiffs(before, after))
	}
	// new ranges follow Via
	vf.Via = entry
	if err := vf.Retarget(a.ranges); err != nil {
		t.Fatal(err)
	}
	if err := vf.SetRanges(a.ranges, append(a.ranges, rg(8080, 8080))); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(strip(w.tcShow(t, "vc1")), "to device isxt1"); n != 24 {
		t.Errorf("after SetRanges with Via: %d redirects to the shaper, want 24", n)
	}
}

var actionIndexRE = regexp.MustCompile(`(?m)^\s*index \d+ ref \d+ bind \d+\n`)

func lineDiffs(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for i := 0; i < max(len(al), len(bl)); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			out = append(out, fmt.Sprintf("- %s\n+ %s", x, y))
		}
	}
	return strings.Join(out, "\n")
}
