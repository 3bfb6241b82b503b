package tcfilter

import (
	"crypto/rand"
	"encoding/binary"
	"maps"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/test/traffic"
)

// frame6 builds an Ethernet frame carrying an IPv6 packet (hop limit 255)
// whose next header is nh and payload p.
func frame6(dstMAC, srcMAC net.HardwareAddr, src, dst net.IP, nh uint8, p []byte) []byte {
	f := make([]byte, 14+40, 14+40+len(p))
	copy(f[0:6], dstMAC)
	copy(f[6:12], srcMAC)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IPV6)
	ip := f[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(p)))
	ip[6], ip[7] = nh, 255
	copy(ip[8:24], src.To16())
	copy(ip[24:40], dst.To16())
	return append(f, p...)
}

// udp6 is a UDP header and payload (checksum left 0: the captures look
// at frames, not at what a stack would accept).
func udp6(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	return append(b, payload...)
}

// ndp is a neighbour solicitation (135) or advertisement (136) for target
// with a link-layer address option of type opt (1 source, 2 target)
// carrying mac (none if mac is nil). (Attack cases put their marker in the
// IPv6 destination, so that their length is that of a genuine message.)
func ndp(typ uint8, target net.IP, opt uint8, mac net.HardwareAddr) []byte {
	b := make([]byte, 24)
	b[0] = typ
	if typ == icmp6NA {
		b[4] = 0x20 // override
	}
	copy(b[8:24], target.To16())
	if mac != nil {
		b = append(b, opt, 1)
		b = append(b, mac...)
	}
	return b
}

