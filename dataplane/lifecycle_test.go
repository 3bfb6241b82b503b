package dataplane

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var errInjected = errors.New("injected failure")

func TestValidation(t *testing.T) {
	ok := plane.Container{ID: "c1", Slot: 1, NetNS: "/proc/1/ns/net",
		Ephemeral: ephemeral.Range{Begin: 32768, End: 33791}, Ports: ephemeral.MustParseSet("31000")}
	if err := validateContainer(ok); err != nil {
		t.Fatalf("valid container rejected: %v", err)
	}
	cases := []struct {
		name string
		mod  func(*plane.Container)
		want string
	}{
		{"empty id", func(c *plane.Container) { c.ID = "" }, "container ID"},
		{"dot", func(c *plane.Container) { c.ID = "." }, "container ID"},
		{"dotdot", func(c *plane.Container) { c.ID = ".." }, "container ID"},
		{"slash", func(c *plane.Container) { c.ID = "a/b" }, "container ID"},
		{"leading dash", func(c *plane.Container) { c.ID = "-a" }, "container ID"},
		{"too long", func(c *plane.Container) { c.ID = strings.Repeat("a", 129) }, "container ID"},
		{"slot 0", func(c *plane.Container) { c.Slot = 0 }, "slot"},
		{"slot 4096", func(c *plane.Container) { c.Slot = 4096 }, "slot"},
		{"no netns", func(c *plane.Container) { c.NetNS = "" }, "network namespace"},
		{"unaligned", func(c *plane.Container) { c.Ephemeral = ephemeral.Range{Begin: 32769, End: 33792} }, "ephemeral range"},
		{"empty range", func(c *plane.Container) { c.Ephemeral = ephemeral.Range{Begin: 2, End: 1} }, "ephemeral range"},
		{"ports in ephemeral", func(c *plane.Container) { c.Ports = ephemeral.MustParseSet("33000") }, "ephemeral ports"},
		{"shared in ports", func(c *plane.Container) { c.Shared = ephemeral.MustParseSet("31000") }, "shared ports"},
	}
	for _, tc := range cases {
		c := ok
		tc.mod(&c)
		err := validateContainer(c)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v (want ErrInvalid naming %q)", tc.name, err, tc.want)
		}
	}
	for _, id := range []string{"a", "A9", "a.b_c-d", strings.Repeat("x", 128)} {
		if err := plane.ValidateID(id); err != nil {
			t.Errorf("ValidateID(%q) = %v", id, err)
		}
	}
	if n := plane.VethName("some-container"); len(n) != 15 || !strings.HasPrefix(n, "iso") || !isVethName(n) {
		t.Errorf("VethName = %q", n)
	}
	if plane.VethName("a") == plane.VethName("b") {
		t.Error("VethName collides for a and b")
	}
}

func TestRefusesHostNamespace(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	for _, path := range []string{e.sb.Host.Path, "/proc/self/ns/net"} {
		c := plane.Container{ID: e.uniqueID("hostns"), Slot: 7, NetNS: path,
			Ephemeral: ephemeral.Range{Begin: 40960, End: 41983}}
		e.cleanupMount(c.ID)
		_, err := e.d.Setup(context.Background(), c)
		if !errors.Is(err, plane.ErrHostNamespace) {
			t.Errorf("Setup in %s: %v, want ErrHostNamespace", path, err)
		}
		if _, err := os.Stat(filepath.Join(nspin.DefaultDir, c.ID)); !os.IsNotExist(err) {
			t.Errorf("a mount point was left for %s", c.ID)
		}
	}
	if e.hasLink(plane.VethName("x")) {
		t.Error("unexpected veth")
	}
}

