package isolator

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

var bg = context.Background()

func ports(spec string) []PortSpec {
	var out []PortSpec
	for _, r := range ephemeral.MustParseSet(spec).Ranges() {
		out = append(out, PortSpec{Begin: uint32(r.Begin), End: uint32(r.End)})
	}
	return out
}

func sharedPorts(spec string) []PortSpec {
	out := ports(spec)
	for i := range out {
		out[i].Shared = true
	}
	return out
}

func wantCode(t *testing.T, err error, code *Kind, contains ...string) {
	t.Helper()
	if !errors.Is(err, code) || KindOf(err) != code {
		t.Fatalf("got %v (kind %v), want kind %v", err, KindOf(err), code)
	}
	for _, c := range contains {
		if !strings.Contains(err.Error(), c) {
			t.Fatalf("error %q does not mention %q", err, c)
		}
	}
}

func self() IsolateTarget { return IsolateTarget{Pid: os.Getpid()} }

func TestLifecycle(t *testing.T) {
	dp := newFakeDP()
	s := newTestIsolator(t, t.TempDir(), dp)

	r, err := s.Prepare(bg, "c1", ports("31000-31009"))
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StatePrepared || r.Ephemeral != (ephemeral.Range{Begin: 32768, End: 33023}) || r.Ports.String() != "31000-31009" {
		t.Fatalf("prepare: %+v", r)
	}
	// Same request again: same answer.
	r2, err := s.Prepare(bg, "c1", ports("31000-31009"))
	if err != nil || r2.Ephemeral != r.Ephemeral {
		t.Fatalf("repeat prepare: %+v %v", r2, err)
	}
	// Different ports: AlreadyExists.
	_, err = s.Prepare(bg, "c1", ports("31000-31010"))
	wantCode(t, err, ErrAlreadyExists, "c1")

	// Conflict names the holder.
	_, err = s.Prepare(bg, "c2", ports("31005"))
	wantCode(t, err, ErrFailedPrecondition, "31005", "c1")
	if _, err := s.Get(bg, "c2"); KindOf(err) != ErrNotFound {
		t.Fatalf("rejected prepare left c2 behind: %v", err)
	}

	// Isolate before prepare.
	_, err = s.Isolate(bg, "c9", self())
	wantCode(t, err, ErrFailedPrecondition, "not prepared")

	r, err = s.Isolate(bg, "c1", self())
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StateIsolated || r.Mount != "/fake/netns/c1" || r.Pid != os.Getpid() {
		t.Fatalf("isolate: %+v", r)
	}
	if _, err := s.Isolate(bg, "c1", self()); err != nil {
		t.Fatalf("repeat isolate: %v", err)
	}
	_, err = s.Isolate(bg, "c1", IsolateTarget{Pid: os.Getppid()})
	wantCode(t, err, ErrAlreadyExists, "already isolated")
	// One namespace holds one container.
	if _, err := s.Prepare(bg, "c3", nil); err != nil {
		t.Fatal(err)
	}
	_, err = s.Isolate(bg, "c3", self())
	wantCode(t, err, ErrFailedPrecondition, "already holds container c1")
	if err := s.Cleanup(bg, "c3"); err != nil {
		t.Fatal(err)
	}

	// Update moves the kernel filters and the ledger.
	r, err = s.Update(bg, "c1", ports("31100-31101"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Ports.String() != "31100-31101" || r.State != StateIsolated {
		t.Fatalf("update: %+v", r)
	}
	own := dp.Owners()
	if len(own[31000]) != 0 || len(own[31100]) != 1 {
		t.Fatalf("update did not move filters: 31000=%v 31100=%v", own[31000], own[31100])
	}
	// The released port is free for another container now.
	if _, err := s.Prepare(bg, "c2", ports("31005")); err != nil {
		t.Fatalf("port released by update not reusable: %v", err)
	}

	_, st, err := s.Usage(bg, "c1")
	if err != nil || st.RxBytes != 100 {
		t.Fatalf("usage: %+v %v", st, err)
	}
	// The namespace's figures come with the counters when they can be
	// read, and their absence fails nothing.
	_, st, ns, err := s.UsageWithSockets(bg, "c1")
	if err != nil || st.RxBytes != 100 || ns != nil {
		t.Fatalf("usage without namespace figures: %+v %+v %v", st, ns, err)
	}
	dp.Sockets = &plane.SocketStats{TCPConnections: 3, SNMP: map[string]map[string]uint64{"Tcp": {"ActiveOpens": 7}}}
	if _, st, ns, err = s.UsageWithSockets(bg, "c1"); err != nil || st.RxBytes != 100 || ns == nil || ns.TCPConnections != 3 {
		t.Fatalf("usage with namespace figures: %+v %+v %v", st, ns, err)
	}

	if err := s.Cleanup(bg, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Cleanup(bg, "c1"); err != nil {
		t.Fatalf("second cleanup: %v", err)
	}
	if err := s.Cleanup(bg, "c2"); err != nil { // never isolated
		t.Fatalf("cleanup of prepared: %v", err)
	}
	if len(dp.Owners()) != 0 || len(dp.Plumbed) != 0 {
		t.Fatalf("cleanup left kernel state: %v", dp.Owners())
	}
	st2 := s.Status(bg)
	if st2.BlocksUsed != 0 || !st2.ExclusivePorts.Empty() {
		t.Fatalf("status after cleanup: %+v", st2)
	}
}

func TestExhaustionAndRelease(t *testing.T) {
	s := newTestIsolator(t, t.TempDir(), newFakeDP())
	for i := 0; i < 4; i++ {
		if _, err := s.Prepare(bg, fmt.Sprintf("c%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.Prepare(bg, "c4", nil)
	wantCode(t, err, ErrResourceExhausted, "no ephemeral port block left")
	if err := s.Cleanup(bg, "c2"); err != nil {
		t.Fatal(err)
	}
	r, err := s.Prepare(bg, "c4", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ephemeral.Begin != 32768+2*256 {
		t.Fatalf("first fit should reuse c2's block, got %v", r.Ephemeral)
	}
}

func TestSetupFailureRollsBack(t *testing.T) {
	dp := newFakeDP()
	s := newTestIsolator(t, t.TempDir(), dp)
	if _, err := s.Prepare(bg, "c1", ports("31000")); err != nil {
		t.Fatal(err)
	}
	dp.FailNext["setup"] = fmt.Errorf("boom")
	_, err := s.Isolate(bg, "c1", self())
	wantCode(t, err, ErrInternal, "boom")
	r, _ := s.Get(bg, "c1")
	if r.State != StatePrepared || r.Pid != 0 {
		t.Fatalf("failed isolate left %+v", r)
	}
	// It can be isolated afterwards.
	if _, err := s.Isolate(bg, "c1", self()); err != nil {
		t.Fatal(err)
	}
}

func TestHostNamespaceRefused(t *testing.T) {
	dp := newFakeDP()
	ino, err := dp.NetNSInode("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	dp.HostIno = ino
	s := newTestIsolator(t, t.TempDir(), dp)
	if _, err := s.Prepare(bg, "c1", nil); err != nil {
		t.Fatal(err)
	}
	_, err = s.Isolate(bg, "c1", self())
	wantCode(t, err, ErrFailedPrecondition, "host's own network namespace")
	if r, _ := s.Get(bg, "c1"); r.State != StatePrepared {
		t.Fatalf("state changed: %+v", r)
	}
}

func TestBadInput(t *testing.T) {
	s := newTestIsolator(t, t.TempDir(), newFakeDP())
	if _, err := s.Prepare(bg, "held", ports("31500")); err != nil {
		t.Fatal(err)
	}
	before := s.List(bg)
	cases := []struct {
		name string
		call func() error
		code *Kind
		msg  string
	}{
		{"empty id", func() error { _, err := s.Prepare(bg, "", nil); return err }, ErrInvalidArgument, "container_id"},
		{"slash id", func() error { _, err := s.Prepare(bg, "a/b", nil); return err }, ErrInvalidArgument, "container_id"},
		{"port 0", func() error { _, err := s.Prepare(bg, "x", []PortSpec{{0, 5, false}}); return err }, ErrInvalidArgument, "ports[0].begin"},
		{"port too big", func() error { _, err := s.Prepare(bg, "x", []PortSpec{{31000, 70000, false}}); return err }, ErrInvalidArgument, "ports[0].end"},
		{"reversed", func() error { _, err := s.Prepare(bg, "x", []PortSpec{{31010, 31000, false}}); return err }, ErrInvalidArgument, "reversed"},
		{"unmanaged", func() error { _, err := s.Prepare(bg, "x", ports("40000")); return err }, ErrInvalidArgument, "40000"},
		{"ephemeral pool", func() error { _, err := s.Prepare(bg, "x", ports("32768")); return err }, ErrInvalidArgument, "32768"},
		{"held", func() error { _, err := s.Prepare(bg, "x", ports("31500")); return err }, ErrFailedPrecondition, "held"},
		{"shared on exclusive", func() error { _, err := s.Prepare(bg, "x", sharedPorts("31500")); return err }, ErrFailedPrecondition, "held"},
		{"both shared and exclusive", func() error {
			_, err := s.Prepare(bg, "x", append(ports("31600"), sharedPorts("31600")...))
			return err
		}, ErrInvalidArgument, "both shared and exclusive"},
		{"isolate pid 0", func() error { _, err := s.Isolate(bg, "held", IsolateTarget{}); return err }, ErrInvalidArgument, "pid"},
		{"isolate pid negative", func() error { _, err := s.Isolate(bg, "held", IsolateTarget{Pid: -3}); return err }, ErrInvalidArgument, "pid"},
		{"isolate missing pid", func() error { _, err := s.Isolate(bg, "held", IsolateTarget{Pid: 1 << 30}); return err }, ErrNotFound, "pid"},
		{"isolate missing netns", func() error { _, err := s.Isolate(bg, "held", IsolateTarget{NetNSPath: "/nonexistent/ns"}); return err }, ErrNotFound, "netns_path"},
		{"isolate not a netns", func() error { _, err := s.Isolate(bg, "held", IsolateTarget{NetNSPath: "/etc/hostname"}); return err }, ErrNotFound, "not a network namespace"},
		{"isolate non-network namespace", func() error {
			_, err := s.Isolate(bg, "held", IsolateTarget{NetNSPath: "/proc/self/ns/uts"})
			return err
		}, ErrNotFound, "not a network namespace"},
		{"update unknown", func() error { _, err := s.Update(bg, "nope", nil); return err }, ErrNotFound, "nope"},
		{"get unknown", func() error { _, err := s.Get(bg, "nope"); return err }, ErrNotFound, "nope"},
		{"usage unknown", func() error { _, _, err := s.Usage(bg, "nope"); return err }, ErrNotFound, "nope"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantCode(t, c.call(), c.code, c.msg)
			after := s.List(bg)
			if fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("state changed:\n%v\n%v", before, after)
			}
		})
	}
}

// checkInvariants asserts that no exclusive port and no block is held twice,
// in the bookkeeping and in the (fake) kernel, and that kernel state matches
// the records.
func checkInvariants(t *testing.T, s *Isolator, dp *fakeDP) {
	t.Helper()
	recs := s.List(bg)
	blocks := map[ephemeral.Range]string{}
	excl := map[uint16]string{}
	shared := map[uint16][]string{}
	for _, r := range recs {
		if o, ok := blocks[r.Ephemeral]; ok {
			t.Fatalf("block %v held by %s and %s", r.Ephemeral, o, r.ID)
		}
		blocks[r.Ephemeral] = r.ID
		for _, p := range r.Ports.Ports() {
			if o, ok := excl[p]; ok {
				t.Fatalf("port %d held by %s and %s", p, o, r.ID)
			}
			excl[p] = r.ID
		}
		for _, p := range r.Shared.Ports() {
			shared[p] = append(shared[p], r.ID)
		}
	}
	for p := range shared {
		if o, ok := excl[p]; ok {
			t.Fatalf("port %d held exclusively by %s and shared by %v", p, o, shared[p])
		}
	}
	for p, ids := range dp.Owners() {
		if len(ids) > 1 && len(shared[p]) < len(ids) {
			t.Fatalf("kernel: port %d points to %v", p, ids)
		}
	}
	for _, r := range recs {
		_, plumbed := dp.Plumbed[r.ID]
		if plumbed != (r.State == StateIsolated) {
			t.Fatalf("container %s is %s but plumbed=%v", r.ID, r.State, plumbed)
		}
	}
	for id := range dp.Plumbed {
		if _, err := s.Get(bg, id); err != nil {
			t.Fatalf("kernel has %s which no record knows", id)
		}
	}
}

func TestConcurrentClients(t *testing.T) {
	dp := newFakeDP()
	cfg := testConfig(t, t.TempDir())
	cfg.EphemeralPool = ephemeral.MustParseSet("32768-34815") // 8 blocks
	s, err := New(cfg, dp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Start(bg); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var isolated, updated atomic.Int64
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < 60; i++ {
				id := fmt.Sprintf("c%d", rng.Intn(12))
				p := 31000 + rng.Intn(8)
				spec := []PortSpec{{uint32(p), uint32(p + rng.Intn(2)), rng.Intn(3) == 0}}
				switch rng.Intn(5) {
				case 0, 1:
					_, _ = s.Prepare(bg, id, spec)
				case 2:
					if _, err := s.Isolate(bg, id, nsTarget(t, id)); err == nil {
						isolated.Add(1)
					}
				case 3:
					if _, err := s.Update(bg, id, spec); err == nil {
						updated.Add(1)
					}
				case 4:
					_ = s.Cleanup(bg, id)
				}
			}
		}(w)
	}
	wg.Wait()
	if isolated.Load() < 20 || updated.Load() < 20 {
		t.Fatalf("too few successful calls to mean anything: %d isolates, %d updates", isolated.Load(), updated.Load())
	}
	checkInvariants(t, s, dp)
	for _, r := range s.List(bg) {
		if err := s.Cleanup(bg, r.ID); err != nil {
			t.Fatal(err)
		}
	}
	checkInvariants(t, s, dp)
	if st := s.Status(bg); st.BlocksUsed != 0 || !st.ExclusivePorts.Union(st.SharedPorts).Empty() {
		t.Fatalf("leak after cleanup: %+v", st)
	}
}

// crash is what the fault hook panics with.
type crash struct{ point string }

// TestCrashRecovery kills the lifecycle at every hook point of isolate,
// update and cleanup (a panic stands for kill -9: nothing after it runs),
// restarts on the same state and the same (fake) kernel, and checks that
// nothing leaked and nothing is held twice, that the container ends in the
// state its step left it (want: "" for gone; "any" when recovery may roll
// forward or back) and that the intent journal is empty after the start.
func TestCrashRecovery(t *testing.T) {
	cases := []struct{ point, op, want string }{
		{"isolate:intent", "isolate", "any"},
		{"isolate:plumbed", "isolate", "any"},
		{"isolate:outcome", "isolate", string(StateIsolated)}, // plumbed, the outcome not yet written: the intent leads to it
		{"update:intent", "update", "any"},
		{"commit:stored", "update", string(StateIsolated)},
		{"cleanup:intent", "cleanup", ""},
		{"cleanup:torndown", "cleanup", ""},
		{"cleanup:deleted", "cleanup-prepared", ""}, // record deleted, intent not yet removed
	}
	for _, tc := range cases {
		point := tc.point
		t.Run(tc.op+"/"+point, func(t *testing.T) {
			dir := t.TempDir()
			dp := newFakeDP()
			s := newTestIsolator(t, dir, dp)
			if _, err := s.Prepare(bg, "keep", ports("31000")); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Isolate(bg, "keep", nsTarget(t, "keep")); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Prepare(bg, "c1", ports("31001")); err != nil {
				t.Fatal(err)
			}
			if tc.op != "isolate" && tc.op != "cleanup-prepared" {
				if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
					t.Fatal(err)
				}
			}
			s.SetHook(func(p string) {
				if p == point {
					panic(crash{p})
				}
			})
			func() {
				defer func() {
					if v := recover(); v == nil {
						t.Fatalf("hook %s never fired", point)
					}
				}()
				switch tc.op {
				case "isolate":
					_, _ = s.Isolate(bg, "c1", nsTarget(t, "c1"))
				case "update":
					_, _ = s.Update(bg, "c1", ports("31002-31003"))
				default:
					_ = s.Cleanup(bg, "c1")
				}
			}()
			s.Close()

			s2 := newTestIsolator(t, dir, dp)
			checkInvariants(t, s2, dp)
			r, err := s2.Get(bg, "c1")
			switch {
			case tc.want == "" && err == nil:
				t.Fatalf("c1 is back after its cleanup: %+v", r)
			case tc.want != "" && tc.want != "any" && (err != nil || string(r.State) != tc.want):
				t.Fatalf("c1: %+v %v, want state %s", r, err, tc.want)
			case tc.op == "update" && tc.want != "any" && !r.Ports.Equal(ephemeral.MustParseSet("31002-31003")):
				t.Fatalf("c1's ports %s, want the new 31002-31003", r.Ports)
			}
			if left := journalFiles(t, dir); len(left) > 0 {
				t.Fatalf("intent journal not empty after the start: %v", left)
			}
			if r, err := s2.Get(bg, "keep"); err != nil || r.State != StateIsolated {
				t.Fatalf("untouched container not kept: %+v %v", r, err)
			}
			// Everything can be cleaned and every port reused.
			for _, r := range s2.List(bg) {
				if err := s2.Cleanup(bg, r.ID); err != nil {
					t.Fatal(err)
				}
			}
			checkInvariants(t, s2, dp)
			if len(dp.Plumbed) != 0 || len(dp.Owners()) != 0 {
				t.Fatalf("leak: %v %v", dp.Plumbed, dp.Owners())
			}
			if _, err := s2.Prepare(bg, "again", ports("31000-31003")); err != nil {
				t.Fatalf("ports not reusable: %v", err)
			}
		})
	}
}

func TestRecoveryDecisions(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newTestIsolator(t, dir, dp)
	for _, id := range []string{"alive", "gone", "broken"} {
		if _, err := s.Prepare(bg, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Isolate(bg, "alive", nsTarget(t, "alive")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "broken", nsTarget(t, "broken")); err != nil {
		t.Fatal(err)
	}
	// "gone": isolated into a namespace whose owner has disappeared.
	if _, err := s.Isolate(bg, "gone", self()); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.records["gone"].PidStart++ // a different process now has that pid
	g := *s.records["gone"]
	s.mu.Unlock()
	if err := s.store.Put(&g); err != nil {
		t.Fatal(err)
	}
	// A stray: plumbing nobody knows about.
	dp.Plumbed["stray"] = plane.Container{ID: "stray"}
	// "broken": its veth was removed behind our back.
	dp.Missing["broken"] = []string{"veth"}
	s.Close()

	s2 := newTestIsolator(t, dir, dp)
	if _, err := s2.Get(bg, "gone"); KindOf(err) != ErrNotFound {
		t.Fatalf("container with a gone namespace was not cleaned up: %v", err)
	}
	if r, _ := s2.Get(bg, "alive"); r.State != StateIsolated {
		t.Fatalf("alive: %+v", r)
	}
	if r, _ := s2.Get(bg, "broken"); r.State != StateIsolated {
		t.Fatalf("broken should be re-plumbed: %+v", r)
	}
	// What no record explains is left in place and reported, never
	// removed at start-up; the operator's RemoveUnattributed removes it.
	if _, ok := dp.Plumbed["stray"]; !ok {
		t.Fatal("stray removed at start-up")
	}
	if u := s2.Unattributed(); len(u) != 1 || !strings.Contains(u[0], "stray") {
		t.Fatalf("unattributed: %v", u)
	}
	removed, err := s2.RemoveUnattributed(bg)
	if err != nil || len(removed) != 1 {
		t.Fatalf("RemoveUnattributed: %v, %v", removed, err)
	}
	if _, ok := dp.Plumbed["stray"]; ok {
		t.Fatal("stray not removed on request")
	}
	if _, ok := dp.Plumbed["alive"]; !ok {
		t.Fatal("RemoveUnattributed removed a known container")
	}
}
