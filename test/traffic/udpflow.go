package traffic

import (
	"context"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// UDPFlow is a connected UDP socket in a container answering one client
// address and port with the container's name (a QUIC-like server: one
// socket per client, which the data plane sees as a live flow), and the
// client's socket talking to it.
type UDPFlow struct{ client, server *net.UDPConn }

// OpenUDPFlow binds port (SO_REUSEPORT, beside the container's other
// servers) in the server's namespace, connects it to clientIP:src and
// dials hostIP:port from clientIP:src in the client's namespace (srv and
// client run a function in their namespace, as sandbox namespaces' Do
// does). Both sockets close when the test ends.
func OpenUDPFlow(t testing.TB, srv, client func(func() error) error, name string, hostIP, clientIP net.IP, port, src int) *UDPFlow {
	t.Helper()
	var sc *net.UDPConn
	err := srv(func() error {
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
			return serr
		}}
		pc, err := lc.ListenPacket(context.Background(), "udp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(port)))
		if err != nil {
			return err
		}
		uc := pc.(*net.UDPConn)
		raw, _ := uc.SyscallConn()
		var cerr error
		raw.Control(func(fd uintptr) {
			cerr = unix.Connect(int(fd), &unix.SockaddrInet4{Port: src, Addr: [4]byte(clientIP.To4())})
		})
		if cerr != nil {
			uc.Close()
			return cerr
		}
		sc = uc
		return nil
	})
	if err != nil {
		t.Fatalf("connected UDP server in %s: %v", name, err)
	}
	t.Cleanup(func() { sc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := sc.Read(buf)
			if err != nil {
				return
			}
			sc.Write([]byte(name + " " + string(buf[:n])))
		}
	}()
	var cc *net.UDPConn
	if err := client(func() (err error) {
		cc, err = net.DialUDP("udp4", &net.UDPAddr{IP: clientIP, Port: src}, &net.UDPAddr{IP: hostIP, Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &UDPFlow{client: cc, server: sc}
}

// Ask sends a datagram and returns the name of the container that
// answered within 2 s.
func (u *UDPFlow) Ask() (string, error) {
	u.client.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := u.client.Write([]byte("ping")); err != nil {
		return "", err
	}
	buf := make([]byte, 64)
	n, err := u.client.Read(buf)
	if err != nil {
		return "", err
	}
	name, _, _ := strings.Cut(string(buf[:n]), " ")
	return name, nil
}

// Close ends the flow: both sockets close.
func (u *UDPFlow) Close() {
	u.client.Close()
	u.server.Close()
}
