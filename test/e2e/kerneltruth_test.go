package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/daemonproc"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// The kernel is the truth: no state fault, second daemon or signal may tear
// down running containers. Each test below runs three containers carrying
// live traffic (exclusive ports, a port shared by two of them, bandwidth
// limits, labels), applies one fault, and asserts that every container is
// still reachable, listed with the same ports, ephemeral block and limits,
// and that nothing leaked or went missing in the host namespace.

const (
	ktPort1, ktPort2, ktPort3 = 31101, 31102, 31103
	ktShared                  = 31150
)

// ktContainer is what must survive a fault, as isolatorctl lists it.
type ktContainer struct {
	ctlContainer
	EgressLimit  *limitRate `json:"egress_limit"`
	IngressLimit *limitRate `json:"ingress_limit"`
}

type limitRate struct {
	Rate int64 `json:"rate"`
	Ceil int64 `json:"ceil"`
}

type ktFleet struct {
	sb    *sandbox.Sandbox
	d     *Daemon
	ids   []string
	names map[int]string // exclusive port -> server name
	want  []ktContainer
	base  hostState
}

func newKTFleet(t *testing.T) *ktFleet {
	t.Helper()
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	f := &ktFleet{sb: sb, d: d, names: map[int]string{}}
	k1 := startServer(t, sb, "k1", ktPort1)
	k2 := startSharedServer(t, sb, "k2", ktShared, ktPort2)
	k3 := startSharedServer(t, sb, "k3", ktShared, ktPort3)
	id1, id2, id3 := sb.Name+"-k1", sb.Name+"-k2", sb.Name+"-k3"
	f.ids = []string{id1, id2, id3}
	f.names = map[int]string{ktPort1: "k1", ktPort2: "k2", ktPort3: "k3"}

	// k1 through the API with labels (isolatorctl has no label flag)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id1,
		Ports:  []*pb.PortRange{{Begin: ktPort1, End: ktPort1}},
		Labels: map[string]string{"team": "kt", "app": "k1"}}); err != nil {
		t.Fatal(err)
	}
	d.Ctl(t, "prepare", id2, "--ports", strconv.Itoa(ktPort2), "--shared-ports", strconv.Itoa(ktShared), "--ingress-rate-limit", "16Mbit")
	d.Ctl(t, "prepare", id3, "--ports", strconv.Itoa(ktPort3), "--shared-ports", strconv.Itoa(ktShared), "--egress-rate-limit", "2MB/s", "--ingress-rate-limit", "4MB/s")
	d.Ctl(t, "isolate", id1, "--pid", strconv.Itoa(k1.Pid))
	d.Ctl(t, "isolate", id2, "--pid", strconv.Itoa(k2.Pid))
	d.Ctl(t, "isolate", id3, "--netns", k3.NetNS)
	f.want = f.list(t)
	f.base = readHostState(t, sb, d.NetNSDir)
	f.reachable(t, "before the fault")
	return f
}

func (f *ktFleet) list(t *testing.T) []ktContainer {
	t.Helper()
	var got []ktContainer
	f.d.CtlJSON(t, &got, "list")
	return got
}

// reachable checks every exclusive port over TCP and UDP and the shared
// port over TCP.
func (f *ktFleet) reachable(t *testing.T, when string) {
	t.Helper()
	for port, name := range f.names {
		for _, network := range []string{"tcp", "udp"} {
			got, err := echoFromClient(f.sb, network, port)
			if err != nil || got != name {
				t.Fatalf("%s: %s to host:%d answered by %q, %v; want %s", when, network, port, got, err, name)
			}
		}
	}
	got, err := echoFromClient(f.sb, "tcp", ktShared)
	if err != nil || (got != "k2" && got != "k3") {
		t.Fatalf("%s: shared port %d answered by %q, %v", when, ktShared, got, err)
	}
}

// same asserts the full picture: listed the same, reachable, the host
// namespace holding exactly what it held.
func (f *ktFleet) same(t *testing.T, when string) {
	t.Helper()
	if got := f.list(t); !reflect.DeepEqual(got, f.want) {
		t.Fatalf("%s: containers listed\n%+v\nwant\n%+v\nlog:\n%s", when, got, f.want, f.d.Log())
	}
	f.reachable(t, when)
	if got := readHostState(t, f.sb, f.d.NetNSDir); !reflect.DeepEqual(got, f.base) {
		t.Fatalf("%s: host namespace holds %+v, held %+v", when, got, f.base)
	}
}

