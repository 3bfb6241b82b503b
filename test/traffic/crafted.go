package traffic

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Crafted ARP and ICMP: what a LAN sends a host that has containers (ARP
// requests for other addresses, replies, ICMP errors quoting a flow, echo
// replies), built by hand so tests and benchmarks can send them at will.

// ARP operations.
const (
	ARPRequest = 1
	ARPReply   = 2
)

// ARPFrame builds an Ethernet frame carrying an ARP packet (IPv4 over
// Ethernet): from sha/spa to dst, asking for or answering about tpa.
func ARPFrame(dst, sha net.HardwareAddr, op uint16, spa net.IP, tha net.HardwareAddr, tpa net.IP) []byte {
	f := make([]byte, 14+28)
	copy(f[0:6], dst)
	copy(f[6:12], sha)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_ARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1) // Ethernet
	binary.BigEndian.PutUint16(a[2:], unix.ETH_P_IP)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], op)
	copy(a[8:14], sha)
	copy(a[14:18], spa.To4())
	if tha != nil {
		copy(a[18:24], tha)
	}
	copy(a[24:28], tpa.To4())
	return f
}

// Broadcast is the Ethernet broadcast address.
var Broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// FrameSender sends raw Ethernet frames out of one interface of the network
// namespace the calling thread was in when it was opened.
type FrameSender struct {
	fd   int
	addr unix.SockaddrLinklayer
}

// OpenFrameSender opens an AF_PACKET socket on interface ifname.
func OpenFrameSender(ifname string) (*FrameSender, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	return &FrameSender{fd: fd, addr: unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}}, nil
}

// Send sends one frame.
func (s *FrameSender) Send(frame []byte) error {
	return unix.Sendto(s.fd, frame, 0, &s.addr)
}

// Close closes the socket.
func (s *FrameSender) Close() error { return unix.Close(s.fd) }

// ICMPError builds an ICMP error message (typ 3 destination unreachable,
// code 4 fragmentation needed with next-hop mtu, or typ 11 time exceeded)
// quoting the first 28 bytes of a packet src:sport -> dst:dport of protocol
// proto (unix.IPPROTO_TCP or IPPROTO_UDP) with no IP options.
func ICMPError(typ, code uint8, mtu uint16, proto uint8, src net.IP, sport uint16, dst net.IP, dport uint16) []byte {
	m := make([]byte, 8+20+8)
	m[0], m[1] = typ, code
	binary.BigEndian.PutUint16(m[6:], mtu)
	ip := m[8:28]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 1500)
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8], ip[9] = 64, proto
	copy(ip[12:16], src.To4())
	copy(ip[16:20], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], Checksum(ip))
	l4 := m[28:]
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], dport)
	binary.BigEndian.PutUint16(m[2:], Checksum(m))
	return m
}

// EchoRequest builds an ICMP echo request with identifier id and sequence
// seq (16 bytes of payload).
func EchoRequest(id, seq uint16) []byte { return echoRequest(id, seq) }

// EchoRequestSized builds an echo request with size bytes of payload.
func EchoRequestSized(id, seq uint16, size int) []byte {
	m := make([]byte, 8+size)
	m[0] = 8
	binary.BigEndian.PutUint16(m[4:], id)
	binary.BigEndian.PutUint16(m[6:], seq)
	binary.BigEndian.PutUint16(m[2:], Checksum(m))
	return m
}

// EchoReply builds an ICMP echo reply with identifier id and sequence seq.
func EchoReply(id, seq uint16) []byte {
	m := echoRequest(id, seq)
	m[0] = 0
	m[2], m[3] = 0, 0
	binary.BigEndian.PutUint16(m[2:], Checksum(m))
	return m
}

// ICMPSender sends ICMP messages from a raw socket of the network namespace
// the calling thread was in when it was opened (the kernel adds the IP
// header).
type ICMPSender struct{ c net.PacketConn }

// OpenICMPSender opens the raw ICMP socket (needs root).
func OpenICMPSender() (*ICMPSender, error) {
	c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
	if err != nil {
		return nil, fmt.Errorf("raw ICMP socket: %w", err)
	}
	return &ICMPSender{c: c}, nil
}

// Send sends msg to dst.
func (s *ICMPSender) Send(dst net.IP, msg []byte) error {
	_, err := s.c.WriteTo(msg, &net.IPAddr{IP: dst})
	return err
}

// Close closes the socket.
func (s *ICMPSender) Close() error { return s.c.Close() }

// WaitEchoReply reads until an echo reply with identifier id arrives (its
// ICMP message is returned) or the deadline passes.
func (s *ICMPSender) WaitEchoReply(id uint16, deadline time.Time) ([]byte, error) {
	buf := make([]byte, 65536)
	s.c.SetReadDeadline(deadline)
	for {
		n, _, err := s.c.ReadFrom(buf)
		if err != nil {
			return nil, err
		}
		if n >= 8 && buf[0] == 0 && binary.BigEndian.Uint16(buf[4:]) == id {
			return append([]byte(nil), buf[:n]...), nil
		}
	}
}

// ICMPCounters reads the "Icmp:" counters of /proc/net/snmp of the network
// namespace of the calling thread (InMsgs, InDestUnreachs, InTimeExcds,
// InEchoReps, ...).
func ICMPCounters() (map[string]int64, error) { return SNMPCounters("Icmp:") }

// SNMPCounters reads one group of /proc/net/snmp ("Ip:", "Icmp:", ...) of
// the network namespace of the calling thread.
func SNMPCounters(group string) (map[string]int64, error) {
	b, err := os.ReadFile("/proc/thread-self/net/snmp")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != group {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		out := map[string]int64{}
		for i, v := range f[1:] {
			if i < len(names) {
				out[names[i]], _ = strconv.ParseInt(v, 10, 64)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("no %s counters in /proc/net/snmp", group)
}