func TestNotPreparedAndDuplicates(t *testing.T) {
	e := newEnv(t)
	d2 := e.newDataPlane()
	p := e.spawn("N", []uint16{31000}, false)
	c := e.spec("N", p, 3, "40960-41983", "31000", "")
	if _, err := d2.Setup(context.Background(), c); !errors.Is(err, ErrNotPrepared) {
		t.Errorf("Setup before PrepareHost: %v", err)
	}
	e.setup(c)
	if _, err := e.d.Setup(context.Background(), c); !errors.Is(err, ErrExists) {
		t.Errorf("second Setup of %s: %v", c.ID, err)
	}
	p2 := e.spawn("N2", []uint16{31000}, false)
	c2 := e.spec("N2", p2, 3, "41984-43007", "", "")
	e.cleanupMount(c2.ID)
	if _, err := e.d.Setup(context.Background(), c2); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "slot 3") {
		t.Errorf("Setup with a used slot: %v", err)
	}
	if err := e.d.SetPorts(context.Background(), c2, ephemeral.Set{}, ephemeral.Set{}); !errors.Is(err, ErrUnknown) {
		t.Errorf("SetPorts of an unknown container: %v", err)
	}
	// Tearing down an unknown container that claims a live container's
	// slot leaves the live one's host filters alone.
	rep, err := e.d.Teardown(context.Background(), c2)
	if err != nil || len(rep.Missing) == 0 || !strings.Contains(strings.Join(rep.Missing, ";"), "belongs to container "+c.ID) {
		t.Errorf("teardown of an unknown container on a used slot: %v %v", rep, err)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "N")
	if miss, err := e.d.Check(context.Background(), c); err != nil || len(miss) != 0 {
		t.Errorf("the live container lost objects: %v %v", miss, err)
	}
}

// hostState is everything Setup may create on the host side.
func (e *env) hostState() string {
	links := e.hostLinks()
	slices.Sort(links)
	return strings.Join(links, ",") + "\n" + e.hostFilters()
}

func TestSetupRollback(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "9100", 31000)
	before := e.hostState()
	p := e.spawn("R", []uint16{31020, 9100}, true)

	steps := []string{"open", "mount", "veth", "host veth sysctls", "limits", "veth filters", "host veth",
		"container handle", "container config", "container", "neighbours", "chains", "demux", "fanout", "shared"}
	for _, step := range steps {
		e.d.hook = func(s string) error {
			if s == step {
				return errInjected
			}
			return nil
		}
		c := e.spec("R", p, 5, "41984-43007", "31020-31029", "9100")
		e.cleanupMount(c.ID)
		_, err := e.d.Setup(context.Background(), c)
		if !errors.Is(err, errInjected) {
			t.Fatalf("failure at %q: Setup returned %v", step, err)
		}
		if after := e.hostState(); after != before {
			t.Errorf("failure at %q left host changes:\n%s", step, lineDiff(before, after))
		}
		if _, err := os.Stat(filepath.Join(nspin.DefaultDir, c.ID)); !os.IsNotExist(err) {
			t.Errorf("failure at %q left the mount point of %s", step, c.ID)
		}
		if len(e.d.ctrs) != 1 || len(e.d.shared[9100]) != 1 {
			t.Errorf("failure at %q left index entries: %d containers, shared 9100 holders %v", step, len(e.d.ctrs), e.d.shared[9100])
		}
	}
	e.d.hook = nil

	// A kernel-side failure: R asks for a port A holds; the demux refuses.
	c := e.spec("R", p, 5, "41984-43007", "31005", "")
	e.cleanupMount(c.ID)
	if _, err := e.d.Setup(context.Background(), c); err == nil {
		t.Fatal("Setup with a port of another container succeeded")
	}
	if after := e.hostState(); after != before {
		t.Errorf("refused setup left host changes:\n%s", lineDiff(before, after))
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")

	// The same namespace can then be plumbed for real and carries traffic.
	c = e.spec("R", p, 5, "41984-43007", "31020-31029", "9100")
	e.setup(c)
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31020), "R")
	mustEcho(t, e.sb.Client, "udp", hostAddr(31020), "R")
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
	_ = a
}

