package dataplane

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/dataplane/shaping"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/test/traffic"
)

const mbps = 1_000_000.0 // bytes per second in 1 MB/s

// wantRate fails unless r is within 15% of want.
func wantRate(t *testing.T, what string, r, want float64) {
	t.Helper()
	t.Logf("%s: %.3f MB/s (limit %.1f MB/s)", what, r/mbps, want/mbps)
	if r < want*0.85 || r > want*1.15 {
		t.Errorf("%s: %.3f MB/s, want %.1f MB/s within 15%%", what, r/mbps, want/mbps)
	}
}

// wantSettled is wantRate for a measurement right after a change: TCP may
// still be ramping towards the new rate (on a busy machine that can take
// more than the skipped time), so a reading outside the tolerance is taken
// once more before it counts.
func wantSettled(t *testing.T, what string, s *traffic.Stream, skip, window time.Duration, want float64) {
	t.Helper()
	r := s.Measure(skip, window)
	if r < want*0.85 || r > want*1.15 {
		t.Logf("%s: %.3f MB/s while settling; measuring again", what, r/mbps)
		r = s.Measure(0, window)
	}
	wantRate(t, what, r, want)
}

// wantFull fails unless r is well above any limit used here.
func wantFull(t *testing.T, what string, r float64) {
	t.Helper()
	t.Logf("%s: %.1f MB/s", what, r/mbps)
	if r < 20*mbps {
		t.Errorf("%s: %.2f MB/s, want full speed (> 20 MB/s)", what, r/mbps)
	}
}

// deleteAllQdiscs runs, as root inside the container's network namespace,
// what a hostile process would: delete every qdisc tc can see on every
// link. It returns what tc shows afterwards.
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

// enforces reports whether the host device with index link enforces
// exactly l (the zero Limit: no HTB root) with d's leaf kind, as the kernel
// reports it (the burst read back from HTB's buffer time, within 1%).
func enforces(d *DataPlane, link int, l rate.Limit) (bool, error) {
	st, err := d.shaper(link).Read()
	if err != nil || l.IsZero() {
		return err == nil && !st.Root, err
	}
	got, ceil := st.Limit(), l.Ceil
	if ceil == l.Rate {
		ceil = 0
	}
	want := l.EffectiveBurst()
	near := got.Burst+want/100+1 >= want && got.Burst <= want+want/100+1
	return st.Present && got.Rate == l.Rate && got.Ceil == ceil && near && st.Leaf == d.leaf().String(), nil
}

