package dataplane

// The attack suite of the rule "a frame leaves a container's veth only if
// a process on the host that owned exactly the container's ports could
// have sent it": a hostile tenant (root in container A, raw AF_PACKET
// socket on its eth0) tries every trick, with ip_forward=1 on the sandbox
// host (never the real one). Each case asserts that its frames reached
// neither the client namespace, nor the host's sockets (and host lo), nor
// container B (AF_PACKET captures on the receiving side), and that A's
// drop counter for the reason rose. Absence is proved by ordering, not by
// waiting: after a case's frames, legitimate canaries are sent along every
// path, and once each capture has seen its canary, anything sent before it
// would have arrived too.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// udpSink is a UDP socket of the host that records what it receives.
type udpSink struct {
	mu   sync.Mutex
	got  [][]byte
	conn *net.UDPConn
}

func (u *udpSink) count(marker []byte) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, p := range u.got {
		if bytes.Contains(p, marker) {
			n++
		}
	}
	return n
}

func startUDPSink(t *testing.T, ns doer, port int) *udpSink {
	t.Helper()
	u := &udpSink{}
	err := ns.Do(func() (err error) {
		u.conn, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 70000)
		for {
			n, err := u.conn.Read(buf)
			if err != nil {
				return
			}
			u.mu.Lock()
			u.got = append(u.got, bytes.Clone(buf[:n]))
			u.mu.Unlock()
		}
	}()
	t.Cleanup(func() { u.conn.Close(); <-done })
	return u
}

// ---- frame building ----

var csum = traffic.Checksum

func eth(dst, src net.HardwareAddr, typ uint16, payload ...[]byte) []byte {
	b := append(append(append([]byte{}, dst...), src...), byte(typ>>8), byte(typ))
	for _, p := range payload {
		b = append(b, p...)
	}
	return b
}

type ipOpts struct {
	options []byte // multiple of 4
	fragOff uint16 // in 8-byte units
	mf      bool
	id      uint16
}

