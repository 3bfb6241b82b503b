package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// startServer starts a container running isotraffic serve on the given
// ports (TCP and UDP each) that answers with name.
func startServer(t *testing.T, sb *sandbox.Sandbox, name string, ports ...int) *sandbox.Container {
	t.Helper()
	var addrs []string
	for _, p := range ports {
		addrs = append(addrs, ":"+strconv.Itoa(p))
	}
	list := strings.Join(addrs, ",")
	c := sb.StartContainer(t, name, traffic.BinaryPath(t), "serve", "--tcp", list, "--udp", list, "--name", name)
	c.WaitFor(t, "ready", 10*time.Second)
	return c
}

// echoFromClient sends msg from the client namespace to host:port and
// returns the name of the server that answered.
func echoFromClient(sb *sandbox.Sandbox, network string, port int) (string, error) {
	var reply string
	err := sb.Client.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		r, err := traffic.Echo(ctx, network, net.JoinHostPort(sb.HostIP.String(), strconv.Itoa(port)), "hi", traffic.WithTimeout(2*time.Second))
		reply = r
		return err
	})
	return traffic.ReplyName(reply), err
}

func mustEcho(t *testing.T, sb *sandbox.Sandbox, network string, port int, want string) {
	t.Helper()
	got, err := echoFromClient(sb, network, port)
	if err != nil || got != want {
		t.Fatalf("%s to host:%d from the client: got %q, %v; want %q", network, port, got, err, want)
	}
}

// hostState lists what of ours exists in the sandbox host namespace: veths,
// and the number of tc filter lines on eth0 and lo ingress.
type hostState struct {
	veths   []string
	filters int
	mounts  []string
}

func readHostState(t *testing.T, sb *sandbox.Sandbox, netnsDir string) hostState {
	t.Helper()
	var hs hostState
	// (group default: not the retired links awaiting deletion, which keep
	// their names)
	out := sb.Host.Run(t, "ip", "-o", "link", "show", "group", "default")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 {
			name := strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
			if strings.HasPrefix(name, plane.VethPrefix) {
				hs.veths = append(hs.veths, name)
			}
		}
	}
	// Count filter rules (u32 nodes: "... fh H:B:N order ..."). Hash tables
	// are not counted: an emptied table is deleted a little later (the
	// kernel holds it busy for a few ms after its last link goes).
	for _, dev := range []string{"eth0", "lo"} {
		out := sb.Host.Run(t, "tc", "filter", "show", "dev", dev, "ingress")
		hs.filters += strings.Count(out, " order ")
	}
	if ents, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range ents {
			hs.mounts = append(hs.mounts, e.Name())
		}
	}
	return hs
}

