package tcfilter

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/isolatord/isolatord/dataplane/shaping"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/test/traffic"
)

// ---- traffic ----

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
	full := func(what string, s *traffic.Stream, skip, window time.Duration) {
		t.Helper()
		r := s.Measure(skip, window)
		if r < 12*mb {
			t.Logf("%s: %.2f MB/s while settling; measuring again", what, r/mb)
			r = s.Measure(0, window)
		}
		t.Logf("%s: %.2f MB/s", what, r/mb)
		if r < 12*mb {
			t.Errorf("%s: %.2f MB/s, want full speed (> 12 MB/s)", what, r/mb)
		}
	}
	near := func(what string, s *traffic.Stream, skip, window time.Duration, want float64) {
		t.Helper()
		r := s.Measure(skip, window)
		if !within(r, want, 0.15) {
			t.Logf("%s: %.3f MB/s while settling; measuring again", what, r/mb)
			r = s.Measure(0, window)
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
	s1 := traffic.StartStream(t, w.s.Client.Do, a.c.Do, "198.18.0.2:9100", "198.18.0.2:9100")
	full("egress unlimited", s1, 500*time.Millisecond, time.Second)

	entry, exit := w.shaperPair(t, 1)
	sh := shaping.Shaper{H: w.h, NS: int(hostNS), Link: entry, Leaf: shaping.LeafFIFO}
	if err := sh.Apply(rate.Limit{Rate: 2_000_000}); err != nil {
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
	if r := s1.Measure(time.Second, time.Second); r <= 0 || s1.Err() != nil {
		t.Errorf("the running connection stalled or broke when the limit was switched on: %.0f B/s, %v", r, s1.Err())
	}
	s1.Stop()
	eg := traffic.StartStream(t, w.s.Client.Do, a.c.Do, "198.18.0.2:9101", "198.18.0.2:9101")
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
	if err := eg.Err(); err != nil {
		t.Errorf("the egress connection broke: %v", err)
	}
	eg.Stop()

	// Ingress: client -> container port 20001, HTB on the veth.
	vs := shaping.Shaper{H: w.h, NS: int(hostNS), Link: a.veth, Leaf: shaping.LeafFIFO}
	if err := vs.Apply(rate.Limit{Rate: 2_000_000}); err != nil {
		t.Fatal(err)
	}
	in := traffic.StartStream(t, a.c.Do, w.s.Client.Do, "0.0.0.0:20001", "198.18.0.1:20001")
	near("ingress 2MB/s", in, time.Second, 2*time.Second, 2*mb)
	if err := vs.Drain(time.Second); err != nil {
		t.Error(err)
	}
	if err := vs.Remove(); err != nil {
		t.Fatal(err)
	}
	full("ingress after removal", in, 300*time.Millisecond, 700*time.Millisecond)
	if err := in.Err(); err != nil {
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