func ipv4(src, dst net.IP, proto byte, payload []byte, o ipOpts) []byte {
	hl := 20 + len(o.options)
	h := make([]byte, hl)
	h[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(h[2:], uint16(hl+len(payload)))
	binary.BigEndian.PutUint16(h[4:], o.id)
	ff := o.fragOff & 0x1fff
	if o.mf {
		ff |= 0x2000
	}
	binary.BigEndian.PutUint16(h[6:], ff)
	h[8] = 64
	h[9] = proto
	copy(h[12:], src.To4())
	copy(h[16:], dst.To4())
	copy(h[20:], o.options)
	binary.BigEndian.PutUint16(h[10:], csum(h))
	return append(h, payload...)
}

func udp(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	return append(b, payload...) // checksum 0: none
}

func tcpSyn(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint32(b[4:], 12345)
	b[12] = 5 << 4
	b[13] = 0x02 // SYN
	binary.BigEndian.PutUint16(b[14:], 65535)
	return append(b, payload...)
}

func icmpMsg(typ, code byte, rest []byte) []byte {
	b := append([]byte{typ, code, 0, 0}, rest...)
	binary.BigEndian.PutUint16(b[2:], csum(b))
	return b
}

func arpBody(op uint16, sha net.HardwareAddr, spa net.IP, tha net.HardwareAddr, tpa net.IP) []byte {
	b := []byte{0, 1, 8, 0, 6, 4, byte(op >> 8), byte(op)}
	b = append(b, sha...)
	b = append(b, spa.To4()...)
	b = append(b, tha...)
	return append(b, tpa.To4()...)
}

// openRawSender opens a frame sender on a container's eth0 (inside ns),
// closed when the test ends.
func openRawSender(t *testing.T, ns doer) *traffic.FrameSender {
	t.Helper()
	var s *traffic.FrameSender
	if err := ns.Do(func() (err error) { s, err = traffic.OpenFrameSender(ContainerEth0); return err }); err != nil {
		t.Fatalf("raw socket in container: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newMarker(t *testing.T, kind string) []byte {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return []byte("ISO12-" + kind + "-" + hex.EncodeToString(b))
}

// attackBed is the sandbox of the suite.
type attackBed struct {
	e                      *env
	a, b                   ctr
	raw                    *traffic.FrameSender
	client, hostLo, inB    *traffic.Capture
	hostUDP                *udpSink
	hostMAC, clientMAC     net.HardwareAddr
	hostIP, clientIP, ip77 net.IP
}

const (
	bedHostPort   = 8000  // a host socket
	bedClientPort = 9000  // the client's
	bedOwnPort    = 31000 // A's static port
	bedBPort      = 31010 // B's static port
)

func newAttackBed(t *testing.T) *attackBed {
	e := newEnv(t)
	if !e.info.Features[plane.FeatureClsBPF] {
		t.Skip("the kernel does not load cls_bpf programs")
	}
	x := &attackBed{e: e, hostMAC: e.info.MAC, hostIP: sandbox.HostIP, clientIP: sandbox.ClientIP, ip77: net.IPv4(198, 18, 0, 77).To4()}
	// The usual setting of a container host, on the sandbox host only: a
	// frame falling to a veth's own stack would be routed.
	if err := e.sb.Host.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	x.a = e.start("A", 1, "40960-41983", "31000-31009", "", bedOwnPort+1)
	x.b = e.start("B", 2, "41984-43007", "31010-31019", "", bedBPort+1)
	x.raw = openRawSender(t, x.a.proc)
	x.client = traffic.StartCapture(t, e.sb.Client.Do, "eth0", "client")
	x.hostLo = traffic.StartCapture(t, e.sb.Host.Do, "lo", "host lo")
	x.inB = traffic.StartCapture(t, x.b.proc.Do, ContainerEth0, "container B")
	x.hostUDP = startUDPSink(t, e.sb.Host, bedHostPort)
	startUDPSink(t, x.b.proc, bedBPort) // B's port is open: a leak would not even be refused
	err := e.sb.Client.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		x.clientMAC = ifi.HardwareAddr
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The client and A learn each other's MAC (ARP through the filters).
	x.canaries(t)
	return x
}

// sendUDP sends one datagram from A with an ordinary socket (a port of
// A's ephemeral range), bound to src when given.
func (x *attackBed) sendUDP(t *testing.T, src net.IP, dst string, payload []byte) {
	t.Helper()
	err := x.a.proc.Do(func() error {
		var laddr *net.UDPAddr
		if src != nil {
			laddr = &net.UDPAddr{IP: src}
		}
		raddr, err := net.ResolveUDPAddr("udp4", dst)
		if err != nil {
			return err
		}
		c, err := net.DialUDP("udp4", laddr, raddr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(payload)
		return err
	})
	if err != nil {
		t.Fatalf("udp from A to %s: %v", dst, err)
	}
}

// canaries sends legitimate datagrams from A to the client, a host socket
// and B, and waits until each capture saw its own.
func (x *attackBed) canaries(t *testing.T) {
	t.Helper()
	m := newMarker(t, "canary")
	// Sent again every half second until seen: on a loaded machine the
	// first datagram may wait for a neighbour entry and be dropped.
	caps := []*traffic.Capture{x.client, x.hostLo, x.inB}
	dsts := []string{clientAddr(bedClientPort), hostAddr(bedHostPort), hostAddr(bedBPort)}
	for i, c := range caps {
		seen := false
		for try := 0; try < 20 && !seen; try++ {
			x.sendUDP(t, nil, dsts[i], m)
			seen = c.WaitFor(m, 500*time.Millisecond)
		}
		if !seen {
			t.Fatalf("canary never reached %s: the bed is broken", c.Name)
		}
	}
	wait.For(t, 5*time.Second, "the canary reaches the host's socket", func() bool { return x.hostUDP.count(m) > 0 })
}

func (x *attackBed) drops(t *testing.T) map[string]uint64 { return x.dropsOf(t, x.a) }

func (x *attackBed) dropsOf(t *testing.T, c ctr) map[string]uint64 {
	t.Helper()
	s, err := x.e.d.Stats(context.Background(), c.c)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Dropped) != len(tcfilter.DropReasons) {
		t.Fatalf("container %s: drop counts %v, want every reason", c.c.ID, s.Dropped)
	}
	return s.Dropped
}

// nothingReached asserts that no frame carrying m reached anyone.
func (x *attackBed) nothingReached(t *testing.T, m []byte) {
	t.Helper()
	x.canaries(t)
	for _, c := range []*traffic.Capture{x.client, x.hostLo, x.inB} {
		if n := c.Count(m); n > 0 {
			t.Errorf("%d frame(s) of the attack reached %s", n, c.Name)
		}
	}
	if n := x.hostUDP.count(m); n > 0 {
		t.Errorf("%d datagram(s) of the attack reached a host socket", n)
	}
}

// rose waits until A's counter for reason has grown by at least n.
func (x *attackBed) rose(t *testing.T, before map[string]uint64, reason string, n uint64) {
	t.Helper()
	var now map[string]uint64
	wait.Until(3*time.Second, func() bool { now = x.drops(t); return now[reason] >= before[reason]+n })
	if now[reason] < before[reason]+n {
		t.Errorf("drop counter %q went from %d to %d, want +%d (all: %v)", reason, before[reason], now[reason], n, now)
	}
	// B, which attacks nothing, counts nothing: A's drops are A's.
	for r, k := range x.dropsOf(t, x.b) {
		if k != 0 {
			t.Errorf("container B (not attacking) counts %d %s drops while A attacks", k, r)
		}
	}
}

// legit frames of A: host MAC and IP, A's static port.
func (x *attackBed) udpFrame(dstMAC net.HardwareAddr, src net.IP, sport uint16, dst net.IP, dport uint16, m []byte, o ipOpts) []byte {
	return eth(dstMAC, x.hostMAC, unix.ETH_P_IP, ipv4(src, dst, unix.IPPROTO_UDP, udp(sport, dport, m), o))
}

func TestAttackSuite(t *testing.T) {
	checkRootUnchanged(t)
	x := newAttackBed(t)
	evilMAC := net.HardwareAddr{0x02, 0x66, 0x66, 0x66, 0x66, 0x66}
	hm := x.hostMAC // frames to the host MAC: a veth's own stack would take them

	t.Run("control/raw-frames-of-an-owner-get-out", func(t *testing.T) {
		m := newMarker(t, "ok")
		if err := x.raw.Send(x.udpFrame(x.clientMAC, x.hostIP, bedOwnPort, x.clientIP, bedClientPort, m, ipOpts{})); err != nil {
			t.Fatal(err)
		}
		if !x.client.WaitFor(m, 5*time.Second) {
			t.Fatal("a legitimate raw frame did not reach the client: the suite would prove nothing")
		}
		// An ICMP error about a flow of A's own port, quoted with IHL 5.
		m2 := newMarker(t, "okicmp")
		quoted := ipv4(x.clientIP, x.hostIP, unix.IPPROTO_UDP, udp(5555, bedOwnPort, m2), ipOpts{})
		f := eth(x.clientMAC, x.hostMAC, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(3, 3, append(make([]byte, 4), quoted...)), ipOpts{}))
		if err := x.raw.Send(f); err != nil {
			t.Fatal(err)
		}
		if !x.client.WaitFor(m2, 5*time.Second) {
			t.Error("a port unreachable about A's own port did not reach the client")
		}
		// An ARP request in the host's name.
		m3 := newMarker(t, "okarp")
		bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		if err := x.raw.Send(eth(bcast, hm, unix.ETH_P_ARP, arpBody(1, hm, x.hostIP, make(net.HardwareAddr, 6), x.clientIP), m3)); err != nil {
			t.Fatal(err)
		}
		if !x.client.WaitFor(m3, 5*time.Second) {
			t.Error("an ARP request in the host's name did not reach the client")
		}
	})

	type tc struct {
		name, reason string
		frames       func(m []byte) [][]byte
	}
	one := func(f func(m []byte) []byte) func(m []byte) [][]byte {
		return func(m []byte) [][]byte { return [][]byte{f(m)} }
	}
	quote := func(proto byte, sport, dport uint16, m []byte) []byte {
		var l4 []byte
		if proto == unix.IPPROTO_TCP {
			l4 = tcpSyn(sport, dport, m)
		} else {
			l4 = udp(sport, dport, m)
		}
		return append(make([]byte, 4), ipv4(x.clientIP, x.hostIP, proto, l4, ipOpts{})...)
	}
	cases := []tc{
		// forged sources
		{"forged-source-ip/tcp", tcfilter.DropSource, one(func(m []byte) []byte {
			return eth(hm, hm, unix.ETH_P_IP, ipv4(x.ip77, x.clientIP, unix.IPPROTO_TCP, tcpSyn(bedOwnPort, bedClientPort, m), ipOpts{}))
		})},
		{"forged-source-ip/udp-to-host-socket", tcfilter.DropSource, one(func(m []byte) []byte {
			return x.udpFrame(hm, x.ip77, bedOwnPort, x.hostIP, bedHostPort, m, ipOpts{})
		})},
		{"forged-source-ip/icmp-echo", tcfilter.DropSource, one(func(m []byte) []byte {
			return eth(hm, hm, unix.ETH_P_IP, ipv4(x.ip77, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(8, 0, append([]byte{0, 1, 0, 1}, m...)), ipOpts{}))
		})},
		{"forged-source-ip/loopback-to-outside", tcfilter.DropSource, one(func(m []byte) []byte {
			return x.udpFrame(hm, net.IPv4(127, 0, 0, 1), bedOwnPort, x.clientIP, bedClientPort, m, ipOpts{})
		})},
		{"forged-source-mac/udp", tcfilter.DropMAC, one(func(m []byte) []byte {
			return eth(hm, evilMAC, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_UDP, udp(bedOwnPort, bedClientPort, m), ipOpts{}))
		})},
		{"forged-source-mac/tcp", tcfilter.DropMAC, one(func(m []byte) []byte {
			return eth(hm, evilMAC, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_TCP, tcpSyn(bedOwnPort, bedClientPort, m), ipOpts{}))
		})},
		{"forged-source-mac/icmp", tcfilter.DropMAC, one(func(m []byte) []byte {
			return eth(hm, evilMAC, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(8, 0, append([]byte{0, 1, 0, 1}, m...)), ipOpts{}))
		})},
		// source ports A does not own
		{"unowned-port/other-containers-static-port-tcp", tcfilter.DropPort, one(func(m []byte) []byte {
			return eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_TCP, tcpSyn(bedBPort, bedClientPort, m), ipOpts{}))
		})},
		{"unowned-port/other-containers-static-port-to-host", tcfilter.DropPort, one(func(m []byte) []byte {
			return x.udpFrame(hm, x.hostIP, bedBPort, x.hostIP, bedHostPort, m, ipOpts{})
		})},
		{"unowned-port/host-range", tcfilter.DropPort, one(func(m []byte) []byte {
			return x.udpFrame(hm, x.hostIP, 61000, x.clientIP, bedClientPort, m, ipOpts{})
		})},
		{"unowned-port/0-and-1", tcfilter.DropPort, func(m []byte) [][]byte {
			return [][]byte{
				x.udpFrame(hm, x.hostIP, 0, x.clientIP, bedClientPort, m, ipOpts{}),
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_TCP, tcpSyn(1, bedClientPort, m), ipOpts{})),
			}
		}},
		{"unowned-port/loopback-to-bs-port", tcfilter.DropPort, one(func(m []byte) []byte {
			lo := net.IPv4(127, 0, 0, 1)
			return x.udpFrame(hm, lo, bedBPort, lo, bedHostPort, m, ipOpts{})
		})},
		// host-only loopback services (with the data plane's default
		// port space, every port from 1024: here privileged ones)
		{"loopback/host-only-services", tcfilter.DropLoopback, func(m []byte) [][]byte {
			lo := net.IPv4(127, 0, 0, 1)
			return [][]byte{
				x.udpFrame(hm, lo, bedOwnPort, net.IPv4(127, 0, 0, 53), 53, m, ipOpts{}),
				eth(hm, hm, unix.ETH_P_IP, ipv4(lo, lo, unix.IPPROTO_TCP, tcpSyn(bedOwnPort, 22, m), ipOpts{})),
				x.udpFrame(hm, x.hostIP, bedOwnPort, lo, 25, m, ipOpts{}),
			}
		}},
		// other IP protocols
		{"protocol/gre", tcfilter.DropProtocol, one(func(m []byte) []byte {
			return eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, 47, append([]byte{0, 0, 8, 0}, m...), ipOpts{}))
		})},
		{"protocol/sctp", tcfilter.DropProtocol, one(func(m []byte) []byte {
			return eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_SCTP, append(udp(bedOwnPort, bedClientPort, nil), m...), ipOpts{}))
		})},
		{"protocol/253", tcfilter.DropProtocol, one(func(m []byte) []byte {
			return eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.hostIP, 253, m, ipOpts{}))
		})},
		// other ethertypes
		{"ethertype/ipv6", tcfilter.DropEthertype, one(func(m []byte) []byte {
			h := make([]byte, 40)
			h[0] = 0x60
			binary.BigEndian.PutUint16(h[4:], uint16(len(m)+8))
			h[6], h[7] = unix.IPPROTO_UDP, 64
			copy(h[8:], net.ParseIP("fe80::1"))
			copy(h[24:], net.ParseIP("ff02::1"))
			return eth(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, hm, unix.ETH_P_IPV6, h, udp(bedOwnPort, bedClientPort, m))
		})},
		{"ethertype/lldp", tcfilter.DropEthertype, one(func(m []byte) []byte {
			return eth(net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x0e}, hm, 0x88cc, []byte{0x02, 0x07, 0x04}, hm, []byte{0}, m)
		})},
		{"ethertype/random", tcfilter.DropEthertype, one(func(m []byte) []byte {
			return eth(hm, hm, 0x1234, m)
		})},
		{"ethertype/vlan-802.1q", tcfilter.DropVLAN, one(func(m []byte) []byte {
			inner := ipv4(x.hostIP, x.clientIP, unix.IPPROTO_UDP, udp(bedOwnPort, bedClientPort, m), ipOpts{})
			return eth(x.clientMAC, hm, unix.ETH_P_8021Q, []byte{0, 5, 0x08, 0x00}, inner)
		})},
		{"ethertype/vlan-802.1ad", tcfilter.DropVLAN, one(func(m []byte) []byte {
			inner := ipv4(x.hostIP, x.clientIP, unix.IPPROTO_UDP, udp(bedOwnPort, bedClientPort, m), ipOpts{})
			return eth(x.clientMAC, hm, unix.ETH_P_8021AD, []byte{0, 5, 0x08, 0x00}, inner)
		})},
		// IP options and fragments
		{"ip-options", tcfilter.DropIPHeader, one(func(m []byte) []byte {
			return x.udpFrame(hm, x.hostIP, bedOwnPort, x.clientIP, bedClientPort, m, ipOpts{options: []byte{1, 1, 1, 1}})
		})},
		{"ip-options/record-route-to-host", tcfilter.DropIPHeader, one(func(m []byte) []byte {
			return x.udpFrame(hm, x.hostIP, bedOwnPort, x.hostIP, bedHostPort, m, ipOpts{options: []byte{7, 7, 4, 0, 0, 0, 0, 0}})
		})},
		{"fragments/later-part-claims-another-protocol", tcfilter.DropProtocol, one(func(m []byte) []byte {
			// the first part (own port, allowed) is sent by the case below
			return eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, 47, m, ipOpts{fragOff: 2, id: 777}))
		})},
		{"fragments/later-part-from-another-source", tcfilter.DropSource, one(func(m []byte) []byte {
			return eth(hm, hm, unix.ETH_P_IP, ipv4(x.ip77, x.clientIP, unix.IPPROTO_UDP, m, ipOpts{fragOff: 2, id: 778}))
		})},
		{"fragments/first-part-from-an-unowned-port", tcfilter.DropPort, one(func(m []byte) []byte {
			return x.udpFrame(hm, x.hostIP, bedBPort, x.clientIP, bedClientPort, m, ipOpts{mf: true, id: 779})
		})},
		// ICMP
		{"icmp/error-quoting-another-containers-flow", tcfilter.DropICMP, func(m []byte) [][]byte {
			return [][]byte{
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(3, 3, quote(unix.IPPROTO_UDP, 5555, bedBPort, m)), ipOpts{})),
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(3, 13, quote(unix.IPPROTO_TCP, 5555, bedBPort, m)), ipOpts{})),
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(3, 3, quote(unix.IPPROTO_UDP, 5555, 61000, m)), ipOpts{})),
			}
		}},
		// errors an end host does not send about its own flows change how
		// peers treat the shared address (path MTU, routes): never, even
		// quoting an own flow (issue 30)
		{"icmp_state/frag-needed-time-exceeded-redirect-even-about-own-flows", tcfilter.DropICMPState, func(m []byte) [][]byte {
			redirect := append(x.ip77.To4(), ipv4(x.hostIP, x.clientIP, unix.IPPROTO_UDP, udp(bedOwnPort, 53, m), ipOpts{})...)
			return [][]byte{
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(3, 4, quote(unix.IPPROTO_TCP, 5555, bedOwnPort, m)), ipOpts{})),
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(3, 4, quote(unix.IPPROTO_UDP, 5555, bedBPort, m)), ipOpts{})),
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(11, 0, quote(unix.IPPROTO_UDP, 5555, bedOwnPort, m)), ipOpts{})),
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(5, 1, redirect), ipOpts{})),
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(12, 0, quote(unix.IPPROTO_UDP, 5555, bedOwnPort, m)), ipOpts{})),
			}
		}},
		{"icmp/error-quoting-with-options-or-icmp", tcfilter.DropICMP, func(m []byte) [][]byte {
			withOpts := append(make([]byte, 4), ipv4(x.clientIP, x.hostIP, unix.IPPROTO_UDP, udp(5555, bedOwnPort, m), ipOpts{options: []byte{1, 1, 1, 1}})...)
			ofICMP := append(make([]byte, 4), ipv4(x.clientIP, x.hostIP, unix.IPPROTO_ICMP, icmpMsg(8, 0, m), ipOpts{})...)
			return [][]byte{
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(3, 3, withOpts), ipOpts{})),
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(3, 3, ofICMP), ipOpts{})),
			}
		}},
		{"icmp/other-types", tcfilter.DropICMP, func(m []byte) [][]byte {
			return [][]byte{
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(13, 0, append(make([]byte, 16), m...)), ipOpts{})),
				eth(hm, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(17, 0, append(make([]byte, 4), m...)), ipOpts{})),
			}
		}},
		// ARP (the marker rides in the Ethernet padding)
		{"arp/gratuitous-reply-poisoning-the-host-ip", tcfilter.DropARP, one(func(m []byte) []byte {
			bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
			return eth(bcast, hm, unix.ETH_P_ARP, arpBody(2, evilMAC, x.hostIP, bcast, x.hostIP), m)
		})},
		{"arp/gratuitous-request-with-a-foreign-mac", tcfilter.DropARP, one(func(m []byte) []byte {
			bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
			return eth(bcast, evilMAC, unix.ETH_P_ARP, arpBody(1, evilMAC, x.hostIP, make(net.HardwareAddr, 6), x.hostIP), m)
		})},
		{"arp/reply-in-the-hosts-name", tcfilter.DropARP, one(func(m []byte) []byte {
			return eth(x.clientMAC, hm, unix.ETH_P_ARP, arpBody(2, hm, x.hostIP, x.clientMAC, x.clientIP), m)
		})},
		{"arp/request-with-a-foreign-sender-ip", tcfilter.DropARP, one(func(m []byte) []byte {
			bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
			return eth(bcast, hm, unix.ETH_P_ARP, arpBody(1, hm, x.ip77, make(net.HardwareAddr, 6), x.clientIP), m)
		})},
		{"arp/request-with-a-foreign-sender-mac", tcfilter.DropARP, one(func(m []byte) []byte {
			bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
			return eth(bcast, hm, unix.ETH_P_ARP, arpBody(1, evilMAC, x.hostIP, make(net.HardwareAddr, 6), x.clientIP), m)
		})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMarker(t, "atk")
			before := x.drops(t)
			if c.name == "fragments/later-part-claims-another-protocol" {
				// the first part: A's own port, allowed out
				first := x.udpFrame(hm, x.hostIP, bedOwnPort, x.clientIP, bedClientPort, []byte("first-part-12345"), ipOpts{mf: true, id: 777})
				if err := x.raw.Send(first); err != nil {
					t.Fatal(err)
				}
			}
			fs := c.frames(m)
			for _, f := range fs {
				if err := x.raw.Send(f); err != nil {
					t.Fatalf("send: %v", err)
				}
			}
			x.nothingReached(t, m)
			x.rose(t, before, c.reason, uint64(len(fs)))
		})
	}

	t.Run("arp/the-neighbours-still-know-the-host", func(t *testing.T) {
		h, err := e2nl(x.e.sb.Client)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		ns, err := h.NeighList(0, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if n.IP.Equal(x.hostIP) && n.HardwareAddr.String() != x.hostMAC.String() {
				t.Errorf("the client believes %s is at %s (the host is %s)", x.hostIP, n.HardwareAddr, x.hostMAC)
			}
		}
		mustEcho(t, x.e.sb.Client, "tcp", hostAddr(bedOwnPort+1), "A")
	})

	t.Run("container-changes-its-eth0", func(t *testing.T) {
		h, err := x.a.proc.Netlink()
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		l, err := h.LinkByName(ContainerEth0)
		if err != nil {
			t.Fatal(err)
		}
		t.Run("mac", func(t *testing.T) {
			// Frames to the host leave through the container's lo
			// (redirected to eth0), with lo's MAC: change both.
			lo, err := h.LinkByName("lo")
			if err != nil {
				t.Fatal(err)
			}
			m := newMarker(t, "mac")
			// Containers ask the daemon for neighbours (neighsync), not
			// the wire; a hostile tenant puts its ARP back on the wire.
			wire := map[string]string{"net/ipv4/neigh/eth0/mcast_solicit": "3", "net/ipv4/neigh/eth0/app_solicit": "0"}
			for k, v := range wire {
				if err := x.a.proc.SetSysctl(k, v); err != nil {
					t.Fatal(err)
				}
			}
			before := x.drops(t)
			for _, x := range []netlink.Link{l, lo} {
				if err := h.LinkSetHardwareAddr(x, evilMAC); err != nil {
					t.Fatal(err)
				}
			}
			x.sendUDP(t, nil, clientAddr(bedClientPort), m)
			x.sendUDP(t, nil, hostAddr(bedHostPort), m)
			for _, x := range []netlink.Link{l, lo} {
				if err := h.LinkSetHardwareAddr(x, x0MAC(t, x, evilMAC)); err != nil {
					t.Fatal(err)
				}
			}
			// back to asking the daemon (for the canaries)
			for k, v := range map[string]string{"net/ipv4/neigh/eth0/mcast_solicit": "0", "net/ipv4/neigh/eth0/app_solicit": "3"} {
				if err := x.a.proc.SetSysctl(k, v); err != nil {
					t.Fatal(err)
				}
			}
			x.nothingReached(t, m)
			// The datagram to the host left with lo's new MAC; the one to
			// the client waited for the client's MAC (the change flushed
			// it): the ARP request in the new MAC's name was dropped.
			x.rose(t, before, tcfilter.DropMAC, 1)
			x.rose(t, before, tcfilter.DropARP, 1)
		})
		t.Run("ip", func(t *testing.T) {
			m := newMarker(t, "ip")
			before := x.drops(t)
			a := &netlink.Addr{IPNet: &net.IPNet{IP: x.ip77, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}}
			if err := h.AddrAdd(l, a); err != nil {
				t.Fatal(err)
			}
			x.sendUDP(t, x.ip77, clientAddr(bedClientPort), m)
			if err := h.AddrDel(l, a); err != nil {
				t.Fatal(err)
			}
			x.nothingReached(t, m)
			x.rose(t, before, tcfilter.DropSource, 1)
		})
		t.Run("mtu", func(t *testing.T) {
			m := newMarker(t, "mtu")
			st0, err := x.e.d.Stats(context.Background(), x.a.c)
			if err != nil {
				t.Fatal(err)
			}
			// eth0 has containerns.EthMTU already; the host's MTU is
			// on its routes: the tenant raises them.
			setRouteMTU := func(mtu int) {
				rs, err := h.RouteList(l, netlink.FAMILY_V4)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rs {
					r.MTU = mtu
					if err := h.RouteReplace(&r); err != nil {
						t.Fatal(err)
					}
				}
			}
			setRouteMTU(9000)
			x.sendUDP(t, nil, clientAddr(bedClientPort), append(m, make([]byte, 4000)...))
			setRouteMTU(x.e.info.MTU) // as it was
			x.nothingReached(t, m)
			var st1 plane.LinkStats
			// too big for the wire: with the wire guard the host end takes
			// it and the guard at eth0 drops it (counted: DropWire);
			// without, the veth drops it
			ok := wait.Until(5*time.Second, func() bool {
				st1, err = x.e.d.Stats(context.Background(), x.a.c)
				if err != nil {
					return false
				}
				if x.e.d.wire != nil {
					return st1.Dropped[tcfilter.DropWire] > st0.Dropped[tcfilter.DropWire]
				}
				return st1.TxDropped+st1.RxDropped > st0.TxDropped+st0.RxDropped
			})
			if !ok {
				t.Errorf("drop counters did not rise: %+v -> %+v (%v)", st0, st1, err)
			}
		})
	})
}