// TestDaemonEndToEnd drives the built binaries: two containers prepared and
// isolated through isolatorctl, real traffic to each, `ip netns exec`, a
// kill -9 and restart with traffic flowing throughout, cleanup leaving
// nothing, ports reusable.
func TestDaemonEndToEnd(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: nil})
	base := readHostState(t, sb, d.NetNSDir)

	id1, id2 := sb.Name+"-c1", sb.Name+"-c2"
	c1 := startServer(t, sb, "c1", 31001)
	c2 := startServer(t, sb, "c2", 31002)

	d.Ctl(t, "prepare", id1, "--ports", "31001")
	d.Ctl(t, "prepare", id2, "--ports", "31002")
	d.Ctl(t, "isolate", id1, "--pid", strconv.Itoa(c1.Pid))
	d.Ctl(t, "isolate", id2, "--netns", c2.NetNS)

	var got ctlContainer
	d.CtlJSON(t, &got, "get", id1)
	if got.State != "isolated" || got.Veth != plane.VethName(id1) || got.Netns != filepath.Join(d.NetNSDir, id1) || got.EphemeralPorts.End-got.EphemeralPorts.Begin != 255 {
		t.Fatalf("get %s: %+v", id1, got)
	}

	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, sb, nw, 31001, "c1")
		mustEcho(t, sb, nw, 31002, "c2")
	}
	// The namespace handle works with standard tools.
	out := sb.Host.Run(t, "nsenter", "--net="+got.Netns, "ss", "-ltn")
	if !strings.Contains(out, ":31001") {
		t.Fatalf("ss in %s does not show the listener:\n%s", got.Netns, out)
	}

	// kill -9, traffic keeps flowing while the daemon is down and after restart.
	d.Kill()
	mustEcho(t, sb, "tcp", 31001, "c1")
	d.Start()
	var list []ctlContainer
	d.CtlJSON(t, &list, "list")
	if len(list) != 2 || list[0].State != "isolated" || list[1].State != "isolated" {
		t.Fatalf("after restart: %+v", list)
	}
	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, sb, nw, 31001, "c1")
		mustEcho(t, sb, nw, 31002, "c2")
	}
	if !strings.Contains(d.Log(), "plumbing complete; kept") {
		t.Fatalf("restart did not log keeping the containers:\n%s", d.Log())
	}

	// Graceful restart too.
	d.Stop()
	d.Start()
	mustEcho(t, sb, "tcp", 31002, "c2")

	d.Ctl(t, "cleanup", id1)
	d.Ctl(t, "cleanup", id2)
	d.Ctl(t, "cleanup", id2) // idempotent
	if after := readHostState(t, sb, d.NetNSDir); fmt.Sprint(after) != fmt.Sprint(base) {
		t.Fatalf("cleanup left state behind:\nbefore %+v\nafter  %+v", base, after)
	}
	if _, err := echoFromClient(sb, "tcp", 31001); err == nil {
		t.Fatal("traffic still reaches a cleaned-up container")
	}
	// The ports and blocks are reusable.
	d.Ctl(t, "prepare", id1, "--ports", "31001-31002")
	d.Ctl(t, "isolate", id1, "--pid", strconv.Itoa(c1.Pid))
	mustEcho(t, sb, "tcp", 31001, "c1")
	d.Ctl(t, "cleanup", id1)
}

// TestDaemonIPNetnsExec checks the default netns directory: `ip netns exec
// <id>` works on an isolated container.
func TestDaemonIPNetnsExec(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--netns-dir", "/var/run/netns"}})
	id := sb.Name + "-ipx"
	c := startServer(t, sb, "ipx", 31005)
	d.Ctl(t, "prepare", id, "--ports", "31005")
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))
	t.Cleanup(func() { d.CtlResult("cleanup", id) })
	out := sb.Host.Run(t, "ip", "netns", "exec", id, "ss", "-ltn")
	if !strings.Contains(out, ":31005") {
		t.Fatalf("ip netns exec %s ss -ltn:\n%s", id, out)
	}
	d.Ctl(t, "cleanup", id)
	if _, err := os.Stat(filepath.Join("/var/run/netns", id)); !os.IsNotExist(err) {
		t.Fatalf("namespace handle not removed: %v", err)
	}
}

// TestDaemonKillDuringIsolateAndCleanup kills the daemon with SIGKILL at
// random moments during Isolate and Cleanup (100+ kills), restarts it each
// time, and checks that nothing leaks and nothing is held twice.
func TestDaemonKillDuringIsolateAndCleanup(t *testing.T) {
	cycles := 60 // two kills per cycle
	if testing.Short() {
		cycles = 10
	}
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	base := readHostState(t, sb, d.NetNSDir)
	holder := sb.StartContainer(t, "holder")
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	ctx := context.Background()
	id := sb.Name + "-k"
	kills := 0

	// killDuring runs call and kills the daemon after a random delay.
	killDuring := func(call func() error) {
		delay := time.Duration(rng.Intn(12000)) * time.Microsecond
		done := make(chan struct{})
		go func() { _ = call(); close(done) }()
		select {
		case <-done:
		case <-time.After(delay):
		}
		d.Kill()
		<-done
		kills++
		d.Start()
	}
	for i := 0; i < cycles; i++ {
		// Prepare (ports vary so the ledger is exercised), then isolate under fire.
		port := uint32(31000 + i%50)
		if _, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id, Ports: []*pb.PortRange{{Begin: port, End: port}}}); err != nil {
			t.Fatalf("cycle %d prepare: %v", i, err)
		}
		killDuring(func() error {
			_, err := d.Client.Isolate(ctx, &pb.IsolateRequest{ContainerId: id, Target: &pb.IsolateRequest_Pid{Pid: int32(holder.Pid)}})
			return err
		})
		if _, err := d.Client.Get(ctx, &pb.GetRequest{ContainerId: id}); err != nil {
			t.Fatalf("cycle %d: container lost after a kill during isolate: %v\n%s", i, err, d.Log())
		}
		killDuring(func() error {
			_, err := d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id})
			return err
		})
		// Whatever survived the kill, a plain cleanup finishes it.
		if _, err := d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id}); err != nil {
			t.Fatalf("cycle %d cleanup: %v", i, err)
		}
		st, err := d.Client.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.EphemeralBlocksUsed != 0 || st.StaticPortsExclusive != "" || st.Containers != 0 {
			t.Fatalf("cycle %d: leak in bookkeeping: %+v", i, st)
		}
		if hs := readHostState(t, sb, d.NetNSDir); fmt.Sprint(hs) != fmt.Sprint(base) {
			t.Fatalf("cycle %d: kernel leak:\nbase %+v\nnow  %+v\n%s", i, base, hs, d.Log())
		}
	}
	if kills < 2*cycles {
		t.Fatalf("only %d kills", kills)
	}
}

