package e2e

// Docker Engine 20.10 (Debian 12's docker.io) drives isolatord's remote
// network driver (--docker-plugin; docs/docker.md): a network made with
// `docker network create -d <driver> --ipam-driver null`, containers run
// with -p P:P reachable on the host's IP from the client namespace (TCP
// and UDP), their ip_local_port_range their block, refusals in docker's
// own output, and nothing left after docker rm.

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

type dockerEnv struct {
	sb     *sandbox.Sandbox
	d      *Daemon
	k      *dockerd
	driver string
	image  string
}

func newDockerEnv(t testing.TB, extra ...string) *dockerEnv {
	t.Helper()
	needDocker(t)
	sb := sandbox.New(t)
	sock, driver := pluginSocket(t, sb)
	d := StartDaemon(t, sb, DaemonOptions{Extra: append([]string{"--docker-plugin", sock}, extra...)})
	k := startDockerd(t, sb)
	e := &dockerEnv{sb: sb, d: d, k: k, driver: driver, image: "isot-busybox"}
	k.importImage(e.image)
	return e
}

// serveArgs is a container command serving TCP and UDP on port, named name.
func (e *dockerEnv) serveArgs(name string, port int) []string {
	return []string{e.image, "/isotraffic", "serve", "--tcp", fmt.Sprintf(":%d", port), "--udp", fmt.Sprintf(":%d", port), "--name", name}
}

// echoWithin waits for an echo reply of want over network to port.
func (e *dockerEnv) echoWithin(t *testing.T, network string, port int, want string) {
	t.Helper()
	var got string
	var err error
	if !wait.Until(20*time.Second, func() bool {
		got, err = echoFromClient(e.sb, network, port)
		return err == nil && got == want
	}) {
		t.Fatalf("%s to host:%d from the client: got %q, %v; want %q", network, port, got, err, want)
	}
}

// ctlByEndpoint is isolatord's container of the Docker container named name
// (the endpoint ID is isolatord's container ID).
func (e *dockerEnv) ctlByEndpoint(t *testing.T, name, network string) ctlContainer {
	t.Helper()
	eid := e.k.must("inspect", "-f", "{{(index .NetworkSettings.Networks \""+network+"\").EndpointID}}", name)
	var c ctlContainer
	e.d.CtlJSON(t, &c, "get", eid)
	return c
}

func TestDockerRunPublishesPorts(t *testing.T) {
	e := newDockerEnv(t)
	k := e.k
	k.must("network", "create", "-d", e.driver, "--ipam-driver", "null", "isonet")

	k.must(append([]string{"run", "-d", "--name", "web", "--network", "isonet", "-p", "31001:31001", "-p", "31001:31001/udp"}, e.serveArgs("web", 31001)...)...)
	e.echoWithin(t, "tcp", 31001, "web")
	e.echoWithin(t, "udp", 31001, "web")

	// isolatord holds the container: isolated, port 31001, and its
	// ip_local_port_range is its block.
	c := e.ctlByEndpoint(t, "web", "isonet")
	if c.State != "isolated" || len(c.Ports) != 1 || c.Ports[0].Begin != 31001 {
		t.Fatalf("isolatord's container of web: %+v", c)
	}
	for _, l := range strings.Split(e.d.Log(), "\n") {
		if strings.Contains(l, "docker endpoint isolated") {
			t.Logf("isolatord: %s", l) // how long after Join the interface arrived
		}
	}
	want := fmt.Sprintf("%d\t%d", c.EphemeralPorts.Begin, c.EphemeralPorts.End)
	if got := k.must("exec", "web", "cat", "/proc/sys/net/ipv4/ip_local_port_range"); got != want {
		t.Fatalf("web's ip_local_port_range = %q, want its block %q", got, want)
	}
	// The container has the host's address on eth0, and no other interface
	// than lo and eth0 (no gateway bridge).
	links := k.must("exec", "web", "ip", "-o", "addr", "show")
	if !strings.Contains(links, "eth0") || !strings.Contains(links, e.sb.HostIP.String()+"/24") || strings.Contains(links, "eth1") {
		t.Fatalf("web's addresses:\n%s", links)
	}

	k.must("rm", "-f", "web")
	wait.For(t, 20*time.Second, "docker rm to leave nothing in isolatord or the sandbox host", func() bool {
		return dockerLeftovers(t, e.sb, e.d) == ""
	})
	if _, err := echoFromClient(e.sb, "tcp", 31001); err == nil {
		t.Fatal("port 31001 still answers after docker rm")
	}

	// The port is free again for another container; then the network goes.
	k.must(append([]string{"run", "-d", "--name", "web2", "--network", "isonet", "-p", "31001:31001"}, e.serveArgs("web2", 31001)...)...)
	e.echoWithin(t, "tcp", 31001, "web2")
	netID := k.must("network", "inspect", "-f", "{{.Id}}", "isonet")
	if b, err := os.ReadFile(filepath.Join(e.d.StateDir, "docker-networks.json")); err != nil || !strings.Contains(string(b), netID) {
		t.Fatalf("isolatord's networks file lacks %s: %v\n%s", netID, err, b)
	}
	k.must("rm", "-f", "web2")
	k.must("network", "rm", "isonet")
	wait.For(t, 20*time.Second, "nothing left after network rm", func() bool {
		return dockerLeftovers(t, e.sb, e.d) == ""
	})
	if b, err := os.ReadFile(filepath.Join(e.d.StateDir, "docker-networks.json")); err != nil || strings.Contains(string(b), netID) {
		t.Fatalf("isolatord's networks file still has %s after network rm: %v\n%s", netID, err, b)
	}
}

