package e2e

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// statusHostPorts is isolatorctl's JSON for the host port reservations.
type statusHostPorts struct {
	HostPorts struct {
		Enabled   bool `json:"enabled"`
		Reserved  int  `json:"reserved"`
		Conflicts []struct {
			Port   int    `json:"port"`
			Holder string `json:"holder"`
		} `json:"conflicts"`
	} `json:"host_ports"`
}

func hostPortsStatus(t *testing.T, d *Daemon) statusHostPorts {
	t.Helper()
	var st statusHostPorts
	d.CtlJSON(t, &st, "status")
	return st
}

// hostAddrs are the addresses a host process may bind a port on: the host
// IP, the IPv4 wildcard, 127.0.0.1 and the IPv6 (dual-stack) wildcard.
func hostAddrs(sb *sandbox.Sandbox) []string {
	return []string{sb.HostIP.String(), "0.0.0.0", "127.0.0.1", "::"}
}

// wantHostBind checks what a host process's bind of port gets on every host
// address, TCP and UDP: EADDRINUSE while reserved (with SO_REUSEADDR and
// SO_REUSEPORT too), success once released.
func wantHostBind(t *testing.T, sb *sandbox.Sandbox, port int, reserved bool) {
	t.Helper()
	for _, nw := range []string{"tcp", "udp"} {
		for _, a := range hostAddrs(sb) {
			addr := net.JoinHostPort(a, strconv.Itoa(port))
			err := sb.Host.Bind(nw, addr)
			switch {
			case reserved && !errors.Is(err, unix.EADDRINUSE):
				t.Fatalf("host %s bind %s while a container holds the port: %v, want EADDRINUSE", nw, addr, err)
			case !reserved && err != nil:
				t.Fatalf("host %s bind %s after the port was released: %v", nw, addr, err)
			}
			if reserved {
				if err := sb.Host.Bind(nw, addr, unix.SO_REUSEADDR, unix.SO_REUSEPORT); !errors.Is(err, unix.EADDRINUSE) {
					t.Fatalf("host %s bind %s with SO_REUSEADDR+SO_REUSEPORT while reserved: %v", nw, addr, err)
				}
			}
		}
	}
}

// echoFromHost sends msg from the host namespace to addr and returns the
// name of the server that answered.
func echoFromHost(sb *sandbox.Sandbox, network, addr string) (string, error) {
	var reply string
	err := sb.Host.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		r, err := traffic.Echo(ctx, network, addr, "hi", traffic.WithTimeout(2*time.Second))
		reply = r
		return err
	})
	return traffic.ReplyName(reply), err
}