// probe echoes to k1's port every 50 ms until the returned function is
// called, which fails the test if any echo failed: traffic must keep
// flowing throughout a fault.
func (f *ktFleet) probe(t *testing.T) (stop func()) {
	return startProbe(t, func() error {
		got, err := echoFromClient(f.sb, "tcp", ktPort1)
		if err != nil || got != "k1" {
			return fmt.Errorf("%q, %v", got, err)
		}
		return nil
	})
}

// startProbe runs check every 50 ms (for 2 minutes at most) until the
// returned function is called, which fails the test if any check failed.
func startProbe(t *testing.T, check func() error) (stop func()) {
	var fails, n atomic.Int64
	var last atomic.Value
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < 2400; i++ { // bounded: 2 minutes at most
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			err := check()
			n.Add(1)
			if err != nil {
				fails.Add(1)
				last.Store(err.Error())
			}
		}
	}()
	return func() {
		t.Helper()
		close(quit)
		<-done
		if fails.Load() > 0 {
			t.Fatalf("traffic interrupted during the fault: %d of %d checks failed (last: %v)", fails.Load(), n.Load(), last.Load())
		}
	}
}

// rawDaemon runs isolatord with args in the sandbox's host namespace
// without waiting for it to serve.
type rawDaemon struct{ p *daemonproc.Process }

func startRaw(t *testing.T, sb *sandbox.Sandbox, args []string) *rawDaemon {
	t.Helper()
	r := &rawDaemon{&daemonproc.Process{Bin: filepath.Join(Binaries(t), "isolatord"), HostNS: sb.Host.Path, Args: args}}
	if err := r.p.Launch(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.kill)
	return r
}

func (r *rawDaemon) log() string { return r.p.Log() }

// nlines is the number of whole lines it printed.
func (r *rawDaemon) nlines() int { return strings.Count(r.p.Log(), "\n") }

func (r *rawDaemon) kill() { _ = r.p.Stop(syscall.SIGKILL) }

// wait waits for the process to exit (or fails after timeout).
func (r *rawDaemon) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.p.Done():
	case <-time.After(timeout):
		t.Fatalf("isolatord did not exit within %v:\n%s", timeout, r.log())
	}
}

// argsWith returns d's arguments with flag's value replaced.
func argsWith(args []string, kv ...string) []string {
	out := append([]string(nil), args...)
	for i := 0; i+1 < len(kv); i += 2 {
		for j := 0; j+1 < len(out); j++ {
			if out[j] == kv[i] {
				out[j+1] = kv[i+1]
			}
		}
	}
	return out
}

// TestSecondDaemonChangesNothing: a second isolatord for the same host
// namespace, whatever its state dir and socket, exits at once naming the
// first one's pid, and changes nothing: no container is torn down, the
// first daemon keeps serving on its socket.
func TestSecondDaemonChangesNothing(t *testing.T) {
	f := newKTFleet(t)
	other := t.TempDir()
	cases := []struct{ name, stateDir, socket string }{
		{"same state dir, same socket", f.d.StateDir, f.d.Socket},
		{"other state dir, same socket", filepath.Join(other, "state"), f.d.Socket},
		{"same state dir, other socket", f.d.StateDir, filepath.Join(other, "other.sock")},
		{"other state dir, other socket", filepath.Join(other, "state2"), filepath.Join(other, "other2.sock")},
	}
	for _, c := range cases {
		stop := f.probe(t)
		r := startRaw(t, f.sb, argsWith(f.d.Args, "--state-dir", c.stateDir, "--socket", c.socket))
		r.wait(t, 20*time.Second)
		stop()
		if r.p.ExitErr() == nil {
			t.Fatalf("%s: the second daemon exited 0:\n%s", c.name, r.log())
		}
		want := "isolatord pid " + strconv.Itoa(f.d.Pid())
		if l := r.log(); !strings.Contains(l, want) || strings.Contains(l, "recover") {
			t.Fatalf("%s: the second daemon's log does not name the holder (%q) or it recovered:\n%s", c.name, want, l)
		}
		if _, err := os.Stat(filepath.Join(c.stateDir, "isolatord.db")); c.stateDir != f.d.StateDir && err == nil {
			t.Fatalf("%s: the second daemon created a state file", c.name)
		}
		if _, err := os.Stat(c.socket); err != nil {
			if c.socket == f.d.Socket {
				t.Fatalf("%s: the first daemon's socket is gone: %v", c.name, err)
			}
		} else if c.socket != f.d.Socket {
			t.Fatalf("%s: the second daemon created socket %s", c.name, c.socket)
		}
		f.same(t, c.name)
	}
}

