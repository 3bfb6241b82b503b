package dataplane

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// TestFragmentsContainerLo: with the wire guard on, a container's lo and
// host-side veth have the loopback MTU, so its 4,000- and 65,000-byte
// datagrams over 127.0.0.1 and ::1 cross the veth unfragmented: they
// reach a host server whole, a host client's large request gets the
// container echo server's large reply, and container A's datagrams reach
// container B whole, nothing of them reaching a third container's veth or
// the wire.
func TestFragmentsContainerLo(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	if e.d.wire == nil {
		t.Fatal("no wire guard on eth0")
	}
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	b := e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	c := e.start("C", 3, "43008-44031", "31020-31029", "", 31020)
	raiseClientMTU(t, e)
	client := e.clientCapture(t)
	e.checkHostVethMTU(t, c)
	vc := traffic.StartCapture(t, e.sb.Host.Do, plane.VethName(c.c.ID), "C's veth")
	serveIn(t, e.sb.Host, "[::]:8000", "host")
	h4 := listenUDPIn(t, e.sb.Host, "udp4", "127.0.0.1:7001")
	h6 := listenUDPIn(t, e.sb.Host, "udp6", "[::1]:7001")
	b4 := listenUDPIn(t, b.proc, "udp4", "127.0.0.1:31011")
	b6 := listenUDPIn(t, b.proc, "udp6", "[::1]:31012")
	for _, n := range fragSizes {
		for _, x := range []struct {
			what, nw, addr string
			pc             net.PacketConn
		}{
			{"container -> host", "udp4", loAddr(7001), h4},
			{"container -> host", "udp6", lo6Addr(7001), h6},
			{"container -> container", "udp4", loAddr(31011), b4},
			{"container -> container", "udp6", lo6Addr(31012), b6},
		} {
			msg := bigMsg(x.addr, n)
			sendFrom(t, a.proc, x.nw, x.addr, msg)
			if got := reply(x.pc, 5*time.Second); got != msg {
				t.Errorf("%s %s, %d bytes: received %d bytes starting %.40q", x.what, x.addr, n, len(got), got)
			}
		}
		// A host client's large request, the container's large reply.
		mustEchoBig(t, e.sb.Host, "udp4", loAddr(31000), "A", bigMsg("q4", n))
		mustEchoBig(t, e.sb.Host, "udp6", lo6Addr(31000), "A", bigMsg("q6", n))
		// A container's large request to a host server, its large reply.
		mustEchoBig(t, a.proc, "udp4", loAddr(8000), "host", bigMsg("s4", n))
		mustEchoBig(t, a.proc, "udp6", lo6Addr(8000), "host", bigMsg("s6", n))
		// A to B's echo server, B's large reply.
		mustEchoBig(t, a.proc, "udp4", loAddr(31010), "B", bigMsg("b4", n))
		mustEchoBig(t, a.proc, "udp6", lo6Addr(31010), "B", bigMsg("b6", n))
	}
	// A marker to C's own port after everything else: once C's veth has
	// sent it, the capture has read every frame sent to C before it.
	marker := "marker-after-the-large-datagrams"
	sendFrom(t, a.proc, "udp4", loAddr(31020), marker)
	if !vc.WaitFor([]byte(marker), 5*time.Second) {
		t.Fatal("C's veth capture did not see the marker datagram to C's port")
	}
	if n := bigFrames(vc); n > 0 {
		t.Errorf("container C's veth sent it %d frames of over 1,000 bytes", n)
	}
	for _, f := range client.read() {
		if f.len > 1000 {
			t.Errorf("the client received a %s frame of %d bytes", f.network, f.len)
		}
	}
}

// checkHostVethMTU: container x's host-side veth has the loopback MTU
// (the wire guard is on).
func (e *env) checkHostVethMTU(t testing.TB, x ctr) {
	t.Helper()
	h, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(plane.VethName(x.c.ID))
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().MTU != 65535 {
		t.Errorf("host veth of %s: MTU %d, want 65535 (the wire guard is on)", x.c.ID, l.Attrs().MTU)
	}
}

// bigFrames counts the frames of over 1,000 bytes capture c (on a host
// veth) saw going to the container.
func bigFrames(c *traffic.Capture) int {
	n := 0
	for _, f := range c.Outgoing() {
		if len(f) > 1000 {
			n++
		}
	}
	return n
}

// TestWireGuardHostFrames: the wire guard lets the host's own frames
// through: a VLAN-tagged frame of MTU + 18 bytes from a packet socket on
// eth0 (af_packet takes it; the guard allows 4 bytes for the tag in the
// data), and a 1,400-byte one; nothing of the host's is counted.
func TestWireGuardHostFrames(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	if e.d.wire == nil {
		t.Fatal("no wire guard on eth0")
	}
	raiseClientMTU(t, e)
	client := e.clientCapture(t)
	h, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("eth0")
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	mtu := e.info.MTU
	frame := func(size int, vlan bool) []byte {
		f := make([]byte, size)
		copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(f[6:12], e.sb.HostMAC)
		p := f[12:]
		if vlan {
			copy(p, []byte{0x81, 0x00, 0x00, 0x64})
			p = p[4:]
		}
		p[0], p[1] = 0x08, 0x00
		ip := p[2:]
		ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
		ip[2], ip[3] = byte(len(ip)>>8), byte(len(ip))
		return f
	}
	err = e.sb.Host.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, f := range [][]byte{frame(mtu+18, true), frame(1400, false)} {
			if err := unix.Sendto(fd, f, 0, &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the host's packet socket: %v", err)
	}
	var sizes []int
	wait.Until(5*time.Second, func() bool {
		for _, f := range client.read() {
			if f.network == "ip4" && (f.len >= mtu+14 || f.len == 1400) {
				sizes = append(sizes, f.len)
			}
		}
		return len(sizes) >= 2
	})
	if len(sizes) != 2 {
		t.Errorf("the client received the host's frames of %v bytes, want the tagged one of %d (its tag stripped: %d) and 1400", sizes, mtu+18, mtu+14)
	}
}