// dockerFails runs docker args, which must fail, and returns its output.
func (e *dockerEnv) dockerFails(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.k.run(90*time.Second, args...)
	if err == nil {
		t.Fatalf("docker %s succeeded, want a refusal:\n%s", strings.Join(args, " "), out)
	}
	return out
}

// mustSay fails unless out has every one of wants.
func mustSay(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Fatalf("%s: output lacks %q:\n%s", what, w, out)
		}
	}
	t.Logf("%s: %s", what, strings.TrimSpace(out))
}

func TestDockerRefusals(t *testing.T) {
	e := newDockerEnv(t)
	k := e.k

	// Networks: Docker's default IPAM and unknown options are refused.
	out := e.dockerFails(t, "network", "create", "-d", e.driver, "badipam")
	mustSay(t, "network without --ipam-driver null", out, "--ipam-driver null")
	out = e.dockerFails(t, "network", "create", "-d", e.driver, "--ipam-driver", "null", "-o", "colour=blue", "badopt")
	mustSay(t, "network with an unknown option", out, `"colour"`, "unknown")
	k.must("network", "create", "-d", e.driver, "--ipam-driver", "null", "-o", "shared-ports=31005", "isonet")

	// NAT is refused, saying why; nothing is left in isolatord.
	out = e.dockerFails(t, append([]string{"run", "-d", "--name", "nat", "--network", "isonet", "-p", "8080:80"}, e.serveArgs("nat", 80)...)...)
	mustSay(t, "-p 8080:80", out, "8080:80/tcp refused", "no NAT")
	k.must("rm", "-f", "nat")
	if left := dockerLeftovers(t, e.sb, e.d); left != "" {
		t.Fatalf("after the refused NAT mapping: %s", left)
	}

	// A port held by another container names it.
	k.must(append([]string{"run", "-d", "--name", "ca", "--network", "isonet", "-p", "31001:31001"}, e.serveArgs("ca", 31001)...)...)
	e.echoWithin(t, "tcp", 31001, "ca")
	holder := e.ctlByEndpoint(t, "ca", "isonet").ContainerID
	out = e.dockerFails(t, append([]string{"run", "-d", "--name", "cb", "--network", "isonet", "-p", "31001:31001"}, e.serveArgs("cb", 31001)...)...)
	mustSay(t, "a port of another container", out, "31001", holder, "Docker endpoint of network")
	k.must("rm", "-f", "cb")

	// A port held by a host service names the process.
	hs := e.sb.StartHostProcess(t, "ready", staticIsotraffic(t), "serve", "--tcp", ":31002", "--name", "hostsvc")
	out = e.dockerFails(t, append([]string{"run", "-d", "--name", "cc", "--network", "isonet", "-p", "31002:31002"}, e.serveArgs("cc", 31002)...)...)
	mustSay(t, "a port of a host service", out, "31002", "isotraffic")
	k.must("rm", "-f", "cc")
	hs.Stop()

	// Shared ports (the network's shared-ports option): two containers
	// serve 31005 with SO_REUSEPORT.
	for _, n := range []string{"s1", "s2"} {
		k.must("run", "-d", "--name", n, "--network", "isonet", "-p", "31005:31005", e.image, "/isotraffic", "serve", "--tcp", ":31005", "--name", n, "--reuseport")
	}
	seen := map[string]bool{}
	wait.For(t, 20*time.Second, "both holders of shared port 31005 to answer", func() bool {
		if got, err := echoFromClient(e.sb, "tcp", 31005); err == nil {
			seen[got] = true
		}
		return seen["s1"] && seen["s2"]
	})

	// Limits through network options.
	k.must("network", "create", "-d", e.driver, "--ipam-driver", "null", "-o", "egress-rate-limit=2MB/s", "-o", "ingress-rate-limit=1MB/s", "limited")
	k.must(append([]string{"run", "-d", "--name", "lim", "--network", "limited", "-p", "31006:31006"}, e.serveArgs("lim", 31006)...)...)
	e.echoWithin(t, "tcp", 31006, "lim")
	eid := k.must("inspect", "-f", "{{(index .NetworkSettings.Networks \"limited\").EndpointID}}", "lim")
	var lim struct {
		Egress  *struct{ Rate int64 } `json:"egress_limit"`
		Ingress *struct{ Rate int64 } `json:"ingress_limit"`
	}
	e.d.CtlJSON(t, &lim, "get", eid)
	if lim.Egress == nil || lim.Egress.Rate != 2_000_000 || lim.Ingress == nil || lim.Ingress.Rate != 1_000_000 {
		t.Fatalf("limits of a container on network limited: egress %+v ingress %+v", lim.Egress, lim.Ingress)
	}
	k.must("rm", "-f", "lim")
	k.must("network", "rm", "limited")

	k.must("rm", "-f", "ca", "s1", "s2")
	k.must("network", "rm", "isonet")
	wait.For(t, 20*time.Second, "nothing left", func() bool { return dockerLeftovers(t, e.sb, e.d) == "" })
}