// TestStateFaultsRebuildFromKernel: after kill -9, the state file deleted,
// emptied, truncated or with random pages overwritten, or a mistyped
// --state-dir: the daemon rebuilds every container from the kernel (labels
// and creation time from the veth alias), moves a corrupt file aside, and
// keeps traffic flowing.
func TestStateFaultsRebuildFromKernel(t *testing.T) {
	f := newKTFleet(t)
	var labels pb.GetResponse
	ctx := context.Background()
	if r, err := f.d.Client.Get(ctx, &pb.GetRequest{ContainerId: f.ids[0]}); err == nil {
		labels.Container = r.Container
	} else {
		t.Fatal(err)
	}
	dbPath := filepath.Join(f.d.StateDir, "isolatord.db")
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	faults := []struct {
		name    string
		corrupt bool // the file must have been moved aside
		do      func(t *testing.T)
	}{
		{"deleted", false, func(t *testing.T) { must(t, os.Remove(dbPath)) }},
		{"emptied", false, func(t *testing.T) { must(t, os.Truncate(dbPath, 0)) }},
		// (whether bbolt still reads a cut file depends on where its pages
		// are: moved aside or not, the containers must all be there)
		{"truncated", false, func(t *testing.T) {
			fi, err := os.Stat(dbPath)
			must(t, err)
			must(t, os.Truncate(dbPath, fi.Size()/2))
		}},
		{"truncated in the meta pages", true, func(t *testing.T) { must(t, os.Truncate(dbPath, 100)) }},
		{"garbage", true, func(t *testing.T) {
			b := make([]byte, 32<<10)
			rng.Read(b)
			must(t, os.WriteFile(dbPath, b, 0o600))
		}},
		{"random pages", false, func(t *testing.T) {
			b, err := os.ReadFile(dbPath)
			must(t, err)
			for i := 0; i < 4 && len(b) > 3*4096; i++ {
				p := 2 + rng.Intn(len(b)/4096-2)
				rng.Read(b[p*4096 : (p+1)*4096])
			}
			must(t, os.WriteFile(dbPath, b, 0o600))
		}},
	}
	for _, fault := range faults {
		stop := f.probe(t)
		f.d.Kill()
		fault.do(t)
		f.d.Start()
		stop()
		f.same(t, "state "+fault.name)
		asides, _ := filepath.Glob(dbPath + ".corrupt-*")
		if fault.corrupt && len(asides) == 0 {
			t.Fatalf("state %s: not moved aside:\n%s", fault.name, f.d.Log())
		}
		if strings.Contains(f.d.Log(), "goroutine ") || strings.Contains(f.d.Log(), "another isolatord") {
			t.Fatalf("state %s: panic or wrong cause in the log:\n%s", fault.name, f.d.Log())
		}
		r, err := f.d.Client.Get(ctx, &pb.GetRequest{ContainerId: f.ids[0]})
		must(t, err)
		if !reflect.DeepEqual(r.Container.GetLabels(), labels.Container.GetLabels()) || r.Container.GetCreatedAt().GetSeconds() != labels.Container.GetCreatedAt().GetSeconds() {
			t.Fatalf("state %s: labels %v created %v, want %v %v", fault.name, r.Container.GetLabels(), r.Container.GetCreatedAt().AsTime(), labels.Container.GetLabels(), labels.Container.GetCreatedAt().AsTime())
		}
		st, err := f.d.Client.Status(ctx, &pb.StatusRequest{})
		must(t, err)
		if len(st.GetUnattributed()) != 0 {
			t.Fatalf("state %s: unattributed %v", fault.name, st.GetUnattributed())
		}
	}

	// A mistyped --state-dir: all rebuilt; back to the right one: the
	// records there agree with the kernel.
	good := f.d.Args
	f.d.Args = argsWith(good, "--state-dir", filepath.Join(t.TempDir(), "typo"))
	f.d.Stop()
	f.d.Start()
	f.same(t, "wrong --state-dir")
	st, err := f.d.Client.Status(ctx, &pb.StatusRequest{})
	must(t, err)
	if len(st.GetRebuilt()) != 3 {
		t.Fatalf("wrong --state-dir: rebuilt %v, want the 3 containers", st.GetRebuilt())
	}
	f.d.Args = good
	f.d.Stop()
	f.d.Start()
	f.same(t, "back to the right --state-dir")
}