// shapeState reads a host device's shaping.
func (e *env) shapeState(d *DataPlane, name string) shaping.State {
	e.t.Helper()
	l, err := d.h.LinkByName(name)
	if err != nil {
		e.t.Fatalf("link %s: %v", name, err)
	}
	st, err := d.shaper(l.Attrs().Index).Read()
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// TestBandwidthLimits measures a container's limits with real TCP through
// the data plane: egress and ingress at 2 MB/s within 15%, a root process in
// the container deleting every qdisc it can see, 2 -> 4 MB/s on a live
// connection, a daemon restart (Adopt) that changes nothing, and removal
// restoring full speed. Timing-sensitive: one sequential test, ~25 s.
func TestBandwidthLimits(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	ctx := context.Background()
	if e.info.LinkSpeed != 10000 || e.info.ShapingQueue == "" {
		t.Errorf("host info: link speed %d Mbit/s (the sandbox's veth says 10000), shaping queue %q", e.info.LinkSpeed, e.info.ShapingQueue)
	}
	p := e.spawn("A", []uint16{31009}, false)
	c := e.spec("A", p, 1, "40960-41983", "31000-31009", "")
	c.Egress = rate.Limit{Rate: 2_000_000}
	e.setup(c)
	entry, exit := ShaperNames(c.ID)
	if !e.hasLink(entry) || !e.hasLink(exit) {
		t.Fatalf("no egress shaper pair %s/%s", entry, exit)
	}
	serveIn(t, e.sb.Host, "0.0.0.0:8000", "host")
	serveIn(t, e.sb.Client, clientAddr(9000), "client")

	// Egress, from the container to the client.
	eg := traffic.StartStream(t, e.sb.Client.Do, p.Do, clientAddr(9100), clientAddr(9100))
	wantSettled(t, "egress 2MB/s", eg, time.Second, 2*time.Second, 2*mbps)
	// every path goes through the shaper and still works
	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, p, nw, hostAddr(8000), "host")
		mustEcho(t, p, nw, loAddr(8000), "host")
		mustEcho(t, p, nw, clientAddr(9000), "client")
	}

	// A root process in the container deletes every qdisc it can see.
	if left := deleteAllQdiscs(t, p.NetNS); strings.Contains(left, "clsact") || strings.Contains(left, "htb") {
		t.Errorf("qdiscs left in the container:\n%s", left)
	}
	wantSettled(t, "egress 2MB/s after the container deleted its qdiscs", eg, 500*time.Millisecond, 2*time.Second, 2*mbps)

	// 2 -> 4 MB/s on the live connection.
	c.Egress = rate.Limit{Rate: 4_000_000}
	if err := e.d.SetLimits(ctx, c, c.Egress, c.Ingress); err != nil {
		t.Fatal(err)
	}
	wantSettled(t, "egress 4MB/s on the same connection", eg, 500*time.Millisecond, 2*time.Second, 4*mbps)

	// A restarted daemon adopts the container without touching its
	// shaping: the qdisc's counters go on, the rate stays.
	before := e.shapeState(e.d, entry)
	filters := e.tcShow(plane.VethName(c.ID))
	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d2.Adopt(ctx, c); err != nil {
		t.Fatal(err)
	}
	after := e.shapeState(d2, entry)
	if !after.Present || after.Packets < before.Packets || after.Limit().Rate != 4_000_000 {
		t.Errorf("after restart: %+v (before %d packets): the shaping was recreated or changed", after, before.Packets)
	}
	if got := e.tcShow(plane.VethName(c.ID)); got != filters {
		t.Errorf("restart changed the veth filters:\n%s", lineDiff(filters, got))
	}
	wantSettled(t, "egress 4MB/s after a restart", eg, 200*time.Millisecond, 2*time.Second, 4*mbps)
	e.d = d2

	// Usage figures.
	st, err := e.d.Stats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if st.Egress.Limit.Rate != 4_000_000 || !st.Egress.Enforced || st.Egress.Bytes == 0 || st.Egress.Overlimits == 0 || st.Ingress.Limit.Rate != 0 {
		t.Errorf("Stats shaping: egress %+v ingress %+v", st.Egress, st.Ingress)
	}

	// Removing the limit: full speed on the same connection, no pair left.
	c.Egress = rate.Limit{}
	if err := e.d.SetLimits(ctx, c, c.Egress, c.Ingress); err != nil {
		t.Fatal(err)
	}
	wantFull(t, "egress after removing the limit", eg.Measure(500*time.Millisecond, time.Second))
	if err := eg.Err(); err != nil {
		t.Errorf("the egress connection broke: %v", err)
	}
	eg.Stop()
	if e.hasLink(entry) || e.hasLink(exit) {
		t.Error("the shaper pair survived the removal of the limit")
	}
	if f := e.tcShow(plane.VethName(c.ID)); strings.Contains(f, entry) {
		t.Errorf("veth filters still point at the shaper:\n%s", f)
	}

	// Switching egress shaping on under a live full-speed connection.
	s1 := traffic.StartStream(t, e.sb.Client.Do, p.Do, clientAddr(9101), clientAddr(9101))
	wantFull(t, "egress unlimited", s1.Measure(300*time.Millisecond, 700*time.Millisecond))
	c.Egress = rate.Limit{Rate: 2_000_000}
	if err := e.d.SetLimits(ctx, c, c.Egress, c.Ingress); err != nil {
		t.Fatal(err)
	}
	if r := s1.Measure(time.Second, time.Second); r == 0 || s1.Err() != nil {
		t.Errorf("a live connection stalled or broke when the egress limit was switched on: %.0f B/s, %v", r, s1.Err())
	}
	s1.Stop()
	c.Egress = rate.Limit{}

	// Ingress, from the client to the container's port 31001.
	c.Ingress = rate.Limit{Rate: 2_000_000}
	if err := e.d.SetLimits(ctx, c, c.Egress, c.Ingress); err != nil {
		t.Fatal(err)
	}
	if e.hasLink(entry) {
		t.Error("the egress shaper pair survived")
	}
	in := traffic.StartStream(t, p.Do, e.sb.Client.Do, "0.0.0.0:31001", hostAddr(31001))
	wantSettled(t, "ingress 2MB/s", in, time.Second, 2*time.Second, 2*mbps)
	c.Ingress = rate.Limit{Rate: 4_000_000}
	if err := e.d.SetLimits(ctx, c, c.Egress, c.Ingress); err != nil {
		t.Fatal(err)
	}
	wantSettled(t, "ingress 4MB/s on the same connection", in, 500*time.Millisecond, 2*time.Second, 4*mbps)
	if st, err := e.d.Stats(ctx, c); err != nil || !st.Ingress.Enforced || st.Ingress.Overlimits == 0 || st.Ingress.Bytes == 0 {
		t.Errorf("Stats ingress shaping: %+v, %v", st.Ingress, err)
	}
	c.Ingress = rate.Limit{}
	if err := e.d.SetLimits(ctx, c, c.Egress, c.Ingress); err != nil {
		t.Fatal(err)
	}
	wantFull(t, "ingress after removing the limit", in.Measure(500*time.Millisecond, time.Second))
	if err := in.Err(); err != nil {
		t.Errorf("the ingress connection broke: %v", err)
	}
	if st := e.shapeState(e.d, plane.VethName(c.ID)); st.RootKind == "htb" {
		t.Error("HTB left on the veth")
	}
}