// TestDockerRestarts: isolatord killed with -9 while a container serves
// (traffic keeps flowing, Docker's calls during its restart wait and
// succeed), isolatord restarted (its networks come back from its state),
// dockerd restarted (the network is kept and usable), and nothing left.
func TestDockerRestarts(t *testing.T) {
	e := newDockerEnv(t)
	k := e.k
	k.must("network", "create", "-d", e.driver, "--ipam-driver", "null", "isonet")
	k.must(append([]string{"run", "-d", "--name", "web", "--network", "isonet", "-p", "31001:31001"}, e.serveArgs("web", 31001)...)...)
	e.echoWithin(t, "tcp", 31001, "web")

	// kill -9: the container keeps its traffic while isolatord is down.
	e.d.Kill()
	mustEcho(t, e.sb, "tcp", 31001, "web")
	mustEcho(t, e.sb, "udp", 31001, "web")
	// A docker call made while isolatord is down waits for it (Docker
	// retries a plugin it cannot reach) and succeeds once it is back.
	type result struct {
		out string
		err error
	}
	rm := make(chan result, 1)
	go func() {
		out, err := k.run(90*time.Second, "rm", "-f", "web")
		rm <- result{out, err}
	}()
	e.d.Start()
	if r := <-rm; r.err != nil {
		t.Fatalf("docker rm -f web across isolatord's restart: %v\n%s", r.err, r.out)
	}
	wait.For(t, 20*time.Second, "docker rm across the restart to leave nothing", func() bool {
		return dockerLeftovers(t, e.sb, e.d) == ""
	})

	// isolatord stopped and started: the network comes back from its state.
	e.d.Stop()
	e.d.Start()
	k.must(append([]string{"run", "-d", "--name", "web2", "--network", "isonet", "-p", "31002:31002", "-p", "31002:31002/udp"}, e.serveArgs("web2", 31002)...)...)
	e.echoWithin(t, "udp", 31002, "web2")

	// dockerd restarted: it stops web2 (no live restore), which releases
	// its endpoint; the network is kept and a new container on it works.
	k.restart()
	wait.For(t, 20*time.Second, "dockerd's shutdown to release web2's endpoint", func() bool {
		return dockerLeftovers(t, e.sb, e.d) == ""
	})
	k.must("network", "inspect", "isonet")
	k.must("start", "web2")
	e.echoWithin(t, "tcp", 31002, "web2")
	k.must("rm", "-f", "web2")
	k.must("network", "rm", "isonet")
	wait.For(t, 20*time.Second, "nothing left", func() bool { return dockerLeftovers(t, e.sb, e.d) == "" })
}

