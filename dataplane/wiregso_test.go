package dataplane

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
	"golang.org/x/sys/unix"
)

// TestWireGuardTenantGSO: a hostile tenant writes TCP GSO packets (IPv4,
// then IPv6) on its eth0 through a packet socket with PACKET_VNET_HDR,
// from a port it owns to the client: it chooses gso_size, and neither the veth nor a mirred
// redirect checks a GSO packet's size. One whose segments would exceed the
// host's MTU is dropped at eth0 and counted for the container; one cut to
// segments that fit (as the kernel's own are) reaches the client.
func TestWireGuardTenantGSO(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	if e.d.wire == nil {
		t.Fatal("no wire guard on eth0")
	}
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	mtu := e.info.MTU
	ch, err := a.proc.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	eth, err := ch.LinkByName(ContainerEth0)
	ch.Close()
	if err != nil {
		t.Fatal(err)
	}
	capture := e.clientCapture(t)
	for _, v6 := range []bool{false, true} {
		// Headers: 40 bytes of IPv4 and TCP, 60 of IPv6 and TCP.
		hdr := 40
		if v6 {
			hdr = 60
		}
		before, err := e.d.DropTotals(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		const total = 9000
		bad := []uint16{uint16(mtu - hdr + 1), 3000, 8000}
		good := uint16(mtu - hdr) // the largest that fits
		for i, gs := range append([]uint16{good}, bad...) {
			// the sizes tell the packets apart at the client
			size := total - 100*i
			if err := a.proc.Do(func() error { return sendGSO(e, eth.Attrs().Index, size, gs, v6) }); err != nil {
				t.Fatalf("GSO packet of %d bytes (IPv6 %v), gso_size %d, through a packet socket: %v", size, v6, gs, err)
			}
		}
		var seen map[int]bool
		wait.For(t, 5*time.Second, "the fitting GSO packet at the client", func() bool {
			seen = gsoSeen(capture, seen)
			return seen[total]
		})
		wait.For(t, 5*time.Second, "the wire guard's drops counted", func() bool {
			after, err := e.d.DropTotals(context.Background())
			return err == nil && after[tcfilter.DropWire]-before[tcfilter.DropWire] >= uint64(len(bad))
		})
		seen = gsoSeen(capture, seen)
		for i, gs := range bad {
			if size := total - 100*(i+1); seen[size] {
				t.Errorf("IPv6 %v: the client received the GSO packet with gso_size %d (segments of %d bytes over an MTU of %d)", v6, gs, int(gs)+hdr, mtu)
			}
		}
	}
}

// gsoSeen adds the lengths of the TCP packets from port 31005 to port 9001
// the capture has received to seen.
func gsoSeen(c *clientCapture, seen map[int]bool) map[int]bool {
	if seen == nil {
		seen = map[int]bool{}
	}
	buf := make([]byte, 70000)
	for range 10000 {
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			break
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype == unix.PACKET_OUTGOING || n < 74 {
			continue
		}
		ip := buf[14:n]
		var l4 []byte
		var proto byte
		switch binary.BigEndian.Uint16(buf[12:]) {
		case 0x0800:
			l4, proto = ip[(ip[0]&0xf)*4:], ip[9]
		case 0x86dd:
			l4, proto = ip[40:], ip[6]
		default:
			continue
		}
		if proto == unix.IPPROTO_TCP && binary.BigEndian.Uint16(l4) == 31005 && binary.BigEndian.Uint16(l4[2:]) == 9001 {
			seen[n] = true
		}
	}
	return seen
}

// sendGSO writes one TCP GSO packet of size bytes (Ethernet header
// included) from the host's address and port 31005 to the client's port
// 9001, IPv4 or IPv6, on link idx of the calling thread's namespace,
// through a packet socket with PACKET_VNET_HDR asking for segments of
// gsoSize bytes.
func sendGSO(e *env, idx, size int, gsoSize uint16, v6 bool) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		return err
	}
	iph, gsoType, ethType := 20, byte(1), uint16(0x0800) // VIRTIO_NET_HDR_GSO_TCPV4
	if v6 {
		iph, gsoType, ethType = 40, 4, 0x86dd // VIRTIO_NET_HDR_GSO_TCPV6
	}
	const vnet = 10 // struct virtio_net_hdr (little-endian)
	b := make([]byte, vnet+size)
	b[0] = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	b[1] = gsoType
	binary.LittleEndian.PutUint16(b[2:], uint16(14+iph+20)) // hdr_len
	binary.LittleEndian.PutUint16(b[4:], gsoSize)           // gso_size
	binary.LittleEndian.PutUint16(b[6:], uint16(14+iph))    // csum_start: the TCP header
	binary.LittleEndian.PutUint16(b[8:], 16)                // csum_offset: its checksum
	f := b[vnet:]
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], e.sb.HostMAC)
	binary.BigEndian.PutUint16(f[12:], ethType)
	ip := f[14:]
	if v6 {
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(ip)-40))
		ip[6], ip[7] = unix.IPPROTO_TCP, 64
		copy(ip[8:24], e.sb.HostIP6.To16())
		copy(ip[24:40], e.sb.ClientIP6.To16())
	} else {
		ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_TCP
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		copy(ip[12:16], e.sb.HostIP.To4())
		copy(ip[16:20], e.sb.ClientIP.To4())
		binary.BigEndian.PutUint16(ip[10:], traffic.Checksum(ip[:20]))
	}
	tcp := ip[iph:]
	binary.BigEndian.PutUint16(tcp[0:], 31005)
	binary.BigEndian.PutUint16(tcp[2:], 9001)
	binary.BigEndian.PutUint32(tcp[4:], 1)
	binary.BigEndian.PutUint32(tcp[8:], 1)
	tcp[12], tcp[13] = 5<<4, 0x18 // ACK PSH
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	return unix.Sendto(fd, b, 0, &unix.SockaddrLinklayer{Ifindex: idx, Halen: 6})
}
