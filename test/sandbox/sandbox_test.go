package sandbox

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/traffic"
	"github.com/vishvananda/netlink"
)

// rootNetState is what the root namespace looks like (links, addresses,
// routes); the sandbox must never change it.
func rootNetState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{{"-o", "link"}, {"-o", "addr"}, {"route"}, {"-6", "route"}} {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
		b.Write(out)
	}
	return b.String()
}

func netnsList(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v\n%s", err, out)
	}
	return string(out)
}

func TestSandboxLayout(t *testing.T) {
	RequireRoot(t)
	before := rootNetState(t)
	s := New(t)

	for _, n := range []NS{s.Host, s.Client} {
		if !strings.HasPrefix(n.Name, s.Name+"-") || n.Path != "/run/netns/"+n.Name {
			t.Errorf("bad NS %+v for sandbox %s", n, s.Name)
		}
		if !strings.Contains(netnsList(t), n.Name) {
			t.Errorf("ip netns list does not show %s", n.Name)
		}
	}
	hostAddr := s.Host.Run(t, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if !strings.Contains(hostAddr, "198.18.0.1/24") {
		t.Errorf("host eth0: %s", hostAddr)
	}
	clientAddr := s.Client.Run(t, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if !strings.Contains(clientAddr, "198.18.0.2/24") {
		t.Errorf("client eth0: %s", clientAddr)
	}
	if r := s.Host.Run(t, "ip", "route", "show", "default"); !strings.Contains(r, "default via 198.18.0.2 dev eth0") {
		t.Errorf("host default route: %q", r)
	}
	for _, n := range []NS{s.Host, s.Client} {
		if lo := n.Run(t, "ip", "-o", "link", "show", "lo"); !strings.Contains(lo, "UP") {
			t.Errorf("%s lo not up: %s", n.Name, lo)
		}
	}
	if pr := strings.Fields(s.Host.Run(t, "cat", "/proc/sys/net/ipv4/ip_local_port_range")); strings.Join(pr, " ") != HostPortRange {
		t.Errorf("host ip_local_port_range = %v, want %s", pr, HostPortRange)
	}
	if pr := strings.Fields(s.Client.Run(t, "cat", "/proc/sys/net/ipv4/ip_local_port_range")); strings.Join(pr, " ") == HostPortRange {
		t.Errorf("client ip_local_port_range changed too: %v", pr)
	}
	// HostMAC is the host eth0's MAC, seen from netlink and from the client's
	// neighbour table after some traffic.
	nl, err := s.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	eth0, err := nl.LinkByName(s.HostEth0)
	if err != nil {
		t.Fatal(err)
	}
	if eth0.Attrs().HardwareAddr.String() != s.HostMAC.String() || len(s.HostMAC) != 6 {
		t.Errorf("HostMAC %v, host eth0 has %v", s.HostMAC, eth0.Attrs().HardwareAddr)
	}
	if _, ok := eth0.(*netlink.Veth); !ok {
		t.Errorf("host eth0 is a %s, want veth", eth0.Type())
	}
	// Do really runs in the namespace: the host has eth0 with our address.
	if err := s.Host.Do(func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if strings.HasPrefix(a.String(), "198.18.0.1/") {
				return nil
			}
		}
		return errors.New("198.18.0.1 not on eth0 inside Host.Do")
	}); err != nil {
		t.Error(err)
	}
	if after := rootNetState(t); after != before {
		t.Errorf("root namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestTrafficThroughSandbox(t *testing.T) {
	RequireRoot(t)
	bin := traffic.BinaryPath(t)
	before := rootNetState(t)
	s, err := NewNamed("isot")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // safety net if the test stops early
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	// 1. client -> server in the host namespace.
	var srv *traffic.Server
	if err := s.Host.Do(func() (err error) {
		srv, err = traffic.ServeTCP(ctx, "198.18.0.1:7000", "host")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var reply string
	if err := s.Client.Do(func() (err error) {
		reply, err = traffic.Echo(ctx, "tcp", "198.18.0.1:7000", "from client", traffic.WithTimeout(5*time.Second))
		return err
	}); err != nil {
		t.Fatalf("client -> host echo: %v", err)
	}
	if reply != "host from client" {
		t.Errorf("client -> host reply %q", reply)
	}
	// The host answers the client's ping exactly once per request.
	var pr traffic.PingResult
	if err := s.Client.Do(func() (err error) {
		pr, err = traffic.PingStats(ctx, s.HostIP, 2, 2*time.Second)
		return err
	}); err != nil || !pr.ExactlyOnce() {
		t.Errorf("client ping host: %+v, %v", pr, err)
	}

	// 2. A container running `isotraffic serve`, linked to the client.
	c := s.StartContainer(t, "c1", bin, "serve", "--tcp", ":8080", "--udp", ":8081", "--name", "c1")
	c.WaitFor(t, "ready", 10*time.Second)
	if !strings.HasPrefix(c.NetNS, "/proc/") {
		t.Errorf("NetNS = %q", c.NetNS)
	}
	// Fresh namespace: only lo, and it is down.
	if out := c.Run(t, "ip", "-o", "link"); strings.Count(out, "\n") != 1 || !strings.Contains(out, "lo:") {
		t.Errorf("container namespace not fresh:\n%s", out)
	}
	if err := s.LinkContainerToClient(c, "198.18.1.1/24", "198.18.1.2/24"); err != nil {
		t.Fatal(err)
	}
	// Client -> container over TCP and UDP: the container answers by name.
	for _, tc := range []struct{ network, addr string }{{"tcp", "198.18.1.2:8080"}, {"udp", "198.18.1.2:8081"}} {
		if err := s.Client.Do(func() (err error) {
			reply, err = traffic.Echo(ctx, tc.network, tc.addr, "to c1", traffic.WithTimeout(5*time.Second))
			return err
		}); err != nil {
			t.Fatalf("client -> container %s: %v", tc.network, err)
		}
		if reply != "c1 to c1" {
			t.Errorf("client -> container %s reply %q", tc.network, reply)
		}
	}
	// Container -> client: a server in the client namespace, called by an
	// isotraffic process in the container and by Go code in Container.Do.
	var csrv *traffic.Server
	if err := s.Client.Do(func() (err error) {
		csrv, err = traffic.ServeTCP(ctx, "198.18.1.1:9000", "client")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer csrv.Close()
	out, err := c.Command(bin, "echo", "--net", "tcp", "--addr", "198.18.1.1:9000", "--msg", "from c1", "--src", "198.18.1.2:40000").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "client from c1" {
		t.Errorf("container -> client via isotraffic echo: %q, %v", out, err)
	}
	if err := c.Do(func() (err error) {
		reply, err = traffic.Echo(ctx, "tcp", "198.18.1.1:9000", "go", traffic.WithTimeout(5*time.Second))
		return err
	}); err != nil || reply != "client go" {
		t.Errorf("container -> client via Container.Do: %q, %v", reply, err)
	}
	// The container cannot reach the host namespace: no route was plumbed.
	if err := c.Do(func() error {
		_, err := traffic.Echo(ctx, "tcp", "198.18.0.1:7000", "x", traffic.WithTimeout(500*time.Millisecond))
		return err
	}); err == nil {
		t.Error("container reached the host namespace without a data plane")
	}
	// isotraffic ping from the client to the container.
	out = []byte(s.Client.Run(t, bin, "ping", "--dst", "198.18.1.2", "--count", "2"))
	if !strings.Contains(string(out), `"per_seq":[1,1]`) {
		t.Errorf("isotraffic ping: %s", out)
	}

	// 3. Teardown removes everything.
	pid := c.Pid
	hostName, clientName := s.Host.Name, s.Client.Name
	srv.Close()
	csrv.Close()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if left := s.Leftovers(); len(left) != 0 {
		t.Errorf("Leftovers after Close: %v", left)
	}
	list := netnsList(t)
	for _, n := range []string{hostName, clientName} {
		if strings.Contains(list, n) {
			t.Errorf("ip netns list still shows %s:\n%s", n, list)
		}
		if _, err := os.Stat("/run/netns/" + n); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("/run/netns/%s still exists (%v)", n, err)
		}
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("container pid %d still exists after Close (kill 0: %v)", pid, err)
	}
	if !c.Exited() {
		t.Error("container not reaped")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if after := rootNetState(t); after != before {
		t.Errorf("root namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestCleanupAfterSubtest(t *testing.T) {
	RequireRoot(t)
	var names []string
	var pid int
	t.Run("inner", func(t *testing.T) {
		s := New(t)
		names = []string{s.Host.Name, s.Client.Name}
		c := s.StartContainer(t, "sleeper", "sleep", "300")
		pid = c.Pid
	})
	list := netnsList(t)
	for _, n := range names {
		if strings.Contains(list, n) {
			t.Errorf("%s survived its test's cleanup", n)
		}
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("container pid %d survived its test's cleanup (%v)", pid, err)
	}
}

func TestDoReportsErrorsAndPanics(t *testing.T) {
	s := New(t)
	want := errors.New("boom")
	if err := s.Host.Do(func() error { return want }); !errors.Is(err, want) {
		t.Errorf("Do returned %v, want %v", err, want)
	}
	func() {
		defer func() {
			if p := recover(); p != "oops" {
				t.Errorf("recovered %v, want the panic re-raised", p)
			}
		}()
		s.Client.Do(func() error { panic("oops") })
	}()
	// The calling goroutine's thread is untouched: the root namespace's lo
	// still has 127.0.0.1 and no 198.18 address is visible here.
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if strings.HasPrefix(a.String(), "198.18.0.") {
			t.Errorf("caller sees sandbox address %s: Do leaked its namespace", a)
		}
	}
	if err := (NS{Name: "nope", Path: "/run/netns/does-not-exist"}).Do(func() error { return nil }); err == nil {
		t.Error("Do in a missing namespace succeeded")
	}
}

func TestContainerExitIsReported(t *testing.T) {
	s := New(t)
	c := s.StartContainer(t, "quick", "sh", "-c", "echo started; exit 3")
	if err := c.WaitOutput("never printed", 5*time.Second); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("WaitOutput on an exited container: %v", err)
	}
	if !strings.Contains(c.Output(), "started") {
		t.Errorf("output %q", c.Output())
	}
	if _, err := s.Spawn("bad", "/nonexistent/binary"); err == nil {
		t.Error("spawning a missing binary succeeded")
	}
}

func TestEnterHost(t *testing.T) {
	s := New(t)
	hasHostAddr := func() bool {
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if strings.HasPrefix(a.String(), "198.18.0.1/") {
				return true
			}
		}
		return false
	}
	restore, err := s.EnterHost()
	if err != nil {
		t.Fatal(err)
	}
	inside := hasHostAddr()
	restore()
	if !inside {
		t.Error("after EnterHost the host address is not visible")
	}
	if hasHostAddr() {
		t.Error("after restore the host address is still visible")
	}
}
