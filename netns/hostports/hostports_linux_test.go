package hostports

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

func open(t *testing.T, sb *sandbox.Sandbox) *Ports {
	t.Helper()
	p, err := New(sb.Host.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func set(ports ...uint16) ephemeral.Set {
	var rs []ephemeral.Range
	for _, p := range ports {
		rs = append(rs, ephemeral.Range{Begin: p, End: p})
	}
	return ephemeral.NewSet(rs...)
}

// TestHolderIsNamed: a host process holding a port (TCP listening on the
// host IP, on 127.0.0.1, on the dual-stack wildcard; UDP bound to the
// wildcard) makes Reserve fail with a HeldError naming the process and its
// pid; a socket only bound (not listening) names its process too; nothing
// is reserved by a refused call.
func TestHolderIsNamed(t *testing.T) {
	sb := sandbox.New(t)
	p := open(t, sb)
	bin := traffic.BinaryPath(t)
	cases := []struct {
		port       uint16
		flag, addr string
		want       string
	}{
		{31101, "--tcp", sb.HostIP.String() + ":31101", "TCP listening on " + sb.HostIP.String() + ":31101"},
		{31102, "--tcp", "127.0.0.1:31102", "TCP listening on 127.0.0.1:31102"},
		{31103, "--tcp", ":31103", "TCP listening on [::]:31103"},
		{31104, "--udp", sb.HostIP.String() + ":31104", "UDP bound to " + sb.HostIP.String() + ":31104"},
		{31107, "--udp", "127.0.0.1:31107", "UDP bound to 127.0.0.1:31107"},
		{31105, "--udp", ":31105", "UDP bound to [::]:31105"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.port), func(t *testing.T) {
			proc := sb.StartHostProcess(t, "ready", bin, "serve", c.flag, c.addr, "--name", "hostsvc")
			// A free port with it: all or none. (Go binds "0.0.0.0" and
			// "" as the dual-stack [::].)
			err := p.Reserve(set(31100, c.port))
			var he *HeldError
			if !errors.As(err, &he) {
				t.Fatalf("Reserve %d: %v, want a HeldError", c.port, err)
			}
			if he.Port != c.port || he.Process.Pid != proc.Pid || he.Process.Comm != "isotraffic" {
				t.Fatalf("HeldError %+v, want port %d held by isotraffic pid %d", he, c.port, proc.Pid)
			}
			for _, s := range []string{strconv.Itoa(int(c.port)), "isotraffic (pid " + strconv.Itoa(proc.Pid) + ")", c.want} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not say %q", err, s)
				}
			}
			if p.Held() != 0 {
				t.Fatalf("a refused Reserve left %v reserved", p.Reserved())
			}
			if err := p.Holder(c.port); !errors.As(err, &he) || he.Process.Pid != proc.Pid {
				t.Fatalf("Holder(%d) = %v", c.port, err)
			}
			if err := proc.Stop(); err != nil {
				t.Fatal(err)
			}
			if err := p.Holder(c.port); err != nil {
				t.Fatalf("Holder(%d) after the holder ended: %v", c.port, err)
			}
			if err := p.Reserve(set(31100, c.port)); err != nil {
				t.Fatalf("Reserve after the holder ended: %v", err)
			}
			p.Release(set(31100, c.port))
		})
	}

	// A TCP socket only bound (never listening) holds the port too.
	var fd int
	err := sb.Host.Do(func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Port: 31106})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var he *HeldError
	if err := p.Reserve(set(31106)); !errors.As(err, &he) || he.Process.Pid != os.Getpid() || !strings.Contains(err.Error(), "TCP bound to 0.0.0.0:31106") {
		t.Fatalf("Reserve of a port a bound TCP socket holds: %v (%+v)", err, he)
	}
}