// TestKillDuringRebuild: the daemon killed (-9) after each of the log lines
// of a rebuild from the kernel alone, then restarted, ends in the same
// state every time.
func TestKillDuringRebuild(t *testing.T) {
	f := newKTFleet(t)
	dbPath := filepath.Join(f.d.StateDir, "isolatord.db")
	f.d.Kill()
	must(t, os.Remove(dbPath))
	// how many lines a whole start-up writes
	r := startRaw(t, f.sb, f.d.Args)
	wait.For(t, 20*time.Second, "the serving line", func() bool { return strings.Contains(r.log(), daemonproc.ServingMarker) })
	total := r.nlines()
	r.kill()
	stop := f.probe(t)
	for k := 0; k < total && k < 40; k++ {
		_ = os.Remove(dbPath)
		r := startRaw(t, f.sb, f.d.Args)
		deadline := time.Now().Add(20 * time.Second)
		for r.nlines() < k {
			if time.Now().After(deadline) {
				t.Fatalf("kill point %d: only %d lines:\n%s", k, r.nlines(), r.log())
			}
			select {
			case <-r.p.Done():
				t.Fatalf("kill point %d: exited:\n%s", k, r.log())
			case <-time.After(time.Millisecond):
			}
		}
		r.kill()
		if k%2 == 0 {
			continue
		}
		// a restart that is itself killed at the same point, once more
		r2 := startRaw(t, f.sb, f.d.Args)
		for r2.nlines() < k && time.Now().Before(deadline) {
			select {
			case <-r2.p.Done():
			case <-time.After(time.Millisecond):
			}
		}
		r2.kill()
	}
	stop()
	f.d.Start()
	f.same(t, "after kills during the rebuild")
}

// TestSignalsNeverTearDown: SIGHUP, SIGUSR1, SIGUSR2 and SIGPIPE are logged
// and ignored; SIGINT, SIGTERM and SIGQUIT end the daemon with a log line
// and its socket removed; the containers stay.
func TestSignalsNeverTearDown(t *testing.T) {
	f := newKTFleet(t)
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE} {
		must(t, syscall.Kill(f.d.Pid(), sig))
		want := `"signal":"` + sig.String() + `"`
		waitLog(t, f.d, want)
		f.same(t, "after "+sig.String())
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT} {
		pid := f.d.Pid()
		must(t, syscall.Kill(pid, sig))
		waitLog(t, f.d, `"msg":"signal received: shutting down","signal":"`+sig.String()+`"`)
		select {
		case <-f.d.Exited():
		case <-time.After(20 * time.Second):
			t.Fatalf("%v: daemon (pid %d) still running", sig, pid)
		}
		if _, err := os.Stat(f.d.Socket); err == nil {
			t.Fatalf("%v: socket left behind", sig)
		}
		if strings.Contains(f.d.Log(), "goroutine ") {
			t.Fatalf("%v: goroutine dump:\n%s", sig, f.d.Log())
		}
		f.reachable(t, "daemon stopped by "+sig.String())
		f.d.Stop()
		f.d.Start()
		f.same(t, "restart after "+sig.String())
	}
}

func waitLog(t *testing.T, d *Daemon, want string) {
	t.Helper()
	if !wait.Until(10*time.Second, func() bool { return strings.Contains(d.Log(), want) }) {
		t.Fatalf("no %s in the log:\n%s", want, d.Log())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