func TestSetPorts(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000, 31020)
	b := e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	serveIn(t, e.sb.Client, clientAddr(9000), "client")
	ctx := context.Background()

	if err := e.d.SetPorts(ctx, a.c, ephemeral.MustParseSet("31020-31029"), ephemeral.Set{}); err != nil {
		t.Fatal(err)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31020), "A")
	mustEcho(t, e.sb.Client, "udp", hostAddr(31020), "A")
	if got, err := echo(e.sb.Client, "tcp", hostAddr(31000)); err == nil {
		t.Errorf("old port 31000 still answered by %s", got)
	}
	mustEcho(t, a.proc, "tcp", clientAddr(9000), "client", traffic.WithSource("198.18.0.1:31025"))
	if _, err := echo(a.proc, "tcp", clientAddr(9000), traffic.WithSource("198.18.0.1:31005"), traffic.WithTimeout(700*time.Millisecond)); err == nil {
		t.Error("A can still send from its old port 31005")
	}

	// Refused by the demux (B holds 31010): nothing changes.
	before := e.hostState()
	if err := e.d.SetPorts(ctx, a.c, ephemeral.MustParseSet("31010,31020-31029"), ephemeral.Set{}); err == nil {
		t.Fatal("SetPorts onto B's port succeeded")
	}
	if after := e.hostState(); after != before {
		t.Errorf("refused SetPorts changed the host:\n%s", lineDiff(before, after))
	}
	// Injected failures at every step: everything is put back.
	for _, step := range []string{"grow", "add", "shared", "remove", "shrink"} {
		e.d.hook = func(s string) error {
			if s == step {
				return errInjected
			}
			return nil
		}
		err := e.d.SetPorts(ctx, a.c, ephemeral.MustParseSet("31000-31003"), ephemeral.MustParseSet("9300"))
		if !errors.Is(err, errInjected) {
			t.Fatalf("failure at %q: %v", step, err)
		}
		if after := e.hostState(); after != before {
			t.Errorf("failure at %q changed the host:\n%s", step, lineDiff(before, after))
		}
	}
	e.d.hook = nil
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31020), "A")
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31010), "B")
	mustEcho(t, a.proc, "tcp", clientAddr(9000), "client", traffic.WithSource("198.18.0.1:31021"))
	_ = b
}

func TestSharedPort(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	a := e.start("A", 1, "40960-41983", "31000", "9000", 9000)
	b := e.start("B", 2, "41984-43007", "31010", "9000", 9000)
	serveIn(t, e.sb.Host, "0.0.0.0:9000", "host")
	ctx := context.Background()

	spread := func() map[string]int {
		seen := map[string]int{}
		for i := 0; i < 32; i++ {
			src := "198.18.0.2:" + strconv.Itoa(45000+2*i)
			got, err := echo(e.sb.Client, "tcp", hostAddr(9000), traffic.WithSource(src))
			if err != nil {
				t.Errorf("shared port from %s: %v", src, err)
				continue
			}
			seen[got]++
		}
		return seen
	}
	if seen := spread(); seen["A"] == 0 || seen["B"] == 0 || seen["host"] != 0 {
		t.Errorf("32 connections to shared port 9000 were answered by %v, want both A and B", seen)
	}
	// The host reaches the shared port too (via lo), and so does a container.
	if got, err := echo(e.sb.Host, "tcp", loAddr(9000)); err != nil || (got != "A" && got != "B") {
		t.Errorf("host -> 127.0.0.1:9000: %q %v", got, err)
	}
	if got, err := echo(a.proc, "tcp", hostAddr(9000)); err != nil || (got != "A" && got != "B") {
		t.Errorf("A -> host IP:9000: %q %v", got, err)
	}

	// B gives the port up: every flow goes to A.
	if err := e.d.SetPorts(ctx, b.c, ephemeral.MustParseSet("31010"), ephemeral.Set{}); err != nil {
		t.Fatal(err)
	}
	if seen := spread(); seen["A"] != 32 {
		t.Errorf("after B left 9000: %v, want all 32 on A", seen)
	}
	// A goes away: the port falls back to the host's listener.
	if _, err := e.d.Teardown(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(9000), "host")
	if len(e.d.shared) != 0 {
		t.Errorf("shared index not empty: %v", e.d.shared)
	}
}

