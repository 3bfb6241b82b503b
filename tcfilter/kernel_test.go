package tcfilter

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/test/sandbox"
)

// kernelEnv is a sandbox host namespace with a netlink handle and a few
// veth pairs that serve as redirect targets.
type kernelEnv struct {
	s       *sandbox.Sandbox
	h       *netlink.Handle
	eth0    int
	lo      int
	sink    int        // the IPv6 demux's counting mirrors' drop sink (EnsureSink)
	sinks   *DropSinks // the per-reason sinks (EnsureDropSinks)
	targets []int
}

func newKernelEnv(t testing.TB, ntargets int) *kernelEnv {
	t.Helper()
	s := sandbox.New(t) // skips unless root
	h, err := s.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	e := &kernelEnv{s: s, h: h}
	e.eth0 = e.index(t, s.HostEth0)
	e.lo = e.index(t, "lo")
	sk, bpfErr, err := EnsureSink(h, SinkName)
	if err != nil || bpfErr != nil || !sk.BPF {
		t.Fatalf("drop sink: %+v %v %v", sk, bpfErr, err)
	}
	e.sink = sk.Index
	e.sinks = ensureDropSinks(t, s)
	for i := 0; i < ntargets; i++ {
		name := fmt.Sprintf("tgt%d", i)
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
		if err := h.LinkAdd(v); err != nil {
			t.Fatalf("add veth %s: %v", name, err)
		}
		for _, n := range []string{name, name + "p"} {
			l, err := h.LinkByName(n)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
		e.targets = append(e.targets, e.index(t, name))
	}
	return e
}

// ensureDropSinks makes the sandbox host's drop sinks (IPv6 off on each)
// and checks they count.
func ensureDropSinks(t testing.TB, s *sandbox.Sandbox) *DropSinks {
	t.Helper()
	h, err := s.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	prepare := func(_ int, name string) error {
		return s.Host.Do(func() error { return sysctls(map[string]string{"net/ipv6/conf/" + name + "/disable_ipv6": "1"}) })
	}
	sinks, bpfErr, err := EnsureDropSinks(h, s.Host.Do, prepare)
	if err != nil || bpfErr != nil || !sinks.BPF() {
		t.Fatalf("drop sinks: %v %v", bpfErr, err)
	}
	t.Cleanup(sinks.Close)
	return sinks
}

func (e *kernelEnv) index(t testing.TB, name string) int {
	t.Helper()
	l, err := e.h.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l.Attrs().Index
}

// tcShow is `tc filter show dev DEV ingress` in the host namespace.
// The reference counts of a shared action change with the nodes elsewhere
// that use it (and lag behind a deletion, released in deferred work), so
// tcShow leaves them out.
var actionRefs = regexp.MustCompile(` ref \d+ bind \d+`)

func (e *kernelEnv) tcShow(t testing.TB, dev string) string {
	t.Helper()
	return actionRefs.ReplaceAllString(e.s.Host.Run(t, "tc", "filter", "show", "dev", dev, "ingress"), "")
}

// tables lists the hash tables tc shows ("fh 2: ht divisor 256" -> "2:/256").
func tables(show string) []string {
	re := regexp.MustCompile(`fh ([0-9a-f]+): ht divisor (\d+)`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(show, -1) {
		out = append(out, m[1]+":/"+m[2])
	}
	slices.Sort(out)
	return out
}

// handles lists the node handles tc shows.
func handles(show string) []string {
	re := regexp.MustCompile(`fh ([0-9a-f]+:[0-9a-f]*:[0-9a-f]+) `)
	var out []string
	for _, m := range re.FindAllStringSubmatch(show, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return out
}

type opLog struct {
	mu  sync.Mutex
	ops []Op
}

func (l *opLog) observe(o Op) {
	l.mu.Lock()
	l.ops = append(l.ops, o)
	l.mu.Unlock()
}

func (l *opLog) count(op, result string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.ops {
		if o.Op == op && o.Result == result {
			n++
		}
	}
	return n
}

func rg(b, e uint16) ephemeral.Range { return ephemeral.Range{Begin: b, End: e} }

func TestHostDemuxLayout(t *testing.T) {
	e := newKernelEnv(t, 3)
	var log opLog
	d := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, log.observe)
	d.SetConn(e.openConn(t)) // range nodes in batches, as the data plane does
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	start := e.tcShow(t, "eth0")
	if got, want := tables(start), []string{"1:/1", "2:/256", "3:/1", "4:/1", "6:/256"}; !containsAll(got, want) {
		t.Fatalf("tables after Init = %v, want at least %v\n%s", got, want, start)
	}
	for _, s := range []string{"offset 0f00>>6 at 0  eat", "match 00060000/00ff0000 at 8", "match 00110000/00ff0000 at 8",
		"match 00000000/00001fff at 4", "match c6120001/ffffffff at 16", "hash mask 0000ff00 at 0", "match 08000000/ff000000 at 0"} {
		if !strings.Contains(start, s) {
			t.Errorf("Init layout lacks %q:\n%s", s, start)
		}
	}
	// Init is idempotent: nothing changes the second time.
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	if again := e.tcShow(t, "eth0"); again != start {
		t.Fatalf("second Init changed the device:\n%s\n---\n%s", start, again)
	}

	a, b, c := e.targets[0], e.targets[1], e.targets[2]
	if err := d.AddRanges(1, a, []ephemeral.Range{rg(32768, 33791)}); err != nil { // 1024 ports: 4 H1 nodes
		t.Fatal(err)
	}
	if err := d.AddRanges(2, b, []ephemeral.Range{rg(33792, 34047), rg(8080, 8080), rg(8096, 8127)}); err != nil {
		t.Fatal(err)
	}
	if err := d.AddRanges(3, c, []ephemeral.Range{rg(8081, 8081), rg(8084, 8087), rg(8192, 8255)}); err != nil {
		t.Fatal(err)
	}
	show := e.tcShow(t, "eth0")
	wantHandles := []string{
		"2:80:20a", "2:81:20a", "2:82:20a", "2:83:20a", // slot 1, 1024 ports
		"2:84:208",             // slot 2, 256 ports
		"2:1f:800", "2:20:800", // links to H2 1f and 20
		"11f:9:190", "11f:9:191", // 8080 (0x1f90) and 8081: size 1, heap ids 256+0x90, 256+0x91
		"11f:9:65",           // 8084-8087: size 4: 64 + 0x94>>2
		"11f:a:d", "11f:b:d", // 8096-8127 (0x1fa0, 32 ports): 8 + 0xa0>>5 = 0xd, buckets a and b
		"120::4", "120:1:4", "120:2:4", "120:3:4", // 8192-8255: 64 ports, 4 + 0 = 4
	}
	gotHandles := handles(show)
	if !containsAll(gotHandles, wantHandles) {
		t.Fatalf("handles %v\nwant all of %v\n%s", gotHandles, wantHandles, show)
	}
	if got := tables(show); !containsAll(got, []string{"11f:/16", "120:/16"}) {
		t.Fatalf("H2 tables not created: %v", got)
	}
	if !strings.Contains(show, "flowid 1:3") || !strings.Contains(show, "match 00001f91/0000ffff at 0") ||
		!strings.Contains(show, "match 00008000/0000fc00 at 0") {
		t.Errorf("range node keys/classids missing:\n%s", show)
	}
	ents, err := d.Entries()
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{EntryRange, 1, a, rg(32768, 33791), MakeU32Handle(TableH1, 0x80, 0x20a)},
		{EntryRange, 2, b, rg(8080, 8080), MakeU32Handle(0x11f, 9, 0x190)},
		{EntryRange, 2, b, rg(8096, 8127), MakeU32Handle(0x11f, 0xa, 0xd)},
		{EntryRange, 2, b, rg(33792, 34047), MakeU32Handle(TableH1, 0x84, 0x208)},
		{EntryRange, 3, c, rg(8081, 8081), MakeU32Handle(0x11f, 9, 0x191)},
		{EntryRange, 3, c, rg(8084, 8087), MakeU32Handle(0x11f, 9, 0x65)},
		{EntryRange, 3, c, rg(8192, 8255), MakeU32Handle(0x120, 0, 4)},
	}
	if !slices.Equal(ents, want) {
		t.Fatalf("Entries:\n got %v\nwant %v", ents, want)
	}

	// re-adding a range the slot has is harmless; a new target is followed
	if err := d.AddRanges(2, b, []ephemeral.Range{rg(8080, 8080), rg(33792, 34047)}); err != nil {
		t.Fatalf("re-add: %v", err)
	}
	if after := e.tcShow(t, "eth0"); after != show {
		t.Fatalf("re-adding the same ranges changed the device")
	}
	if err := d.AddRanges(2, c, []ephemeral.Range{rg(8080, 8080)}); err != nil {
		t.Fatalf("re-add with a new target: %v", err)
	}
	if ents, _ := d.Entries(); !slices.Contains(ents, Entry{EntryRange, 2, c, rg(8080, 8080), MakeU32Handle(0x11f, 9, 0x190)}) {
		t.Fatalf("target not followed: %v", ents)
	}
	if err := d.AddRanges(2, b, []ephemeral.Range{rg(8080, 8080)}); err != nil {
		t.Fatal(err)
	}
	// Exclusive: another slot cannot take ports that are routed already,
	// and nothing changes.
	before := e.tcShow(t, "eth0")
	for _, r := range []ephemeral.Range{rg(33000, 33000), rg(8080, 8095), rg(32768, 65535)} {
		if err := d.AddRanges(9, a, []ephemeral.Range{r}); !errors.Is(err, ErrOverlap) {
			t.Errorf("AddRanges(9, %s) = %v, want ErrOverlap", r, err)
		}
	}
	// the same slot may overlap its own ranges (update: new before old)
	if err := d.AddRanges(1, a, []ephemeral.Range{rg(32768, 33023)}); err != nil {
		t.Fatalf("own overlap: %v", err)
	}
	if _, err := d.DelRanges(1, []ephemeral.Range{rg(32768, 33023)}); err != nil {
		t.Fatal(err)
	}
	// All or nothing: a bad target on the last range rolls back the others
	// (including the H2 table it created).
	err = d.AddRanges(4, 99999, []ephemeral.Range{rg(40000, 40000)})
	if err == nil {
		t.Fatal("AddRanges with a missing target ifindex succeeded")
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if after := e.tcShow(t, "eth0"); after != before {
		t.Fatalf("failed adds changed the device:\n%s\n---\n%s", before, after)
	}

	// Deleting: another slot's range is refused; missing nodes are counted.
	if _, err := d.DelRanges(2, []ephemeral.Range{rg(8081, 8081)}); err == nil {
		t.Error("DelRanges of another slot's range succeeded")
	}
	missing, err := d.DelRanges(2, []ephemeral.Range{rg(33792, 34047), rg(8080, 8080), rg(8096, 8127), rg(50000, 50015)})
	if err != nil || missing != 1 {
		t.Fatalf("DelRanges slot 2 = %d, %v; want 1 missing", missing, err)
	}
	missing, err = d.DelRanges(3, []ephemeral.Range{rg(8081, 8081), rg(8084, 8087), rg(8192, 8255)})
	if err != nil || missing != 0 {
		t.Fatalf("DelRanges slot 3 = %d, %v", missing, err)
	}
	// The last small ranges of buckets 1f and 20 left: their link nodes are
	// gone at once, the tables once the kernel lets go of them.
	if hs := handles(e.tcShow(t, "eth0")); slices.Contains(hs, "2:1f:800") || slices.Contains(hs, "2:20:800") {
		t.Fatalf("H2 links left after their last range: %v", hs)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if ts := tables(e.tcShow(t, "eth0")); slices.Contains(ts, "11f:/16") || slices.Contains(ts, "120:/16") {
		t.Fatalf("H2 tables left after Flush: %v", ts)
	}
	missing, err = d.DelRanges(1, []ephemeral.Range{rg(32768, 33791)})
	if err != nil || missing != 0 {
		t.Fatalf("DelRanges slot 1 = %d, %v", missing, err)
	}
	if end := e.tcShow(t, "eth0"); end != start {
		t.Fatalf("device did not return to its starting filter set:\n%s\n---\n%s", start, end)
	}
	if log.count(OpAdd, ResultOK) == 0 || log.count(OpRemove, ResultNotFound) == 0 || log.count(OpAdd, ResultError) == 0 {
		t.Errorf("observer saw %d ops, missing some results: %+v", len(log.ops), log.ops)
	}

	if err := d.clearAll(); err != nil {
		t.Fatal(err)
	}
	if cleared := e.tcShow(t, "eth0"); strings.TrimSpace(cleared) != "" {
		t.Fatalf("Clear left filters:\n%s", cleared)
	}
}

func containsAll(got, want []string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

// TestHostDemuxRecovery checks that a fresh HostDemux (a restarted daemon)
// finds the nodes of a previous one and keeps enforcing exclusivity.
func TestHostDemuxRecovery(t *testing.T) {
	e := newKernelEnv(t, 2)
	d := NewHostDemux(e.h, e.lo, "lo", nil, nil)
	if err := d.AddRanges(7, e.targets[0], []ephemeral.Range{rg(10000, 10000), rg(32768, 33279)}); err != nil {
		t.Fatal(err)
	}
	if err := d.setShared(9000, []spread.Holder{{Slot: 1, Target: e.targets[0]}, {Slot: 2, Target: e.targets[1]}}); err != nil {
		t.Fatal(err)
	}
	ents1, err := d.Entries()
	if err != nil {
		t.Fatal(err)
	}
	show := e.tcShow(t, "lo")
	if strings.Contains(show, "c6120001") || slices.Contains(tables(show), "5:/1") {
		t.Errorf("lo demux must not match a destination or have fan-out tables:\n%s", show)
	}

	d2 := NewHostDemux(e.h, e.lo, "lo", nil, nil)
	if err := d2.Init(); err != nil {
		t.Fatal(err)
	}
	if again := e.tcShow(t, "lo"); again != show {
		t.Fatalf("Init of a new demux changed the device:\n%s\n---\n%s", show, again)
	}
	ents2, err := d2.Entries()
	if err != nil || !slices.Equal(ents1, ents2) {
		t.Fatalf("entries differ after recovery: %v / %v (%v)", ents1, ents2, err)
	}
	if err := d2.AddRanges(8, e.targets[1], []ephemeral.Range{rg(32768, 32768)}); !errors.Is(err, ErrOverlap) {
		t.Fatalf("recovered demux allowed an overlap: %v", err)
	}
	if err := d2.AddRanges(8, e.targets[1], []ephemeral.Range{rg(8992, 9007)}); !errors.Is(err, ErrOverlap) {
		t.Fatalf("recovered demux allowed a range over a shared port: %v", err)
	}
	// the recovered index knows the shared port: same holders = no change
	if err := d2.setShared(9000, []spread.Holder{{Slot: 2, Target: e.targets[1]}, {Slot: 1, Target: e.targets[0]}}); err != nil {
		t.Fatal(err)
	}
	if again := e.tcShow(t, "lo"); again != show {
		t.Fatalf("idempotent setShared changed the device")
	}
	// a crash left H1[b] linking to an empty H2: Init removes it
	if _, err := d2.DelRanges(7, []ephemeral.Range{rg(10000, 10000)}); err != nil {
		t.Fatal(err)
	}
	if err := d2.setShared(9000, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.DelRanges(7, []ephemeral.Range{rg(32768, 33279)}); err != nil {
		t.Fatal(err)
	}
	if err := d2.Flush(); err != nil {
		t.Fatal(err)
	}
	end := e.tcShow(t, "lo")
	if got := tables(end); !slices.Equal(got, []string{"1:/1", "2:/256", "800:/1"}) {
		t.Fatalf("tables left: %v\n%s", got, end)
	}
	if hs := handles(end); len(hs) != 3 { // 2 root nodes + L's node
		t.Fatalf("nodes left: %v\n%s", hs, end)
	}
}

// TestHostDemuxThousand adds and removes the ranges of 1,000 containers
// (an ephemeral 32-port block and a static port each: ~3,000 nodes and 132
// H2 tables) and checks that the device returns to its starting set.
func TestHostDemuxThousand(t *testing.T) {
	e := newKernelEnv(t, 4)
	d := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil)
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	start := e.tcShow(t, "eth0")
	const n = 1000
	rs := func(i int) []ephemeral.Range {
		b := uint16(32768 + (i-1)*32)
		return []ephemeral.Range{rg(b, b+31), rg(uint16(2000+i), uint16(2000+i))}
	}
	for i := 1; i <= n; i++ {
		if err := d.AddRanges(uint16(i), e.targets[i%4], rs(i)); err != nil {
			t.Fatalf("slot %d: %v", i, err)
		}
		if i <= n/2 {
			if err := d.AddFanout(uint16(i), e.targets[i%4]); err != nil {
				t.Fatalf("fanout %d: %v", i, err)
			}
		}
	}
	ents, err := d.Entries()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, en := range ents {
		counts[en.Kind]++
		if en.Kind == EntryRange && !slices.Contains(rs(int(en.Slot)), en.Range) {
			t.Fatalf("entry %+v is not slot %d's", en, en.Slot)
		}
	}
	if counts[EntryRange] != 2*n || counts[EntryICMP] != n/2 {
		t.Fatalf("entry counts %v", counts)
	}
	show := e.tcShow(t, "eth0")
	nt := len(tables(show))
	if nt < 5+128 {
		t.Fatalf("only %d tables with 1000 containers", nt)
	}
	for i := 1; i <= n; i++ {
		if missing, err := d.DelRanges(uint16(i), rs(i)); err != nil || missing != 0 {
			t.Fatalf("del slot %d: %d %v", i, missing, err)
		}
		if i <= n/2 {
			if missing, err := d.DelFanout(uint16(i)); err != nil || missing != 0 {
				t.Fatalf("del fanout %d: %d %v", i, missing, err)
			}
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if end := e.tcShow(t, "eth0"); end != start {
		t.Fatalf("device did not return to its starting set (tables %v)", tables(end))
	}
}

func TestFanoutAndShared(t *testing.T) {
	e := newKernelEnv(t, 3)
	d := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil)
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	start := e.tcShow(t, "eth0")
	// more than 32 containers: one node each, no action limit
	for s := uint16(1); s <= 40; s++ {
		if err := d.AddFanout(s, e.targets[int(s)%3]); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.AddFanout(5, e.targets[0]); err != nil { // replace target
		t.Fatal(err)
	}
	show := e.tcShow(t, "eth0")
	if strings.Contains(show, "fh 5::") || !strings.Contains(show, "fh 4::28 ") || !strings.Contains(show, "Egress Mirror") {
		t.Fatalf("fan-out nodes missing:\n%s", show)
	}
	if lo := NewHostDemux(e.h, e.lo, "lo", nil, nil); !errors.Is(lo.AddFanout(1, e.targets[0]), ErrNoFanout) {
		t.Error("fan-out on lo accepted")
	}

	hs := []spread.Holder{{Slot: 1, Target: e.targets[0]}, {Slot: 2, Target: e.targets[1]}}
	if err := d.setShared(8080, hs); err != nil {
		t.Fatal(err)
	}
	if err := d.AddRanges(3, e.targets[2], []ephemeral.Range{rg(8080, 8083)}); !errors.Is(err, ErrOverlap) {
		t.Fatalf("range over a shared port: %v", err)
	}
	if err := d.AddRanges(3, e.targets[2], []ephemeral.Range{rg(8084, 8087)}); err != nil {
		t.Fatal(err)
	}
	if err := d.setShared(8085, hs); !errors.Is(err, ErrOverlap) {
		t.Fatalf("shared port inside a range: %v", err)
	}
	show = e.tcShow(t, "eth0")
	for _, s := range []string{"fh 11f:9:490 ", "link 200:", "hash mask 01fe0000 at 0", "fh 200:ff:800 ", "fh 200::800 "} {
		if !strings.Contains(show, s) {
			t.Errorf("shared layout lacks %q", s)
		}
	}
	check := func(holders []spread.Holder) map[uint16]int {
		t.Helper()
		ents, err := d.Entries()
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint16]int{}
		for _, en := range ents {
			if en.Kind == EntryShared {
				got[en.Slot] = en.Target
				if en.Range != rg(8080, 8080) {
					t.Errorf("shared entry %+v", en)
				}
			}
		}
		want := map[uint16]int{}
		for _, h := range holders {
			want[h.Slot] = h.Target
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("shared holders %v, want %v", got, want)
		}
		return got
	}
	check(hs)
	hs3 := append(hs, spread.Holder{Slot: 3, Target: e.targets[2]})
	if err := d.setShared(8080, hs3); err != nil {
		t.Fatal(err)
	}
	check(hs3)
	if err := d.setShared(8080, hs3[1:]); err != nil {
		t.Fatal(err)
	}
	check(hs3[1:])
	if err := d.setShared(8080, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.setShared(8080, nil); err != nil { // idempotent
		t.Fatal(err)
	}
	// no node of the spread table outlives the sharing, even before Flush
	if hs := handles(e.tcShow(t, "eth0")); slices.ContainsFunc(hs, func(h string) bool { return strings.HasPrefix(h, "200:") || strings.HasPrefix(h, "11f:9:490") }) {
		t.Fatalf("shared-port nodes left: %v", hs)
	}
	if _, err := d.DelRanges(3, []ephemeral.Range{rg(8084, 8087)}); err != nil {
		t.Fatal(err)
	}
	for s := uint16(1); s <= 40; s++ {
		if m, err := d.DelFanout(s); err != nil || m != 0 {
			t.Fatalf("DelFanout(%d) = %d, %v", s, m, err)
		}
	}
	if m, err := d.DelFanout(1); err != nil || m != 1 {
		t.Fatalf("second DelFanout = %d, %v; want 1 missing", m, err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if end := e.tcShow(t, "eth0"); end != start {
		t.Fatalf("device did not return to its starting set:\n%s\n---\n%s", start, end)
	}
}

func TestEnsureClsactAcceptsIngress(t *testing.T) {
	e := newKernelEnv(t, 1)
	e.s.Host.Run(t, "tc", "qdisc", "add", "dev", "tgt0", "ingress")
	if err := EnsureClsact(e.h, e.targets[0]); err != nil {
		t.Fatal(err)
	}
	if err := EnsureClsact(e.h, e.eth0); err != nil {
		t.Fatal(err)
	}
	if err := EnsureClsact(e.h, e.eth0); err != nil { // idempotent
		t.Fatal(err)
	}
	q := e.s.Host.Run(t, "tc", "qdisc", "show", "dev", "tgt0")
	if !strings.Contains(q, "qdisc ingress ffff:") {
		t.Fatalf("ingress qdisc replaced: %s", q)
	}
	if q := e.s.Host.Run(t, "tc", "qdisc", "show", "dev", "eth0"); !strings.Contains(q, "qdisc clsact ffff:") {
		t.Fatalf("no clsact: %s", q)
	}
	// the demux works under an ingress qdisc as well
	d := NewHostDemux(e.h, e.targets[0], "tgt0", e.s.HostIP, nil)
	if err := d.AddRanges(1, e.eth0, []ephemeral.Range{rg(1024, 2047)}); err != nil {
		t.Fatal(err)
	}
	ents, err := d.Entries()
	if err != nil || len(ents) != 1 {
		t.Fatalf("entries under ingress qdisc: %v %v", ents, err)
	}
	if err := d.clearAll(); err != nil {
		t.Fatal(err)
	}
}

func TestVethAndContainerFilters(t *testing.T) {
	e := newKernelEnv(t, 2)
	v := VethFilters{H: e.h, C: e.openConn(t), Veth: e.targets[0], Eth0: e.eth0, Lo: e.lo, Sinks: e.sinks, VLAN: true, HostIP: e.s.HostIP, MAC: e.s.HostMAC, Slot: 42}
	old := []ephemeral.Range{rg(32768, 33791), rg(8080, 8080)}
	if err := v.Install(old); err != nil {
		t.Fatal(err)
	}
	if err := v.Install(old); err != nil { // re-runnable
		t.Fatal(err)
	}
	show := e.tcShow(t, "tgt0")
	for _, s := range []string{"fh 11:80:20a ", "fh 13:83:20a ", "fh 11:1f:190 ", "fh 13:1f:190 ",
		"match 80000000/fc000000 at 0", "hash mask ff000000 at 0", "flowid 1:2a", "protocol arp"} {
		if !strings.Contains(show, s) {
			t.Errorf("veth filters lack %q", s)
		}
	}
	nw := []ephemeral.Range{rg(32768, 33791), rg(9000, 9001)}
	if err := v.SetRanges(old, nw); err != nil {
		t.Fatal(err)
	}
	show2 := e.tcShow(t, "tgt0")
	if strings.Contains(show2, "fh 11:1f:190 ") || !strings.Contains(show2, "fh 11:23:94 ") || !strings.Contains(show2, "fh 11:80:20a ") {
		t.Fatalf("SetRanges result wrong:\n%s", show2)
	}
	// a failing add (bad redirect target) leaves everything as it was
	bad := v
	bad.Lo = 99999
	if err := bad.SetRanges(nw, []ephemeral.Range{rg(40000, 40000)}); err == nil {
		t.Fatal("SetRanges with a bad target succeeded")
	}
	if show3 := e.tcShow(t, "tgt0"); show3 != show2 {
		t.Fatalf("failed SetRanges changed the veth")
	}

	c := ContainerFilters{H: e.h, C: v.C, Lo: e.targets[1], Eth0: e.index(t, "tgt1p"), HostIP: e.s.HostIP}
	if err := c.Install(old); err != nil {
		t.Fatal(err)
	}
	lo := e.tcShow(t, "tgt1")
	eth := e.tcShow(t, "tgt1p")
	if !strings.Contains(lo, "fh 21:80:20a ") || !strings.Contains(lo, "match 7f000000/ff000000 at 16") ||
		!strings.Contains(eth, "fh 23:1f:190 ") || !strings.Contains(eth, "Egress Redirect to device tgt1") {
		t.Fatalf("container filters:\n%s\n---\n%s", lo, eth)
	}
	if err := c.SetRanges(old, nil); err != nil {
		t.Fatal(err)
	}
	if hs := handles(e.tcShow(t, "tgt1")); slices.ContainsFunc(hs, func(h string) bool { return strings.HasPrefix(h, "21:") }) {
		t.Fatalf("container lo range nodes left: %v", hs)
	}
}

func TestValidation(t *testing.T) {
	d := NewHostDemux(nil, 1, "eth0", nil, nil)
	if err := d.AddRanges(0, 5, nil); !errors.Is(err, ErrBadSlot) {
		t.Errorf("slot 0: %v", err)
	}
	if err := d.AddRanges(1, 5, []ephemeral.Range{rg(10, 20)}); !errors.Is(err, ErrNotAligned) {
		t.Errorf("unaligned: %v", err)
	}
	if err := d.AddRanges(1, 5, []ephemeral.Range{rg(16, 31), rg(16, 16)}); err == nil {
		t.Error("overlapping input accepted")
	}
	if err := d.setShared(80, make([]spread.Holder, 2)); !errors.Is(err, ErrBadSlot) {
		t.Errorf("bad holder: %v", err)
	}
	_ = unix.EEXIST
}
