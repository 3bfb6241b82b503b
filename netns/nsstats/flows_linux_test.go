package nsstats

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// dialFrom opens a TCP connection from 127.0.0.1:src to addr inside ns and
// returns the client end and the accepted server end.
func dialFrom(t *testing.T, ns sandbox.NS, ln net.Listener, src int) (client, server net.Conn) {
	t.Helper()
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: src},
			Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
				return serr
			}}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		var err error
		if client, err = d.Dial("tcp4", net.JoinHostPort("127.0.0.1", port)); err != nil {
			return err
		}
		ln.(interface{ SetDeadline(time.Time) error }).SetDeadline(time.Now().Add(5 * time.Second))
		server, err = ln.Accept()
		return err
	})
	if err != nil {
		t.Fatalf("connect from port %d: %v", src, err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func listen(t testing.TB, ns sandbox.NS, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen(network, addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestConnsAndPeerPorts(t *testing.T) {
	sb := sandbox.New(t)
	path := sb.Host.Path
	v4 := listen(t, sb.Host, "tcp4", "127.0.0.1:7100")
	dual := listen(t, sb.Host, "tcp", ":7200") // IPv4 clients arrive as v4-mapped AF_INET6 sockets
	other := listen(t, sb.Host, "tcp4", "127.0.0.1:7300")
	for _, src := range []int{40001, 40002, 40003} {
		dialFrom(t, sb.Host, v4, src)
	}
	dialFrom(t, sb.Host, dual, 40010)
	dialFrom(t, sb.Host, other, 40030)

	// A connection the server side closes first leaves a TIME_WAIT socket
	// with local port 7100: not a live flow.
	c, s := dialFrom(t, sb.Host, v4, 40004)
	s.Close()
	buf := make([]byte, 1)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Fatal("server close not seen")
	}
	c.Close()

	// UDP: a connected socket is a flow, an unconnected one is not.
	var udpConnected, udpServer *net.UDPConn
	if err := sb.Host.Do(func() (err error) {
		if udpServer, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7101}); err != nil {
			return err
		}
		udpConnected, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7100}, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40020})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { udpConnected.Close(); udpServer.Close() })

	// the TIME_WAIT transition is asynchronous
	var got []uint16
	if !wait.Until(5*time.Second, func() bool {
		var err error
		if got, err = PeerPorts(path, 7100); err != nil {
			t.Fatal(err)
		}
		return slices.Equal(got, []uint16{40001, 40002, 40003, 40020})
	}) {
		t.Fatalf("PeerPorts(7100) = %v, want 40001-40003 (TCP) and 40020 (connected UDP), not 40004 (TIME_WAIT)", got)
	}
	if got, err := PeerPorts(path, 7200); err != nil || !slices.Equal(got, []uint16{40010}) {
		t.Fatalf("PeerPorts(7200) = %v, %v; want [40010] (an AF_INET6 socket)", got, err)
	}
	if got, err := PeerPorts(path, 7101); err != nil || len(got) != 0 {
		t.Fatalf("PeerPorts(7101) = %v, %v; an unconnected UDP socket is no flow", got, err)
	}

	cs, err := Conns(path, 7200, 7300)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"6 1 127.0.0.1:7200 127.0.0.1:40010": true,
		"6 1 127.0.0.1:7300 127.0.0.1:40030": true,
	}
	for _, c := range cs {
		k := fmt.Sprintf("%d %d %s %s", c.Proto, c.State, c.Local, c.Remote)
		if !want[k] {
			t.Errorf("unexpected flow %s", k)
		}
		delete(want, k)
	}
	if len(want) > 0 {
		t.Errorf("missing flows %v in %v", want, cs)
	}

	// Without ports: every live flow, client ends included.
	all, err := Conns(path)
	if err != nil {
		t.Fatal(err)
	}
	clientEnd := netip.MustParseAddrPort("127.0.0.1:40002")
	if !slices.ContainsFunc(all, func(c Conn) bool { return c.Local == clientEnd && c.Remote.Port() == 7100 }) {
		t.Errorf("Conns() lacks the client end %s: %v", clientEnd, all)
	}

	// A long port list (one bytecode block per port) still selects exactly.
	var many []uint16
	for p := uint16(1); len(many) < MaxConnPorts-1; p += 3 {
		if p != 7100 && p != 7200 && p != 7300 {
			many = append(many, p)
		}
	}
	many = append(many, 7300)
	cs, err = Conns(path, many...)
	if err != nil || len(cs) != 1 || cs[0].Remote.Port() != 40030 {
		t.Fatalf("Conns(%d ports) = %v, %v; want the one flow of 7300", len(many), cs, err)
	}
	if _, err := Conns(path, make([]uint16, MaxConnPorts+1)...); err == nil {
		t.Error("too many ports accepted")
	}
	if _, err := Conns("/nonexistent"); err == nil {
		t.Error("a missing namespace gave no error")
	}
}

func BenchmarkPeerPorts(b *testing.B) {
	sb := sandbox.New(b)
	listen(b, sb.Host, "tcp4", "127.0.0.1:7100")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := PeerPorts(sb.Host.Path, 7100); err != nil {
			b.Fatal(err)
		}
	}
}