func TestRestartAdoptCheckTeardown(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "9000", 31000)
	ctx := context.Background()
	if miss, err := e.d.Check(ctx, a.c); err != nil || len(miss) != 0 {
		t.Fatalf("Check of a fresh container: %v %v", miss, err)
	}

	// A "restarted daemon": host preparation is idempotent and changes
	// nothing more, Adopt registers A without touching the kernel.
	before := e.hostState()
	d2 := e.newDataPlane()
	info, err := d2.PrepareHost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Originals) != 0 {
		t.Errorf("second PrepareHost changed settings again: %v", info.Originals)
	}
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if after := e.hostState(); after != before {
		t.Errorf("restart + Adopt changed the host:\n%s", lineDiff(before, after))
	}
	// its neighbour requests are served again, in the background once
	// recovery is over (Strays)
	if _, err := d2.Strays(ctx, []plane.Container{a.c}); err != nil {
		t.Fatal(err)
	}
	if !wait.Until(5*time.Second, func() bool { return d2.neigh.Serves(a.c.ID) }) {
		t.Fatalf("neighbour requests of the adopted container not served after 5s (%d pending)", d2.neigh.Pending())
	}
	if miss, err := d2.Check(ctx, a.c); err != nil || len(miss) != 0 {
		t.Errorf("Check after Adopt: %v %v", miss, err)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
	if err := d2.Adopt(ctx, a.c); !errors.Is(err, ErrExists) {
		t.Errorf("second Adopt: %v", err)
	}
	ghost := plane.Container{ID: e.uniqueID("ghost"), Slot: 9, NetNS: "/proc/1/ns/net", Ephemeral: ephemeral.Range{Begin: 43008, End: 44031}}
	if err := d2.Adopt(ctx, ghost); err == nil {
		t.Error("Adopt of a container without veth succeeded")
	}

	// Check notices what disappears.
	if _, err := d2.eth0.DelRanges(1, []ephemeral.Range{{Begin: 31008, End: 31009}}); err != nil {
		t.Fatal(err)
	}
	miss, err := d2.Check(ctx, a.c)
	if err != nil || !slices.Contains(miss, "eth0 range 31008-31009") || len(miss) != 1 {
		t.Errorf("Check after deleting a range: %v %v", miss, err)
	}

	rep, err := d2.Teardown(ctx, a.c)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Missing) != 1 || !strings.Contains(rep.Missing[0], "eth0 demux") {
		t.Errorf("teardown report: %v (want the one deleted eth0 range)", rep.Missing)
	}
	if e.hasLink(plane.VethName(a.c.ID)) {
		t.Error("veth survived")
	}
	if f := e.hostFilters(); slotRE(1).MatchString(f) {
		t.Errorf("filters of slot 1 survived:\n%s", f)
	}
	miss, err = d2.Check(ctx, a.c)
	if err != nil || !slices.Contains(miss, "veth "+plane.VethName(a.c.ID)) || !slices.Contains(miss, "bind mount "+filepath.Join(nspin.DefaultDir, a.c.ID)) {
		t.Errorf("Check after teardown: %v %v", miss, err)
	}
}

func TestSnapshotAndRemoveStrays(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	e.d.fanoutAlways = true // C's fan-out node is one of the strays
	a := e.start("A", 1, "40960-41983", "31000-31009", "9000", 31000, 9000)
	b := e.start("B", 2, "41984-43007", "31010-31019", "9000", 31010, 9000)
	c := e.start("C", 3, "43008-44031", "31020", "", 31020)
	ctx := context.Background()

	s, err := e.d.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []ctr{a, b, c} {
		if s.Veths[plane.VethName(x.c.ID)] == 0 || !s.Mounts[x.c.ID] || len(s.Slots[x.c.Slot]) == 0 {
			t.Errorf("snapshot misses %s: %+v", x.c.ID, s)
		}
	}
	if len(s.Veths) != 3 || len(s.Mounts) != 3 || len(s.Slots) != 3 {
		t.Errorf("snapshot has extra objects: %+v", s)
	}

	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	removed, err := d2.RemoveStrays(ctx, []plane.Container{a.c})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"veth " + plane.VethName(b.c.ID), "veth " + plane.VethName(c.c.ID),
		"bind mount " + filepath.Join(nspin.DefaultDir, b.c.ID), "eth0 fan-out of slot 3",
		"eth0 range 31012-31015 of slot 2", "lo range 31020 of slot 3", "eth0 stray holders of shared port 9000"} {
		if !slices.Contains(removed, want) {
			t.Errorf("RemoveStrays did not report %q; got %v", want, removed)
		}
	}
	s, err = d2.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Veths) != 1 || len(s.Mounts) != 1 || !s.Mounts[a.c.ID] || len(s.Slots) != 1 || len(s.Slots[1]) == 0 {
		t.Errorf("after RemoveStrays: %+v", s)
	}
	// A still gets its traffic and all of shared port 9000; B's ports go to
	// the host stack (nothing listens there).
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
	for i := 0; i < 8; i++ {
		mustEcho(t, e.sb.Client, "tcp", hostAddr(9000), "A", traffic.WithSource("198.18.0.2:"+strconv.Itoa(46000+2*i)))
	}
	if got, err := echo(e.sb.Client, "tcp", hostAddr(31010)); err == nil {
		t.Errorf("B's port answered by %s after RemoveStrays", got)
	}
	again, err := d2.RemoveStrays(ctx, []plane.Container{a.c})
	if err != nil || len(again) != 0 {
		t.Errorf("second RemoveStrays: %v %v", again, err)
	}
	// The first data plane's records are stale now; its Teardown of B is
	// tolerant.
	rep, err := e.d.Teardown(ctx, b.c)
	if err != nil || len(rep.Missing) == 0 {
		t.Errorf("teardown of a removed container: %v %v", rep, err)
	}
}