// TestReservationBlocksHostBinds: while a port is reserved, a host socket's
// bind fails with EADDRINUSE on the host IP, 0.0.0.0, 127.0.0.1 and [::],
// TCP and UDP, even with SO_REUSEADDR or SO_REUSEPORT; the reservation
// sockets never listen; after Release every bind succeeds.
func TestReservationBlocksHostBinds(t *testing.T) {
	sb := sandbox.New(t)
	p := open(t, sb)
	const port = 31200
	if err := p.Reserve(set(port, port+1)); err != nil {
		t.Fatal(err)
	}
	if err := p.Reserve(set(port)); err != nil || p.Held() != 2 {
		t.Fatalf("Reserve of a reserved port: %v, held %v", err, p.Reserved())
	}
	addrs := []string{sb.HostIP.String(), "0.0.0.0", "127.0.0.1", "::"}
	optSets := [][]int{nil, {unix.SO_REUSEADDR}, {unix.SO_REUSEPORT}, {unix.SO_REUSEADDR, unix.SO_REUSEPORT}}
	for _, nw := range []string{"tcp", "udp"} {
		for _, a := range addrs {
			for _, opts := range optSets {
				addr := net.JoinHostPort(a, strconv.Itoa(port))
				if err := sb.Host.Bind(nw, addr, opts...); !errors.Is(err, unix.EADDRINUSE) {
					t.Errorf("host %s bind %s with options %v while reserved: %v, want EADDRINUSE", nw, addr, opts, err)
				}
			}
		}
	}
	// Nothing listens: a connection to the reserved port is refused.
	err := sb.Host.Do(func() error {
		c, err := net.Dial("tcp", net.JoinHostPort(sb.HostIP.String(), strconv.Itoa(port)))
		if err == nil {
			c.Close()
		}
		return err
	})
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("connect to a reserved port: %v, want ECONNREFUSED", err)
	}

	p.Release(set(port))
	if p.Held() != 1 || p.Reserved()[0] != port+1 {
		t.Fatalf("after releasing %d: %v", port, p.Reserved())
	}
	for _, nw := range []string{"tcp", "udp"} {
		for _, a := range addrs {
			addr := net.JoinHostPort(a, strconv.Itoa(port))
			if err := sb.Host.Bind(nw, addr); err != nil {
				t.Errorf("host %s bind %s after release: %v", nw, addr, err)
			}
		}
	}
	if err := sb.Host.Bind("tcp", "127.0.0.1:"+strconv.Itoa(port+1)); !errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("port %d still reserved, yet bind: %v", port+1, err)
	}
}

// TestReservePool: the pool goes into ip_local_reserved_ports next to what
// the operator reserved; a later pool replaces ours and never the
// operator's.
func TestReservePool(t *testing.T) {
	sb := sandbox.New(t)
	p := open(t, sb)
	if err := sb.Host.SetSysctl("net.ipv4.ip_local_reserved_ports", "1000,5000-5010"); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "reserved")
	read := func() string {
		v, err := sb.Host.Sysctl("net.ipv4.ip_local_reserved_ports")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(v)
	}
	steps := []struct{ pool, want, ours string }{
		{"40000-40959", "1000,5000-5010,40000-40959", "40000-40959"},
		{"40000-40959", "1000,5000-5010,40000-40959", "40000-40959"}, // restart: unchanged
		{"5005-5020", "1000,5000-5020", "5011-5020"},                 // the operator's 5000-5010 stay theirs
		{"41000-41999", "1000,5000-5010,41000-41999", "41000-41999"},
	}
	for i, s := range steps {
		res, err := p.ReservePool(ephemeral.MustParseSet(s.pool), marker)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		b, _ := os.ReadFile(marker)
		if got := read(); got != s.want || res.Value != s.want || strings.TrimSpace(string(b)) != s.ours {
			t.Fatalf("step %d pool %s: sysctl %q (result %q), ours %q; want %q, ours %q", i, s.pool, got, res.Value, b, s.want, s.ours)
		}
		if (i == 1) != !res.Changed() {
			t.Errorf("step %d: Changed() = %v", i, res.Changed())
		}
	}
}
