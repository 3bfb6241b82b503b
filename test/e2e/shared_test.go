package e2e

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// Shared static ports (SO_REUSEPORT across containers), end to end through
// the built daemon and isolatorctl: the spread of TCP and UDP flows over the
// holders, flows that stay on one container, a holder joining while
// connections are open (they all survive), a holder leaving (only its
// connections break), the reconciler removing the pins once the
// connections end, conflicts in both orders, a transactional update, and a
// port switching between exclusive and shared.

const (
	sharedPort = 31500 // shared by c1, c2, c3, later c4
	exclPort   = 31600 // c3's exclusive port
	c4Port     = 31501 // c4's own port (exclusive, later shared)
	clientHost = "198.18.0.2"
)

// startSharedServer starts a container whose isotraffic server listens
// with SO_REUSEPORT on every port: twice over TCP on the first (two sockets
// in one reuseport group inside the container, to show that programs may
// still use SO_REUSEPORT among themselves) and once over UDP on each.
func startSharedServer(t *testing.T, sb *sandbox.Sandbox, name string, ports ...int) *sandbox.Container {
	t.Helper()
	tcp := []string{":" + strconv.Itoa(ports[0])}
	var udp []string
	for _, p := range ports {
		tcp = append(tcp, ":"+strconv.Itoa(p))
		udp = append(udp, ":"+strconv.Itoa(p))
	}
	c := sb.StartContainer(t, name, traffic.BinaryPath(t), "serve", "--reuseport", "--name", name,
		"--tcp", strings.Join(tcp, ","), "--udp", strings.Join(udp, ","))
	c.WaitFor(t, "ready", 10*time.Second)
	return c
}

// openFlow connects from the client's source port src to the host's port
// and learns which container answers.
func openFlow(t *testing.T, sb *sandbox.Sandbox, port, src int) *traffic.Flow {
	t.Helper()
	return traffic.OpenFlow(t, sb.Client.Do, &net.TCPAddr{IP: net.ParseIP(clientHost), Port: src}, net.JoinHostPort(sb.HostIP.String(), strconv.Itoa(port)))
}

// spread makes n one-request flows (TCP connections or UDP exchanges) to
// the host's port from client source ports first, first+2, ... and counts
// the containers that answered.
func spread(t *testing.T, sb *sandbox.Sandbox, network string, port, first, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	addr := net.JoinHostPort(sb.HostIP.String(), strconv.Itoa(port))
	for i := 0; i < n; i++ {
		src := first + 2*i
		var reply string
		err := sb.Client.Do(func() (err error) {
			reply, err = traffic.Echo(context.Background(), network, addr, "spread", traffic.WithSource(clientHost+":"+strconv.Itoa(src)), traffic.WithTimeout(2*time.Second))
			return err
		})
		if err != nil {
			t.Fatalf("%s flow %d from port %d: %v", network, i, src, err)
		}
		got[traffic.ReplyName(reply)]++
	}
	return got
}

// checkShares fails unless exactly names answered, each between lo and hi
// (fractions) of the n flows.
func checkShares(t *testing.T, what string, got map[string]int, n int, lo, hi float64, names ...string) {
	t.Helper()
	if len(got) != len(names) {
		t.Errorf("%s: answered by %v, want exactly %v", what, got, names)
	}
	for _, name := range names {
		if f := float64(got[name]) / float64(n); f < lo || f > hi {
			t.Errorf("%s: %s got %d of %d (%.0f%%), want %.0f%%-%.0f%%: %v", what, name, got[name], n, 100*f, 100*lo, 100*hi, got)
		}
	}
	t.Logf("%s: %v of %d", what, got, n)
}

// pinNodes counts the pin nodes of spread tables (tables 200-7ff, node id
// other than the bucket's own 800) on the sandbox host's eth0.
var pinRE = regexp.MustCompile(`fh ([2-7][0-9a-f]{2}):[0-9a-f]*:([0-9a-f]+) `)

func pinNodes(t *testing.T, sb *sandbox.Sandbox) int {
	n := 0
	for _, m := range pinRE.FindAllStringSubmatch(sb.Host.Run(t, "tc", "filter", "show", "dev", "eth0", "ingress"), -1) {
		if m[2] != "800" {
			n++
		}
	}
	return n
}

func grpcErr(t *testing.T, err error, want codes.Code, mentions ...string) {
	t.Helper()
	if status.Code(err) != want {
		t.Errorf("got %v, want %v", err, want)
		return
	}
	for _, m := range mentions {
		if !strings.Contains(status.Convert(err).Message(), m) {
			t.Errorf("message %q does not name %s", status.Convert(err).Message(), m)
		}
	}
}

