package dataplane

import (
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/containerns"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
	"github.com/vishvananda/netlink"
)

// The lo path (docs/fragments.md): a container's eth0 has
// containerns.EthMTU, its host veth and its routes the host's MTU.

// listenUDPIn opens a UDP socket on addr inside ns (it stays in ns).
func listenUDPIn(t testing.TB, ns doer, network, addr string) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	err := ns.Do(func() (err error) {
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

// sendFrom sends msg as one datagram from ns to addr.
func sendFrom(t testing.TB, ns doer, network, addr, msg string) {
	t.Helper()
	err := ns.Do(func() error {
		c, err := net.Dial(network, addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(msg))
		return err
	})
	if err != nil {
		t.Errorf("send %d bytes to %s %s: %v", len(msg), network, addr, err)
	}
}

// TestFragmentsHostToContainerLo: the host's own 4,000-byte and 65,000-byte
// datagrams to a container's port over the host IP, 127.0.0.1, ::1 and
// the host's IPv6 address reach the container whole (lo does not
// fragment them; the container's eth0 takes them), and its echo server
// answers those over the host addresses (its reply is fragmented in the
// container at lo's MTU, the host's); a host echo server's large replies
// reach a container.
func TestFragmentsHostToContainerLo(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	pc4 := listenUDPIn(t, a.proc, "udp4", "0.0.0.0:31001")
	pc6 := listenUDPIn(t, a.proc, "udp6", "[::]:31002")
	serveIn(t, e.sb.Host, "[::]:8000", "host")
	for _, n := range fragSizes {
		for _, c := range []struct {
			nw, addr string
			pc       net.PacketConn
		}{
			{"udp4", hostAddr(31001), pc4},
			{"udp4", loAddr(31001), pc4},
			{"udp6", lo6Addr(31002), pc6},
			{"udp6", host6Addr(e, 31002), pc6},
		} {
			msg := bigMsg(c.addr, n)
			sendFrom(t, e.sb.Host, c.nw, c.addr, msg)
			if got := reply(c.pc, 5*time.Second); got != msg {
				t.Errorf("host -> container %s, %d bytes: received %d bytes starting %.40q", c.addr, n, len(got), got)
			}
		}
		mustEchoBig(t, e.sb.Host, "udp4", hostAddr(31000), "A", bigMsg("h4", n))
		mustEchoBig(t, e.sb.Host, "udp6", host6Addr(e, 31000), "A", bigMsg("h6", n))
		// A host server's large reply to a container.
		mustEchoBig(t, a.proc, "udp4", hostAddr(8000), "host", bigMsg("r4", n))
		mustEchoBig(t, a.proc, "udp6", host6Addr(e, 8000), "host", bigMsg("r6", n))
	}
}

// clientCapture is a packet socket on the client namespace's eth0.
type clientCapture struct{ fd int }

func (e *env) clientCapture(t testing.TB) *clientCapture {
	t.Helper()
	h, err := e.sb.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	c := &clientCapture{fd: -1}
	err = e.sb.Client.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
			unix.Close(fd)
			return err
		}
		c.fd = fd
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(c.fd) })
	return c
}

// frame is what a capture saw of one received frame.
type frame struct {
	len     int    // bytes with the Ethernet header
	udp     bool   // a UDP datagram or fragment (not TCP, whose GSO packets a capture sees whole)
	synMSS  int    // a TCP SYN's MSS option, 0 otherwise
	network string // "ip4" or "ip6"
}