// TestHostPreparation checks the host settings PrepareHost applies and
// records, and shows each one is needed: with the setting reverted, the
// path it serves breaks; with it restored, the path works again.
func TestHostPreparation(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	h, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, _ := h.LinkByName("lo")
	if lo.Attrs().HardwareAddr.String() != e.sb.HostMAC.String() {
		t.Errorf("host lo MAC %s, want eth0's %s", lo.Attrs().HardwareAddr, e.sb.HostMAC)
	}
	if e.info.Originals[OriginalLoMAC] != "00:00:00:00:00:00" ||
		e.info.Originals["sysctl/net/ipv4/conf/lo/route_localnet"] != "0" ||
		e.info.Originals["sysctl/net/ipv4/conf/lo/accept_local"] != "0" {
		t.Errorf("Originals = %v", e.info.Originals)
	}
	if e.info.IP.String() != "198.18.0.1/24" || e.info.Eth0 != "eth0" || e.info.Lo != "lo" ||
		!e.info.Gateway.Equal(e.sb.ClientIP) || e.info.MAC.String() != e.sb.HostMAC.String() {
		t.Errorf("HostInfo = %+v", e.info)
	}
	for _, f := range []string{plane.FeatureClsact, plane.FeatureU32, plane.FeatureMirred, plane.FeatureHTB, plane.FeatureTBF, plane.FeatureIFB} {
		if !e.info.Features[f] {
			t.Errorf("feature %s not detected (kernel has it built in)", f)
		}
	}
	if e.info.Features[plane.FeatureFQCodel] {
		t.Error("fq_codel detected on a kernel without it")
	}

	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	serveIn(t, e.sb.Host, "0.0.0.0:8000", "host")
	quick := traffic.WithTimeout(700 * time.Millisecond)

	setHost := func(k, v string) {
		t.Helper()
		if err := e.sb.Host.Do(func() error { return sysctl.Here(func(sd *sysctl.Dir) error { return sd.Write(k, v) }) }); err != nil {
			t.Fatal(err)
		}
	}
	checks := []struct {
		name          string
		revert, apply func()
		path          func() (string, error)
		want          string
	}{
		{"lo MAC = eth0 MAC (host -> container via lo)",
			func() { setMAC(t, h, lo, "02:00:00:00:00:99") }, func() { setMAC(t, h, lo, e.sb.HostMAC.String()) },
			func() (string, error) { return echo(e.sb.Host, "tcp", hostAddr(31000), quick) }, "A"},
		{"lo route_localnet=1 (container -> host via 127.0.0.1)",
			func() { setHost("net/ipv4/conf/lo/route_localnet", "0") }, func() { setHost("net/ipv4/conf/lo/route_localnet", "1") },
			func() (string, error) { return echo(a.proc, "tcp", loAddr(8000), quick) }, "host"},
		{"lo accept_local=1 (container -> host via host IP)",
			func() { setHost("net/ipv4/conf/lo/accept_local", "0") }, func() { setHost("net/ipv4/conf/lo/accept_local", "1") },
			func() (string, error) { return echo(a.proc, "tcp", hostAddr(8000), quick) }, "host"},
	}
	// rp_filter is left alone: strict or loose reverse-path filtering on
	// the host breaks none of the paths.
	for _, v := range []string{"1", "2"} {
		for _, dev := range []string{"all", "default", "lo", "eth0", plane.VethName(a.c.ID)} {
			setHost("net/ipv4/conf/"+dev+"/rp_filter", v)
		}
		for _, nw := range []string{"tcp", "udp"} {
			mustEcho(t, e.sb.Client, nw, hostAddr(31000), "A")
			mustEcho(t, e.sb.Host, nw, hostAddr(31000), "A")
			mustEcho(t, e.sb.Host, nw, loAddr(31000), "A")
			mustEcho(t, a.proc, nw, hostAddr(8000), "host")
			mustEcho(t, a.proc, nw, loAddr(8000), "host")
		}
	}
	for _, c := range checks {
		c.revert()
		if got, err := c.path(); err == nil {
			t.Errorf("%s: path still works without the setting (answered by %s)", c.name, got)
		}
		c.apply()
		if got, err := c.path(); err != nil || got != c.want {
			t.Errorf("%s: path broken with the setting: %q %v", c.name, got, err)
		}
	}
}