// TestLimitsLifecycle covers the limits' plumbing without timing: setup
// with both limits, bad limits, setup rollback, teardown, repair by Adopt
// and stray shaper pairs.
func TestLimitsLifecycle(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	ctx := context.Background()
	p := e.spawn("A", []uint16{31000}, false)
	c := e.spec("A", p, 1, "40960-41983", "31000-31009", "")
	c.Egress = rate.Limit{Rate: 3_000_000, Ceil: 6_000_000, Burst: 500_000}
	c.Ingress = rate.Limit{Rate: 5_000_000}
	entry, exit := ShaperNames(c.ID)

	// bad limits are refused before anything is done
	before := e.hostState()
	bad := c
	bad.Egress = rate.Limit{Rate: 2_000_000, Ceil: 1_000_000}
	if _, err := e.d.Setup(ctx, bad); !errors.Is(err, ErrInvalid) {
		t.Errorf("Setup with ceil < rate: %v, want ErrInvalid", err)
	}
	// a failure after the shaper was made leaves nothing
	e.d.hook = func(s string) error {
		if s == "limits" {
			return errors.New("injected")
		}
		return nil
	}
	e.cleanupMount(c.ID)
	if _, err := e.d.Setup(ctx, c); err == nil {
		t.Fatal("Setup with an injected failure succeeded")
	}
	e.d.hook = nil
	if after := e.hostState(); after != before {
		t.Errorf("refused or failed setups left host changes:\n%s", lineDiff(before, after))
	}

	e.setup(c)
	sh := e.sb.Host.Run(t, "tc", "class", "show", "dev", entry) + e.sb.Host.Run(t, "tc", "class", "show", "dev", plane.VethName(c.ID))
	for _, want := range []string{"rate 24Mbit ceil 48Mbit burst 49999", "rate 40Mbit ceil 40Mbit"} {
		if !strings.Contains(sh, want) {
			t.Errorf("tc classes lack %q:\n%s", want, sh)
		}
	}
	if f := e.tcShow(exit); !strings.Contains(f, "to device eth0") || !strings.Contains(f, "to device lo") {
		t.Errorf("shaper exit filters:\n%s", f)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
	mustEcho(t, e.sb.Host, "udp", loAddr(31000), "A")

	// limits refused by SetLimits change nothing
	if err := e.d.SetLimits(ctx, c, rate.Limit{Rate: 10}, c.Ingress); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetLimits(10 B/s): %v, want ErrInvalid", err)
	}
	if err := e.d.SetLimits(ctx, plane.Container{ID: "nobody"}, rate.Limit{}, rate.Limit{}); !errors.Is(err, ErrUnknown) {
		t.Errorf("SetLimits of an unknown container: %v", err)
	}

	// Something deletes the shaper pair and the veth's HTB: the next daemon
	// finds and repairs both in place (the veth and its filters stay).
	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	e.sb.Host.Run(t, "ip", "link", "del", entry)
	e.sb.Host.Run(t, "tc", "qdisc", "del", "dev", plane.VethName(c.ID), "root")
	if st := e.shapeState(e.d, plane.VethName(c.ID)); st.RootKind == "htb" {
		t.Fatal("the veth's HTB is still there")
	}
	if err := d2.Adopt(ctx, c); err != nil {
		t.Fatal(err)
	}
	e.d = d2
	if !e.hasLink(entry) {
		t.Fatal("Adopt did not recreate the shaper pair")
	}
	if ok, err := enforces(d2, e.linkIdx(entry), c.Egress); !ok || err != nil {
		t.Errorf("egress not in sync after Adopt: %v %v", ok, err)
	}
	if ok, err := enforces(d2, e.linkIdx(plane.VethName(c.ID)), c.Ingress); !ok || err != nil {
		t.Errorf("ingress not in sync after Adopt: %v %v", ok, err)
	}
	if f := e.tcShow(plane.VethName(c.ID)); !strings.Contains(f, "to device "+entry) {
		t.Errorf("veth filters do not point at the new shaper:\n%s", f)
	}
	mustEcho(t, p, "tcp", hostAddr(31000), "A") // container -> itself via host lo, through the shaper
	mustEcho(t, e.sb.Client, "udp", hostAddr(31000), "A")

	// A stray pair (a container that is gone) is removed with the strays.
	strayEntry, _ := ShaperNames("gone-container")
	e.sb.Host.Run(t, "ip", "link", "add", strayEntry, "type", "veth", "peer", "name", "isy"+strayEntry[3:])
	removed, err := e.d.RemoveStrays(ctx, []plane.Container{c})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, "egress shaper "+strayEntry) || !e.hasLink(entry) || e.hasLink(strayEntry) {
		t.Errorf("RemoveStrays removed %v; stray left %v, own left %v", removed, e.hasLink(strayEntry), e.hasLink(entry))
	}

	// Teardown removes the pair.
	rep, err := e.d.Teardown(ctx, c)
	if err != nil || len(rep.Missing) != 0 {
		t.Fatalf("Teardown: %v %v", rep, err)
	}
	if e.hasLink(entry) || e.hasLink(exit) {
		t.Error("the shaper pair survived the teardown")
	}
}

func (e *env) linkIdx(name string) int {
	e.t.Helper()
	l, err := e.d.h.LinkByName(name)
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Attrs().Index
}