// read drains the capture's frames received from the host.
func (c *clientCapture) read() []frame {
	var out []frame
	buf := make([]byte, 70000)
	for range 100000 {
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			break
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype == unix.PACKET_OUTGOING || n < 14+40 {
			continue
		}
		f := frame{len: n}
		p := buf[14:n]
		var proto byte
		var l4 []byte
		switch binary.BigEndian.Uint16(buf[12:]) {
		case 0x0800:
			f.network, proto = "ip4", p[9]
			if binary.BigEndian.Uint16(p[6:])&0x1fff == 0 {
				l4 = p[int(p[0]&0xf)*4:]
			}
		case 0x86dd:
			f.network, proto = "ip6", p[6]
			l4 = p[40:]
			if proto == 44 {
				l4 = nil
			}
		default:
			continue
		}
		f.udp = proto == unix.IPPROTO_UDP || proto == 44
		if proto == unix.IPPROTO_TCP && len(l4) >= 20 && l4[13]&0x12 == 0x02 {
			f.synMSS = synMSS(l4)
		}
		out = append(out, f)
	}
	return out
}

// synMSS is the MSS option of TCP header tcp (0: none).
func synMSS(tcp []byte) int {
	end := int(tcp[12]>>4) * 4
	for i := 20; i < end && i < len(tcp); {
		switch tcp[i] {
		case 0:
			return 0
		case 1:
			i++
			continue
		case 2:
			if i+4 <= len(tcp) {
				return int(binary.BigEndian.Uint16(tcp[i+2:]))
			}
			return 0
		}
		if i+1 >= len(tcp) || tcp[i+1] < 2 {
			return 0
		}
		i += int(tcp[i+1])
	}
	return 0
}

// TestMTUContainerEgress: what a container sends out keeps the host's
// MTU though its eth0 has EthMTU: its large UDP datagrams leave
// fragmented (every frame the client receives fits the host's MTU) and
// arrive whole, its TCP SYNs announce an MSS from the host's MTU, and a
// TCP exchange with the client works both ways.
func TestMTUContainerEgress(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	mtu := e.info.MTU
	if v, err := viewOf(a.proc); err != nil || v.mtu != mtu {
		t.Fatalf("container routes: %v %v, want eth0 at %d and the MTU metric %d", v, err, containerns.EthMTU, mtu)
	}
	serveIn(t, e.sb.Client, "[::]:9000", "client")
	capture := e.clientCapture(t)
	for _, n := range fragSizes {
		mustEchoBig(t, a.proc, "udp4", clientAddr(9000), "client", bigMsg("c4", n))
		mustEchoBig(t, a.proc, "udp6", client6Addr(e, 9000), "client", bigMsg("c6", n))
	}
	mustEchoBig(t, a.proc, "tcp4", clientAddr(9000), "client", bigMsg("t4", 60000))
	mustEchoBig(t, a.proc, "tcp6", client6Addr(e, 9000), "client", bigMsg("t6", 60000))
	var udp, syn int
	for _, f := range capture.read() {
		if f.udp {
			udp++
			if f.len > mtu+14 {
				t.Errorf("the client received a %s UDP frame of %d bytes, over the host MTU %d", f.network, f.len, mtu)
			}
		}
		if f.synMSS != 0 {
			syn++
			max := mtu - 40
			if f.network == "ip6" {
				max = mtu - 60
			}
			if f.synMSS > max {
				t.Errorf("the container's %s SYN announces MSS %d, over %d (the host MTU's)", f.network, f.synMSS, max)
			}
			t.Logf("container %s SYN MSS %d", f.network, f.synMSS)
		}
	}
	if udp == 0 || syn < 2 {
		t.Errorf("capture saw %d UDP frames and %d SYNs: the capture does not work", udp, syn)
	}
}