func TestSharedPorts(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	base := readHostState(t, sb, d.NetNSDir)
	ctx := context.Background()
	id := func(n string) string { return sb.Name + "-" + n }
	P, Q := strconv.Itoa(sharedPort), strconv.Itoa(exclPort)

	procs := map[string]*sandbox.Container{
		"c1": startSharedServer(t, sb, "c1", sharedPort),
		"c2": startSharedServer(t, sb, "c2", sharedPort),
		"c3": startSharedServer(t, sb, "c3", sharedPort, exclPort),
		"c4": startSharedServer(t, sb, "c4", sharedPort, c4Port),
	}
	d.Ctl(t, "prepare", id("c1"), "--shared-ports", P)
	d.Ctl(t, "prepare", id("c2"), "--shared-ports", P)
	d.Ctl(t, "prepare", id("c3"), "--ports", Q, "--shared-ports", P)
	d.Ctl(t, "prepare", id("c4"), "--ports", strconv.Itoa(c4Port))
	for _, n := range []string{"c1", "c2", "c3", "c4"} {
		d.Ctl(t, "isolate", id(n), "--pid", strconv.Itoa(procs[n].Pid))
	}

	t.Run("conflicts", func(t *testing.T) {
		// exclusive request on a shared port: refused, naming the holders
		_, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id("x"), Ports: []*pb.PortRange{{Begin: sharedPort, End: sharedPort}}})
		grpcErr(t, err, codes.FailedPrecondition, id("c1"), id("c2"), id("c3"))
		_, stderr, err := d.CtlResult("prepare", id("x"), "--ports", P)
		if err == nil || !strings.Contains(stderr, id("c1")) || !strings.Contains(stderr, id("c3")) {
			t.Errorf("isolatorctl prepare --ports %s: %v\n%s", P, err, stderr)
		}
		// shared request on an exclusively held port: refused likewise
		_, err = d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id("y"), Ports: []*pb.PortRange{{Begin: exclPort, End: exclPort, Shared: true}}})
		grpcErr(t, err, codes.FailedPrecondition, id("c3"))
		_, stderr, err = d.CtlResult("prepare", id("y"), "--shared-ports", Q)
		if err == nil || !strings.Contains(stderr, id("c3")) {
			t.Errorf("isolatorctl prepare --shared-ports %s: %v\n%s", Q, err, stderr)
		}
		// sharing never reaches into the ephemeral pool or outside the managed ports
		for _, p := range []uint32{32768, 30999} {
			_, err = d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id("z"), Ports: []*pb.PortRange{{Begin: p, End: p, Shared: true}}})
			grpcErr(t, err, codes.InvalidArgument, strconv.Itoa(int(p)))
		}
		// an update that adds the shared port and a conflicting exclusive
		// one changes nothing
		_, err = d.Client.Update(ctx, &pb.UpdateRequest{ContainerId: id("c4"), Ports: []*pb.PortRange{
			{Begin: c4Port, End: c4Port}, {Begin: sharedPort, End: sharedPort, Shared: true}, {Begin: exclPort, End: exclPort}}})
		grpcErr(t, err, codes.FailedPrecondition, id("c3"))
		var c4 ctlContainer
		d.CtlJSON(t, &c4, "get", id("c4"))
		if len(c4.Ports) != 1 || c4.Ports[0].Begin != c4Port || c4.Ports[0].Shared {
			t.Errorf("failed update changed c4's ports: %+v", c4.Ports)
		}
		for _, n := range []string{"x", "y", "z"} {
			if _, err := d.Client.Get(ctx, &pb.GetRequest{ContainerId: id(n)}); status.Code(err) != codes.NotFound {
				t.Errorf("refused container %s exists: %v", n, err)
			}
		}
	})

	three := []string{"c1", "c2", "c3"}
	t.Run("spread", func(t *testing.T) {
		checkShares(t, "300 TCP connections", spread(t, sb, "tcp", sharedPort, 20000, 300), 300, 0.20, 0.47, three...)
		checkShares(t, "300 UDP flows", spread(t, sb, "udp", sharedPort, 21000, 300), 300, 0.20, 0.47, three...)
	})

	t.Run("udp-flow-sticks", func(t *testing.T) {
		seen := map[string]int{}
		err := sb.Client.Do(func() error {
			c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(clientHost), Port: 22001}, &net.UDPAddr{IP: sb.HostIP, Port: sharedPort})
			if err != nil {
				return err
			}
			defer c.Close()
			buf := make([]byte, 1500)
			for i := 0; i < 1000; i++ {
				c.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err := fmt.Fprintf(c, "m%d\n", i); err != nil {
					return err
				}
				n, err := c.Read(buf)
				if err != nil {
					return fmt.Errorf("datagram %d: %w", i, err)
				}
				seen[traffic.ReplyName(string(buf[:n]))]++
			}
			return nil
		})
		if err != nil || len(seen) != 1 {
			t.Errorf("1000 datagrams of one UDP flow answered by %v (%v), want one container", seen, err)
		}
	})

	// A long-lived connection exchanging 1,000 messages talks to one container.
	long := openFlow(t, sb, sharedPort, 22500)
	for i := 0; i < 1000; i++ {
		if got, err := long.Ask("m" + strconv.Itoa(i)); err != nil || got != long.Name {
			t.Fatalf("message %d of the long connection answered by %q (%v), first by %q", i, got, err, long.Name)
		}
	}
	// 60 more connections stay open across the membership changes.
	flows := []*traffic.Flow{long}
	byName := map[string]int{long.Name: 1}
	for i := 0; i < 60; i++ {
		f := openFlow(t, sb, sharedPort, 23000+6*i)
		flows = append(flows, f)
		byName[f.Name]++
	}
	t.Logf("open connections by container: %v", byName)
	checkFlows := func(t *testing.T, when, broken string) {
		t.Helper()
		lost := 0
		for _, f := range flows {
			got, err := f.Ask("after-" + when)
			switch {
			case f.Name == broken && err == nil:
				t.Errorf("%s: %s's connection from port %d still answered by %q", when, broken, f.Src, got)
			case f.Name == broken:
				lost++
			case err != nil || got != f.Name:
				t.Errorf("%s: connection from port %d answered by %q (%v), was %q", when, f.Src, got, err, f.Name)
			}
		}
		if lost != byName[broken] {
			t.Errorf("%s: %d of %s's %d connections broke", when, lost, broken, byName[broken])
		}
	}

	t.Run("join", func(t *testing.T) {
		// c4 adds the shared port to its running container.
		d.Ctl(t, "update", id("c4"), "--ports", strconv.Itoa(c4Port), "--shared-ports", P)
		if pinNodes(t, sb) == 0 {
			t.Error("no pin after a join with 61 open connections: no bucket with a live flow moved")
		}
		checkFlows(t, "join", "")
		checkShares(t, "300 TCP connections after c4 joined", spread(t, sb, "tcp", sharedPort, 24000, 300), 300, 0.12, 0.40, "c1", "c2", "c3", "c4")
	})

	t.Run("leave", func(t *testing.T) {
		// c2 gives the port up (an update that releases all its ports).
		d.Ctl(t, "update", id("c2"), "--ports", "")
		checkFlows(t, "leave", "c2")
		checkShares(t, "300 TCP connections after c2 left", spread(t, sb, "tcp", sharedPort, 25000, 300), 300, 0.20, 0.47, "c1", "c3", "c4")
	})

	t.Run("pins-drain", func(t *testing.T) {
		for _, f := range flows {
			f.Close()
		}
		// the reconciler runs every 5 s
		if !wait.Until(15*time.Second, func() bool { return pinNodes(t, sb) == 0 }) {
			t.Fatalf("%d pins left 15s after their connections ended", pinNodes(t, sb))
		}
	})

	t.Run("exclusive-shared-switch", func(t *testing.T) {
		reach := func(when string) {
			t.Helper()
			for _, nw := range []string{"tcp", "udp"} {
				if got, err := echoFromClient(sb, nw, c4Port); err != nil || got != "c4" {
					t.Errorf("%s: %s to %d answered by %q (%v)", when, nw, c4Port, got, err)
				}
			}
		}
		d.Ctl(t, "update", id("c4"), "--shared-ports", P+","+strconv.Itoa(c4Port))
		reach("exclusive -> shared")
		d.Ctl(t, "update", id("c4"), "--ports", strconv.Itoa(c4Port), "--shared-ports", P)
		reach("shared -> exclusive")
	})

	for _, n := range []string{"c1", "c2", "c3", "c4"} {
		d.Ctl(t, "cleanup", id(n))
	}
	if _, err := echoFromClient(sb, "tcp", sharedPort); err == nil {
		t.Error("the shared port still answers after every holder was cleaned up")
	}
	// No rule is left at once; the empty hash tables the kernel still held
	// busy when they were unlinked are gone once the daemon stops.
	for _, dev := range []string{"eth0", "lo"} {
		for _, l := range strings.Split(sb.Host.Run(t, "tc", "filter", "show", "dev", dev, "ingress"), "\n") {
			if strings.Contains(l, "flowid 1:") {
				t.Errorf("%s: a container's rule is left after cleanup: %s", dev, l)
			}
		}
	}
	d.Stop()
	if after := readHostState(t, sb, d.NetNSDir); fmt.Sprint(after) != fmt.Sprint(base) {
		t.Errorf("cleanup left state behind:\nbefore %+v\nafter  %+v", base, after)
	}
}