// TestHostPortReservations: through the daemon, a host service's port is
// refused to containers (Prepare and Update, TCP and UDP, naming the
// process), a container's port cannot be bound by a host process while it
// holds it (host IP, wildcard, 127.0.0.1), traffic to the container still
// arrives, a shared port is reserved once until its last holder leaves,
// reservations come back after kill -9, a host process that took a port
// while the daemon was down is reported (log, status, metric), and after
// cleanup the host can bind every port again.
func TestHostPortReservations(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--metrics-addr", metricsAddr}})
	ctx := context.Background()
	id := func(n string) string { return sb.Name + "-" + n }
	bin := traffic.BinaryPath(t)

	// The ephemeral pool is in the host's reserved ports.
	if v, err := sb.Host.Sysctl("net.ipv4.ip_local_reserved_ports"); err != nil || strings.TrimSpace(v) != "32768-40959" {
		t.Fatalf("host ip_local_reserved_ports = %q, %v; want the pool 32768-40959", v, err)
	}

	// Host services on 31005 (TCP, host IP) and 31006 (UDP, wildcard).
	tcpSvc := sb.StartHostProcess(t, "ready", bin, "serve", "--tcp", sb.HostIP.String()+":31005", "--name", "hostsvc")
	udpSvc := sb.StartHostProcess(t, "ready", bin, "serve", "--udp", "0.0.0.0:31006", "--name", "hostsvc")
	t.Run("refused", func(t *testing.T) {
		for port, proc := range map[uint32]*sandbox.HostProcess{31005: tcpSvc, 31006: udpSvc} {
			holder := "isotraffic (pid " + strconv.Itoa(proc.Pid) + ")"
			for _, shared := range []bool{false, true} {
				_, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id("x"), Ports: []*pb.PortRange{{Begin: 31000, End: 31000}, {Begin: port, End: port, Shared: shared}}})
				grpcErr(t, err, codes.FailedPrecondition, strconv.Itoa(int(port)), holder)
			}
			_, stderr, err := d.CtlResult("prepare", id("x"), "--ports", strconv.Itoa(int(port)))
			if err == nil || !strings.Contains(stderr, holder) {
				t.Errorf("isolatorctl prepare of a host service's port: %v, %s", err, stderr)
			}
		}
		d.Ctl(t, "prepare", id("x"), "--ports", "31000")
		_, err := d.Client.Update(ctx, &pb.UpdateRequest{ContainerId: id("x"), Ports: []*pb.PortRange{{Begin: 31000, End: 31000}, {Begin: 31005, End: 31005}}})
		grpcErr(t, err, codes.FailedPrecondition, "31005", "isotraffic (pid "+strconv.Itoa(tcpSvc.Pid)+")")
		var got ctlContainer
		d.CtlJSON(t, &got, "get", id("x"))
		if len(got.Ports) != 1 || got.Ports[0].Begin != 31000 || got.Ports[0].End != 31000 {
			t.Fatalf("refused update changed the ports: %+v", got.Ports)
		}
		d.Ctl(t, "cleanup", id("x"))
		// The host services still serve.
		for nw, port := range map[string]string{"tcp": "31005", "udp": "31006"} {
			if name, err := echoFromHost(sb, nw, net.JoinHostPort(sb.HostIP.String(), port)); err != nil || name != "hostsvc" {
				t.Fatalf("host service %s/%s after the refusals: %q, %v", nw, port, name, err)
			}
		}
	})
	if t.Failed() {
		return
	}
	m := scrape(t, sb)
	for op, want := range map[string]float64{"prepare": 6, "update": 1} {
		if v := value(t, m, "isolatord_host_port_refusals_total", map[string]string{"op": op}); v != want {
			t.Errorf("isolatord_host_port_refusals_total{op=%s} = %v, want %v", op, v, want)
		}
	}

	// A container on 31001: the host cannot bind it; traffic arrives.
	c1 := startServer(t, sb, "c1", 31001)
	d.Ctl(t, "prepare", id("c1"), "--ports", "31001")
	wantHostBind(t, sb, 31001, true)
	d.Ctl(t, "isolate", id("c1"), "--pid", strconv.Itoa(c1.Pid))
	wantHostBind(t, sb, 31001, true)
	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, sb, nw, 31001, "c1")
		for _, a := range []string{sb.HostIP.String(), "127.0.0.1"} {
			if name, err := echoFromHost(sb, nw, net.JoinHostPort(a, "31001")); err != nil || name != "c1" {
				t.Fatalf("%s from the host to %s:31001: %q, %v; want c1", nw, a, name, err)
			}
		}
	}
	if st := hostPortsStatus(t, d); !st.HostPorts.Enabled || st.HostPorts.Reserved != 1 || len(st.HostPorts.Conflicts) != 0 {
		t.Fatalf("status: %+v", st)
	}

	// Shared 31010: reserved once for both holders, released with the last.
	d.Ctl(t, "prepare", id("s1"), "--shared-ports", "31010")
	d.Ctl(t, "prepare", id("s2"), "--shared-ports", "31010")
	if st := hostPortsStatus(t, d); st.HostPorts.Reserved != 2 {
		t.Fatalf("reserved with a shared port held twice: %+v", st)
	}
	wantHostBind(t, sb, 31010, true)
	d.Ctl(t, "cleanup", id("s1"))
	wantHostBind(t, sb, 31010, true)
	d.Ctl(t, "cleanup", id("s2"))
	wantHostBind(t, sb, 31010, false)

	// kill -9: the reservations die with the process and come back.
	d.Kill()
	wantHostBind(t, sb, 31001, false)
	d.Start()
	wantHostBind(t, sb, 31001, true)
	mustEcho(t, sb, "tcp", 31001, "c1")

	// A host process takes 31001 while the daemon is down: reported.
	d.Kill()
	squatter := sb.StartHostProcess(t, "ready", bin, "serve", "--tcp", sb.HostIP.String()+":31001", "--name", "squatter")
	d.Start()
	who := "isotraffic (pid " + strconv.Itoa(squatter.Pid) + ")"
	if log := d.Log(); !strings.Contains(log, "took a container's port while the daemon was down") || !strings.Contains(log, who) {
		t.Fatalf("restart did not log the squatter %s:\n%s", who, log)
	}
	st := hostPortsStatus(t, d)
	if len(st.HostPorts.Conflicts) != 1 || st.HostPorts.Conflicts[0].Port != 31001 || !strings.Contains(st.HostPorts.Conflicts[0].Holder, who) || st.HostPorts.Reserved != 0 {
		t.Fatalf("status after a squatter: %+v", st)
	}
	if out := d.Ctl(t, "status"); !strings.Contains(out, "Host port conflicts") || !strings.Contains(out, who) {
		t.Fatalf("isolatorctl status does not show the conflict:\n%s", out)
	}
	m = scrape(t, sb)
	if v := value(t, m, "isolatord_host_port_conflicts", nil); v != 1 {
		t.Fatalf("isolatord_host_port_conflicts = %v", v)
	}
	// The container keeps the traffic.
	mustEcho(t, sb, "tcp", 31001, "c1")

	// Cleanup clears the conflict; with the squatter gone the host can bind.
	d.Ctl(t, "cleanup", id("c1"))
	st = hostPortsStatus(t, d)
	if len(st.HostPorts.Conflicts) != 0 || st.HostPorts.Reserved != 0 {
		t.Fatalf("status after cleanup: %+v", st)
	}
	if err := squatter.Stop(); err != nil {
		t.Fatal(err)
	}
	wantHostBind(t, sb, 31001, false)
}