// TestIPv6Attacks: a hostile tenant (root in container A, a raw packet
// socket on its eth0) sends forged IPv6: nothing reaches the client or
// the host's lo, and A's drop counter rises for each reason. Absence is
// read once a legitimate canary sent after the attack frames, on the same
// path, has arrived.
func TestIPv6Attacks(t *testing.T) {
	w := newWire6(t)
	a := w.plumb6(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	b := w.plumb(t, "cb", 2, rg(33792, 34047)) // attacks nothing, IPv4 only: counts nothing
	onWire := traffic.StartCapture(t, w.s.Client.Do, "eth0", "the wire")
	onLo := traffic.StartCapture(t, w.s.Host.Do, "lo", "host lo")
	var snd *traffic.FrameSender
	if err := a.c.Do(func() error {
		var err error
		snd, err = traffic.OpenFrameSender("eth0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close() })
	evil := net.HardwareAddr{0x02, 0, 0, 0, 0x66, 0x66}
	allNodes := net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	forged := net.ParseIP("2001:db8::99")
	hopByHop := func(next uint8, p []byte) []byte { // 8-byte hop-by-hop header (PadN)
		return append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, p...)
	}
	// mld is an MLD message of type typ as a container's kernel sends it
	// (hop limit 1, a hop-by-hop header holding only a router alert for
	// MLD and a PadN) from src to dst, the marker after its first 8
	// bytes; ra replaces the hop-by-hop header when set.
	mld := func(src, dst net.IP, typ uint8, ra []byte, m []byte) []byte {
		if ra == nil {
			ra = []byte{ipprotoICMPv6, 0, 5, 2, 0, 0, 1, 0}
		}
		f := frame6(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 0x16}, w.mac, src, dst, unix.IPPROTO_HOPOPTS,
			append(append(append([]byte(nil), ra...), typ, 0, 0, 0, 0, 0, 0, 1), m...))
		f[14+7] = 1
		return f
	}
	mldDst := net.ParseIP("ff02::16")
	fragment := func(next uint8, p []byte) []byte { // first fragment, more follow
		return append([]byte{next, 0, 0, 1, 0, 0, 0, 42}, p...)
	}
	cases := []struct {
		name   string
		reason string
		frame  func(marker []byte) []byte
	}{
		{"forged source", DropSource, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, forged, client6, ipprotoUDP, udp6(20001, 9000, m))
		}},
		{"forged source to the host", DropSource, func(m []byte) []byte {
			return frame6(w.mac, w.mac, forged, host6, ipprotoUDP, udp6(20001, 7000, m))
		}},
		{"unowned source port", DropPort, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, client6, ipprotoUDP, udp6(40000, 9000, m))
		}},
		{"unowned source port to the host", DropPort, func(m []byte) []byte {
			return frame6(w.mac, w.mac, host6, host6, ipprotoUDP, udp6(40000, 7000, m))
		}},
		{"forged Ethernet source", DropMAC, func(m []byte) []byte {
			return frame6(w.cmac, evil, host6, client6, ipprotoUDP, udp6(20001, 9000, m))
		}},
		{"hop-by-hop header hiding an owned port", DropIPv6Ext, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, client6, unix.IPPROTO_HOPOPTS, hopByHop(ipprotoUDP, udp6(20001, 9000, m)))
		}},
		{"MLD report from :: (what a container's kernel sends)", DropMLD, func(m []byte) []byte {
			return mld(net.IPv6unspecified, mldDst, 143, nil, m)
		}},
		{"MLD done from ::", DropMLD, func(m []byte) []byte {
			return mld(net.IPv6unspecified, net.ParseIP("ff02::2"), 132, nil, m)
		}},
		{"MLD report from a global host address", DropIPv6Ext, func(m []byte) []byte {
			return mld(host6, mldDst, 143, nil, m)
		}},
		{"MLD report to a global address", DropSource, func(m []byte) []byte {
			return mld(net.IPv6unspecified, client6, 143, nil, m)
		}},
		{"router alert hiding UDP", DropIPv6Ext, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, client6, unix.IPPROTO_HOPOPTS,
				append([]byte{ipprotoUDP, 0, 5, 2, 0, 0, 1, 0}, udp6(20001, 9000, m)...))
		}},
		{"MLD report with a longer hop-by-hop header", DropSource, func(m []byte) []byte {
			return mld(net.IPv6unspecified, mldDst, 143, []byte{ipprotoICMPv6, 1, 5, 2, 0, 0, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0}, m)
		}},
		{"MLD report with another router alert value", DropSource, func(m []byte) []byte {
			return mld(net.IPv6unspecified, mldDst, 143, []byte{ipprotoICMPv6, 0, 5, 2, 0, 1, 1, 0}, m)
		}},
		{"MLD query from ::", DropSource, func(m []byte) []byte {
			return mld(net.IPv6unspecified, mldDst, 130, nil, m)
		}},
		{"first fragment of an unowned port", DropPort, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, client6, unix.IPPROTO_FRAGMENT, fragment(ipprotoUDP, udp6(40000, 9000, m)))
		}},
		{"first fragment of an unowned port to the host", DropPort, func(m []byte) []byte {
			return frame6(w.mac, w.mac, host6, host6, unix.IPPROTO_FRAGMENT, fragment(ipprotoUDP, udp6(40000, 7000, m)))
		}},
		{"fragment header hiding a hop-by-hop header", DropIPv6Ext, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, client6, unix.IPPROTO_FRAGMENT, fragment(unix.IPPROTO_HOPOPTS, hopByHop(ipprotoUDP, udp6(20001, 9000, m))))
		}},
		{"other next header", DropProtocol, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, client6, unix.IPPROTO_SCTP, m)
		}},
		{"advertisement for the host address with another MAC", DropNDP, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, m, ipprotoICMPv6, ndp(icmp6NA, host6, 2, evil))
		}},
		{"advertisement for the client's address", DropNDP, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, m, ipprotoICMPv6, ndp(icmp6NA, client6, 2, w.mac))
		}},
		{"solicitation with another MAC", DropNDP, func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, m, ipprotoICMPv6, ndp(icmp6NS, client6, 1, evil))
		}},
		{"router advertisement", DropNDP, func(m []byte) []byte {
			ra := []byte{icmp6RA, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0}
			return frame6(w.cmac, w.mac, host6, m, ipprotoICMPv6, ra)
		}},
		{"redirect", DropNDP, func(m []byte) []byte {
			rd := append(append([]byte{icmp6Redirect, 0, 0, 0, 0, 0, 0, 0}, forged.To16()...), client6.To16()...)
			return frame6(w.cmac, w.mac, host6, m, ipprotoICMPv6, rd)
		}},
		{"error about a flow that is not A's", DropICMP, func(m []byte) []byte {
			quoted := frame6(nil, nil, client6, host6, ipprotoUDP, udp6(9000, 40000, m))[14:]
			return frame6(w.cmac, w.mac, host6, client6, ipprotoICMPv6, append([]byte{1, 4, 0, 0, 0, 0, 0, 0}, quoted...))
		}},
	}
	canaries := func() {
		t.Helper()
		m := make([]byte, 16)
		rand.Read(m)
		if err := snd.Send(frame6(w.cmac, w.mac, host6, client6, ipprotoUDP, udp6(20001, 9000, m))); err != nil {
			t.Fatal(err)
		}
		if err := snd.Send(frame6(w.mac, w.mac, host6, host6, ipprotoUDP, udp6(20001, 7000, m))); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the canaries", 3*time.Second, func() bool { return onWire.Count(m) > 0 && onLo.Count(m) > 0 })
	}
	canaries() // the legitimate paths work
	for _, tc := range cases {
		before, err := a.vf.Drops()
		if err != nil {
			t.Fatal(err)
		}
		m := make([]byte, 16)
		rand.Read(m)
		for i := 0; i < 3; i++ {
			if err := snd.Send(tc.frame(m)); err != nil {
				t.Fatalf("%s: send: %v", tc.name, err)
			}
		}
		canaries()
		if n, l := onWire.Count(m), onLo.Count(m); n+l > 0 {
			t.Errorf("%s: %d frames reached the client, %d the host's lo", tc.name, n, l)
		}
		after, err := a.vf.Drops()
		if err != nil {
			t.Fatal(err)
		}
		if after[tc.reason] < before[tc.reason]+3 {
			t.Errorf("%s: %s drops %d -> %d, want +3 (all: %v)", tc.name, tc.reason, before[tc.reason], after[tc.reason], after)
		}
		if bd, err := b.vf.Drops(); err != nil || !maps.Equal(bd, zeroCounts()) {
			t.Errorf("%s: the other container counts %v (%v), want nothing", tc.name, bd, err)
		}
	}

	// What a host process could send gets out: a solicitation in the
	// host's name, an advertisement of the host address with the host
	// MAC, an echo request.
	for _, tc := range []struct {
		name  string
		frame func(m []byte) []byte
	}{
		{"solicitation", func(m []byte) []byte {
			return frame6(allNodes, w.mac, host6, m, ipprotoICMPv6, ndp(icmp6NS, client6, 1, w.mac))
		}},
		{"advertisement", func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, m, ipprotoICMPv6, ndp(icmp6NA, host6, 2, w.mac))
		}},
		{"echo request", func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, client6, ipprotoICMPv6, append([]byte{icmp6EchoRequest, 0, 0, 0, 0, 1, 0, 1}, m...))
		}},
		{"first fragment from an owned port", func(m []byte) []byte {
			return frame6(w.cmac, w.mac, host6, client6, unix.IPPROTO_FRAGMENT, fragment(ipprotoUDP, udp6(20001, 9000, m)))
		}},
		{"later fragment", func(m []byte) []byte {
			later := []byte{ipprotoUDP, 0, 0, 0xb9, 0, 0, 0, 42} // offset 23 (184 bytes), last
			return frame6(w.cmac, w.mac, host6, client6, unix.IPPROTO_FRAGMENT, append(later, m...))
		}},
	} {
		m := make([]byte, 16)
		rand.Read(m)
		if err := snd.Send(tc.frame(m)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, tc.name+" on the wire", 3*time.Second, func() bool { return onWire.Count(m) > 0 })
	}
}