func setMAC(t *testing.T, h *netlink.Handle, l netlink.Link, mac string) {
	t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetHardwareAddr(l, hw); err != nil {
		t.Fatal(err)
	}
}

// TestCustomNetNSDir: a data plane whose netns directory is not iproute2's
// makes it a shared mount point, pins namespaces there and cleans up.
func TestCustomNetNSDir(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	dir := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() {
		for i := 0; i < 4; i++ { // the self-bind (and anything stacked on it)
			if unix.Unmount(dir, unix.MNT_DETACH) != nil {
				break
			}
		}
	})
	d, err := New(Config{HostNS: e.sb.Host.Path, NetNSDir: dir, Logger: quietLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.PrepareHost(context.Background()); err != nil {
		t.Fatal(err)
	}
	ms, err := nspin.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	shared := false
	for _, m := range ms {
		if m.MountPoint == dir {
			shared = m.Shared()
		}
	}
	if !shared {
		t.Fatalf("%s is not a shared mount point after PrepareHost", dir)
	}
	p := e.spawn("D", []uint16{31000}, false)
	c := e.spec("D", p, 4, "40960-41983", "31000", "")
	t.Cleanup(func() { nspin.Unmount(dir, c.ID) })
	pl, err := d.Setup(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if pl.Mount != filepath.Join(dir, c.ID) {
		t.Errorf("mount %s, want it under %s", pl.Mount, dir)
	}
	if got, _ := nspin.NsMounts(dir); len(got) != 1 || got[c.ID] != pl.NetNSIno {
		t.Errorf("NsMounts(%s) = %v, want %s -> %d", dir, got, c.ID, pl.NetNSIno)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "D")
	if _, err := d.Teardown(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if got, _ := nspin.NsMounts(dir); len(got) != 0 {
		t.Errorf("mounts left in %s: %v", dir, got)
	}
}

// TestSetPortsRollForward: a daemon that died in the middle of SetPorts
// (veth and container filters grown to old ∪ new, the new ranges added to
// the host demuxes, the old ones not yet removed) is restarted; Adopt with
// the old ports, then SetPorts to the new ports finishes the job.
func TestSetPortsRollForward(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000, 31020, 31029)
	serveIn(t, e.sb.Client, clientAddr(9000), "client")
	ctx := context.Background()
	newPorts := ephemeral.MustParseSet("31020-31029")

	// The partial state, built with the same calls SetPorts makes.
	rec := e.d.ctrs[a.c.ID]
	eph := a.c.Ephemeral
	oldAll, unionAll := allRanges(eph, a.c.Ports, a.c.Shared), allRanges(eph, a.c.Ports.Union(newPorts), a.c.Shared)
	if err := e.d.vethFilters(a.c.Slot, rec.veth, rec.via).SetRanges(oldAll, unionAll); err != nil {
		t.Fatal(err)
	}
	addEx := rangeDiff(exclusiveRanges(eph, newPorts), exclusiveRanges(eph, a.c.Ports))
	if err := e.d.eth0.AddRanges(a.c.Slot, rec.veth, addEx[:1]); err != nil { // died after the first range on eth0
		t.Fatal(err)
	}

	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if err := d2.SetPorts(ctx, a.c, newPorts, ephemeral.Set{}); err != nil {
		t.Fatalf("rolling the update forward: %v", err)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31020), "A")
	mustEcho(t, e.sb.Client, "udp", hostAddr(31029), "A")
	if got, err := echo(e.sb.Client, "tcp", hostAddr(31000)); err == nil {
		t.Errorf("old port 31000 still answered by %s", got)
	}
	mustEcho(t, a.proc, "tcp", clientAddr(9000), "client", traffic.WithSource("198.18.0.1:31022"))
	c := a.c
	c.Ports = newPorts
	if miss, err := d2.Check(ctx, c); err != nil || len(miss) != 0 {
		t.Errorf("Check after the roll-forward: %v %v", miss, err)
	}
	if _, err := d2.Teardown(ctx, c); err != nil {
		t.Fatal(err)
	}
	if f := e.hostFilters(); slotRE(1).MatchString(f) {
		t.Errorf("filters of slot 1 survived:\n%s", f)
	}
}

// TestClosed: every call on a closed data plane fails with ErrClosed and
// does nothing (a closed netlink handle would act on the caller's namespace,
// here the root namespace).
func TestClosed(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	a := e.start("A", 1, "40960-41983", "31000", "", 31000)
	d := e.newDataPlane()
	if _, err := d.PrepareHost(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := d.Adopt(context.Background(), a.c); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := e.spawn("B", []uint16{31010}, false)
	b := e.spec("B", p, 2, "41984-43007", "31010", "")
	e.cleanupMount(b.ID)
	_, err1 := d.Setup(ctx, b)
	err2 := d.SetPorts(ctx, a.c, ephemeral.MustParseSet("31001"), ephemeral.Set{})
	_, err3 := d.Stats(ctx, a.c)
	_, err4 := d.Teardown(ctx, a.c)
	_, err5 := d.Check(ctx, a.c)
	_, err6 := d.Snapshot(ctx)
	_, err7 := d.RemoveStrays(ctx, nil)
	_, err8 := d.PrepareHost(ctx)
	for i, err := range []error{err1, err2, err3, err4, err5, err6, err7, err8} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("call %d on a closed data plane: %v", i+1, err)
		}
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
}

// TestCopiesHostSysctls: host sysctls that differ from a new namespace's
// defaults are copied into containers; the others are not written at all.
func TestCopiesHostSysctls(t *testing.T) {
	checkRootUnchanged(t)
	sb := sandbox.New(t)
	if err := sb.Host.Do(func() error {
		return sysctl.Here(func(sd *sysctl.Dir) error {
			if err := sd.Write("net/core/somaxconn", "777"); err != nil {
				return err
			}
			return sd.Write("net/ipv4/tcp_keepalive_time", "1234")
		})
	}); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, sb: sb, ops: new(atomic.Int64), errs: new(atomic.Int64)}
	e.d = e.newDataPlane()
	var err error
	if e.info, err = e.d.PrepareHost(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range e.d.copy {
		got[kv.Name] = kv.Value
	}
	if len(got) != 2 || got["net/core/somaxconn"] != "777" || got["net/ipv4/tcp_keepalive_time"] != "1234" {
		t.Errorf("sysctls to copy = %v, want only the two changed ones", e.d.copy)
	}
	a := e.start("A", 1, "40960-41983", "31000", "", 31000)
	for k, want := range map[string]string{"net/core/somaxconn": "777", "net/ipv4/tcp_keepalive_time": "1234"} {
		var v string
		read := func(sd *sysctl.Dir) (err error) { v, err = sd.Read(k); return err }
		if err := a.proc.Do(func() error { return sysctl.Here(read) }); err != nil || v != want {
			t.Errorf("container %s = %q (%v), want %s", k, v, err, want)
		}
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
}