// TestDockerContainerDiesWhileDockerdDown: dockerd killed with -9, the
// container's process killed while it is down; once dockerd is back, the
// dead container's endpoint is reclaimed and nothing is left. Docker 20.10
// drops its namespace pin at its start but does not delete the endpoint
// (until docker rm), so isolatord's orphan reclamation does it: the
// namespace has no process and no pin but isolatord's (--orphan-grace, 5s
// here).
func TestDockerContainerDiesWhileDockerdDown(t *testing.T) {
	e := newDockerEnv(t, "--orphan-grace", "5s")
	k := e.k
	k.must("network", "create", "-d", e.driver, "--ipam-driver", "null", "isonet")
	k.must(append([]string{"run", "-d", "--name", "web", "--network", "isonet", "-p", "31001:31001"}, e.serveArgs("web", 31001)...)...)
	e.echoWithin(t, "tcp", 31001, "web")
	pid, err := strconv.Atoi(k.must("inspect", "-f", "{{.State.Pid}}", "web"))
	if err != nil || pid <= 1 {
		t.Fatalf("web's pid: %v", err)
	}

	k.kill()
	// The container outlives dockerd (its shim holds it); then it dies.
	mustEcho(t, e.sb, "tcp", 31001, "web")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	k.start()
	wait.For(t, 60*time.Second, "the dead container's endpoint to be reclaimed", func() bool {
		return dockerLeftovers(t, e.sb, e.d) == ""
	})
	t.Logf("reclaimed %v after dockerd's start began", time.Since(began).Round(time.Millisecond))
	for _, l := range strings.Split(e.d.Log(), "\n") {
		if strings.Contains(l, "docker endpoint deleted") || strings.Contains(l, "orphan") {
			t.Log(l)
		}
	}
	if _, err := echoFromClient(e.sb, "tcp", 31001); err == nil {
		t.Fatal("port 31001 still answers")
	}
	// The network still works.
	k.must("rm", "-f", "web")
	k.must(append([]string{"run", "-d", "--name", "web2", "--network", "isonet", "-p", "31001:31001"}, e.serveArgs("web2", 31001)...)...)
	e.echoWithin(t, "tcp", 31001, "web2")
	k.must("rm", "-f", "web2")
	k.must("network", "rm", "isonet")
}

// TestDockerEarlyEgress: Docker 20.10 joins before the container's
// namespace exists, so its isolation follows the namespace's appearance
// (docs/docker.md). What the container sends from its first instruction
// on is filtered all the same: datagrams from a port it does not own
// (31999) never reach the client, while those from its own port (31001)
// do once it is isolated. Its ip_local_port_range when its program began
// is logged (a figure: the isolation usually ends before Docker starts
// the program, but nothing orders the two).
func TestDockerEarlyEgress(t *testing.T) {
	e := newDockerEnv(t)
	k := e.k
	k.must("network", "create", "-d", e.driver, "--ipam-driver", "null", "isonet")

	// The client records the source ports of what reaches it.
	var conn net.PacketConn
	if err := e.sb.Client.Do(func() (err error) {
		conn, err = net.ListenPacket("udp4", ":40001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var mu sync.Mutex
	from := map[int]int{}
	go func() {
		buf := make([]byte, 2048)
		for {
			_, addr, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			from[addr.(*net.UDPAddr).Port]++
			mu.Unlock()
		}
	}()

	client := fmt.Sprintf("%s:40001", e.sb.ClientIP)
	script := `cat /proc/sys/net/ipv4/ip_local_port_range
i=0; while [ $i -lt 30 ]; do /isotraffic echo --net udp --addr ` + client + ` --src 0.0.0.0:31999 --msg early --timeout 50ms >/dev/null 2>&1; i=$((i+1)); done
i=0; while [ $i -lt 30 ]; do /isotraffic echo --net udp --addr ` + client + ` --src 0.0.0.0:31001 --msg own --timeout 50ms >/dev/null 2>&1; i=$((i+1)); done
echo done; exec sleep 300`
	k.must("run", "-d", "--name", "early", "--network", "isonet", "-p", "31001:31001/udp", e.image, "sh", "-c", script)
	wait.For(t, 60*time.Second, "the container's sends to end", func() bool {
		out, _ := k.run(10*time.Second, "logs", "early")
		return strings.Contains(out, "done")
	})
	c := e.ctlByEndpoint(t, "early", "isonet")
	atStart := strings.Fields(strings.SplitN(k.must("logs", "early"), "\n", 2)[0])
	block := []string{strconv.Itoa(c.EphemeralPorts.Begin), strconv.Itoa(c.EphemeralPorts.End)}
	t.Logf("ip_local_port_range when the program began: %v (its block: %v)", atStart, block)
	mu.Lock()
	defer mu.Unlock()
	if from[31999] != 0 {
		t.Fatalf("%d datagrams from port 31999, which the container does not own, reached the client", from[31999])
	}
	if from[31001] == 0 {
		t.Fatalf("no datagram from the container's own port 31001 reached the client (sources seen: %v)", from)
	}
	k.must("rm", "-f", "early")
}