// TestMTUTenantRaisesItsOwn: a tenant (root inside) raises the MTU of its
// routes (both families) and of IPv6 on eth0 to EthMTU and sends large datagrams, and
// writes a frame larger than the host MTU on eth0 through a packet
// socket: nothing larger than the host's MTU reaches the client (the
// wire guard at eth0's egress drops it, counted).
func TestMTUTenantRaisesItsOwn(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	mtu := e.info.MTU
	ch, err := a.proc.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	eth, err := ch.LinkByName(ContainerEth0)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ch.RouteList(eth, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		r.MTU = containerns.EthMTU
		if err := ch.RouteReplace(&r); err != nil {
			t.Fatalf("tenant raises route %s MTU: %v", r.Dst, err)
		}
	}
	if err := a.proc.SetSysctl("net/ipv6/conf/eth0/mtu", strconv.Itoa(containerns.EthMTU)); err != nil {
		t.Fatal(err)
	}
	// The client's end takes frames of any size, so the capture sees
	// whatever host eth0 sends (a veth checks its receiving end's MTU).
	raiseClientMTU(t, e)
	before, err := e.d.DropTotals(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	capture := e.clientCapture(t)
	pc4 := listenUDPIn(t, e.sb.Client, "udp4", "0.0.0.0:9001")
	pc6 := listenUDPIn(t, e.sb.Client, "udp6", "[::]:9002")
	for _, n := range []int{4000, 9000} {
		sendFrom(t, a.proc, "udp4", clientAddr(9001), bigMsg("r4", n))
		sendFrom(t, a.proc, "udp6", client6Addr(e, 9002), bigMsg("r6", n))
	}
	// Whole IPv4/UDP frames from the host's address and a port of the
	// container's, written on eth0 as is. The host veth takes them (its
	// MTU is the loopback size with the wire guard on; without, it takes
	// up to MTU + 18 bytes: its slack for a VLAN tag, tagged or not) and
	// its filters send them to eth0, where the wire guard drops every one
	// over MTU + 14 bytes, counted (ip_header). One of 1,400 bytes goes.
	big := []int{mtu + 16, mtu + 18, 3000, 9000}
	for _, size := range append([]int{1400}, big...) {
		if err := a.proc.Do(func() error { return sendRawUDP(e, eth.Attrs().Index, size) }); err != nil {
			t.Errorf("a %d-byte frame on eth0 through a packet socket: %v, want it sent (and dropped at eth0)", size, err)
		}
	}
	// A small one afterwards, which must arrive: the capture works and
	// everything before it has been through.
	sendFrom(t, a.proc, "udp4", clientAddr(9001), "small")
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got := reply(pc4, time.Until(deadline)); got == "small" || got == "" {
			break
		}
	}
	reply(pc6, 100*time.Millisecond)
	var seen int
	for _, f := range capture.read() {
		seen++
		if f.len > mtu+14 && f.synMSS == 0 {
			t.Errorf("the client received a %s frame of %d bytes (udp %v), over the host MTU %d", f.network, f.len, f.udp, mtu)
		}
	}
	if seen == 0 {
		t.Error("the capture saw nothing: not even the small datagram")
	}
	if e.d.wire == nil {
		t.Fatal("no wire guard on eth0")
	}
	wait.For(t, 5*time.Second, "the wire guard's drops counted", func() bool {
		after, err := e.d.DropTotals(context.Background())
		return err == nil && after[tcfilter.DropWire]-before[tcfilter.DropWire] >= uint64(len(big))
	})
}

// raiseClientMTU gives the client's end of the sandbox's wire the largest
// MTU a veth takes.
func raiseClientMTU(t testing.TB, e *env) {
	t.Helper()
	h, err := e.sb.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err == nil {
		err = h.LinkSetMTU(l, containerns.EthMTU)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// sendRawUDP writes an IPv4/UDP frame of size bytes from the host's
// address and port 31005 to the client's port 9001 on link idx of the
// calling thread's namespace, through a packet socket.
func sendRawUDP(e *env, idx, size int) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	f := make([]byte, size)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], e.sb.HostMAC)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[12:16], e.sb.HostIP.To4())
	copy(ip[16:20], e.sb.ClientIP.To4())
	binary.BigEndian.PutUint16(ip[10:], traffic.Checksum(ip[:20]))
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:], 31005)
	binary.BigEndian.PutUint16(udp[2:], 9001)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	return unix.Sendto(fd, f, 0, &unix.SockaddrLinklayer{Ifindex: idx, Halen: 6})
}
