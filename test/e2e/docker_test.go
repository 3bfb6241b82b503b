package e2e

// Docker Engine 20.10 (Debian 12's docker.io) drives isolatord's remote
// network driver (--docker-plugin; docs/docker.md): a network made with
// `docker network create -d <driver> --ipam-driver null`, containers run
// with -p P:P reachable on the host's IP from the client namespace (TCP
// and UDP), their ip_local_port_range their block, refusals in docker's
// own output, and nothing left after docker rm.

import (
	"fmt"
	"strings"
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

func newDockerEnv(t *testing.T) *dockerEnv {
	t.Helper()
	needDocker(t)
	sb := sandbox.New(t)
	sock, driver := pluginSocket(t, sb)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--docker-plugin", sock}})
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
	k.must("rm", "-f", "web2")
	k.must("network", "rm", "isonet")
	wait.For(t, 20*time.Second, "nothing left after network rm", func() bool {
		return dockerLeftovers(t, e.sb, e.d) == ""
	})
}