// TestDaemonConcurrentClients runs 32 parallel clients doing
// prepare/isolate/update/cleanup on distinct and clashing IDs and ports, and
// checks after every round that no port or block is held twice.
func TestDaemonConcurrentClients(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Ephemeral: "32768-36863", BlockSize: 256}) // 16 blocks
	holders := make([]*sandbox.Container, 6)
	for i := range holders {
		holders[i] = sb.StartContainer(t, fmt.Sprintf("h%d", i))
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < 25; i++ {
				n := rng.Intn(20)
				id := fmt.Sprintf("%s-w%d", sb.Name, n)
				p := uint32(31000 + rng.Intn(10))
				ports := []*pb.PortRange{{Begin: p, End: p + uint32(rng.Intn(3)), Shared: rng.Intn(3) == 0}}
				var err error
				switch rng.Intn(6) {
				case 0, 1:
					_, err = d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id, Ports: ports})
				case 2:
					h := holders[n%len(holders)]
					_, err = d.Client.Isolate(ctx, &pb.IsolateRequest{ContainerId: id, Target: &pb.IsolateRequest_Pid{Pid: int32(h.Pid)}})
				case 3, 4:
					_, err = d.Client.Update(ctx, &pb.UpdateRequest{ContainerId: id, Ports: ports})
				case 5:
					_, err = d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id})
				}
				mu.Lock()
				codesSeen[status.Code(err)]++
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	t.Logf("result codes: %v", codesSeen)
	if codesSeen[codes.Internal] > 0 || codesSeen[codes.Unknown] > 0 {
		t.Fatalf("internal errors under concurrency: %v\n%s", codesSeen, d.Log())
	}
	if codesSeen[codes.OK] < 100 {
		t.Fatalf("too few successful calls: %v", codesSeen)
	}
	l, err := d.Client.List(ctx, &pb.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[uint32]string{}
	excl := map[uint32]string{}
	shared := map[uint32]bool{}
	for _, c := range l.Containers {
		if o, ok := blocks[c.EphemeralPorts.Begin]; ok {
			t.Fatalf("block %d held by %s and %s", c.EphemeralPorts.Begin, o, c.ContainerId)
		}
		blocks[c.EphemeralPorts.Begin] = c.ContainerId
		for _, p := range c.Ports {
			for port := p.Begin; port <= p.End; port++ {
				if p.Shared {
					shared[port] = true
					continue
				}
				if o, ok := excl[port]; ok {
					t.Fatalf("port %d held by %s and %s", port, o, c.ContainerId)
				}
				excl[port] = c.ContainerId
			}
		}
	}
	for p := range shared {
		if o, ok := excl[p]; ok {
			t.Fatalf("port %d shared and held exclusively by %s", p, o)
		}
	}
	for _, c := range l.Containers {
		if _, err := d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: c.ContainerId}); err != nil {
			t.Fatal(err)
		}
	}
}