// x0MAC is the MAC link had before the test set it to evil: the host's.
func x0MAC(t *testing.T, link netlink.Link, evil net.HardwareAddr) net.HardwareAddr {
	t.Helper()
	if link.Attrs().HardwareAddr.String() == evil.String() {
		t.Fatalf("%s had the test's MAC already", link.Attrs().Name)
	}
	return link.Attrs().HardwareAddr
}

func e2nl(ns sandbox.NS) (*netlink.Handle, error) { return ns.Netlink() }

// TestARPFloodIsShaped: ARP a limited container sends goes through its
// egress shaper like everything else it sends.
func TestARPFloodIsShaped(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	if !e.info.Features[plane.FeatureHTB] {
		t.Skip("no HTB")
	}
	p := e.spawn("F", []uint16{40961}, false)
	c := e.spec("F", p, 3, "40960-41983", "", "")
	c.Egress = rate.Limit{Rate: 20000}
	e.setup(c)
	raw := openRawSender(t, p)
	client := traffic.StartCapture(t, e.sb.Client.Do, "eth0", "client")
	m := newMarker(t, "flood")
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	f := eth(bcast, e.info.MAC, unix.ETH_P_ARP, arpBody(1, e.info.MAC, sandbox.HostIP, make(net.HardwareAddr, 6), sandbox.ClientIP), m)
	st0, err := e.d.Stats(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	const n = 5000 // ~330 KB at 66 bytes: ~16 s at 20 kB/s
	start := time.Now()
	for i := 0; i < n; i++ {
		if err := raw.Send(f); err != nil && !errors.Is(err, unix.ENOBUFS) {
			t.Fatal(err)
		}
	}
	sent := time.Since(start)
	// Wait (bounded) until the shaper has accounted for every frame:
	// sent, dropped (queue full) or queued.
	var st1 plane.LinkStats
	wait.Until(5*time.Second, func() bool {
		if st1, err = e.d.Stats(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		eg := st1.Egress
		return eg.Packets+eg.Drops+eg.QueueLen-st0.Egress.Packets-st0.Egress.Drops >= n
	})
	eg := st1.Egress
	if got := eg.Packets + eg.Drops + eg.QueueLen - st0.Egress.Packets - st0.Egress.Drops; got < n {
		t.Errorf("the shaper saw %d of %d ARP frames", got, n)
	}
	elapsed := time.Since(start)
	got := client.Count(m)
	// What may have left: the burst plus the rate over the time so far.
	allowed := (c.Egress.EffectiveBurst() + uint64(elapsed.Seconds()*float64(c.Egress.Rate))) / uint64(len(f))
	if uint64(got) > allowed+10 {
		t.Errorf("%d ARP frames reached the client in %v (sent in %v), the limit allows ~%d", got, elapsed, sent, allowed)
	}
	if got == 0 {
		t.Error("no ARP frame of the limited container got out at all")
	}
}

// TestRefusedNamespaces: pid 1's and the daemon process's namespaces are
// never a container's, whatever namespace the data plane plumbs.
func TestRefusedNamespaces(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	// A data plane created from a thread inside the sandbox host: its own
	// (thread) namespace is the host namespace, the process's is not.
	var d *DataPlane
	err := e.sb.Host.Do(func() (err error) {
		d, err = New(Config{HostNS: e.sb.Host.Path, Logger: quietLogger(t)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.PrepareHost(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/proc/1/ns/net", "/proc/self/ns/net", e.sb.Host.Path} {
		if o, err := nshandle.Open(path); err != nil {
			t.Logf("%s cannot be opened here (%v): not checked", path, err)
			continue
		} else {
			o.Close()
		}
		c := plane.Container{ID: e.uniqueID("root"), Slot: 9, NetNS: path, Ephemeral: mustRange(t, "40960-41983")}
		_, err := d.Setup(context.Background(), c)
		var rn *plane.RefusedNamespaceError
		if !errors.Is(err, plane.ErrHostNamespace) || !errors.As(err, &rn) {
			t.Errorf("Setup in %s: %v, want a refused namespace", path, err)
			continue
		}
		t.Logf("%s: %v", path, err)
		if _, err := nshandle.Open(d.mountPath(c.ID)); err == nil {
			t.Errorf("a refused Setup left a bind mount for %s", c.ID)
		}
	}
	if len(d.ctrs) != 0 {
		t.Errorf("refused setups registered containers: %v", d.ctrs)
	}
}

func mustRange(t *testing.T, s string) ephemeral.Range {
	t.Helper()
	r, err := ephemeral.ParseRange(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
