package tcfilter

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/test/traffic"
)

// Attacks on what the containers share through the host's address
// (issue 30): the peers' path-MTU cache of the host IP and the host's
// loopback services.

// clientUDP is a UDP socket in the client namespace connected to dst
// (a flow of a container: the peer's kernel finds this socket for an ICMP
// error quoting it, and would update its path MTU from a frag-needed).
func clientUDP(t *testing.T, w *wire, network string, dst *net.UDPAddr) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := w.s.Client.Do(func() error {
		var err error
		c, err = net.DialUDP(network, nil, dst)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	if _, err := c.Read(buf); err != nil {
		t.Fatalf("the container's UDP server did not answer: %v", err)
	}
	return c
}

// clientPMTU is the MTU the client's route cache holds for dst (0: none).
func clientPMTU(t *testing.T, w *wire, dst net.IP) int {
	t.Helper()
	h, err := w.s.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	rs, err := h.RouteGet(dst)
	if err != nil || len(rs) == 0 {
		t.Fatalf("route get %s in the client: %v", dst, err)
	}
	return rs[0].MTU
}

// TestICMPStateAttack: root in container A sends, from a raw socket,
// ICMP errors quoting its own UDP flow with the client: fragmentation
// needed (MTU 552), time exceeded, a redirect and parameter problem never
// reach the client (its path MTU to the host IP stays as it was: every
// other tenant's connections would get MSS 512), each counted as
// icmp_state; the port unreachable sent last does reach it.
func TestICMPStateAttack(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	serve(t, a.c.Do, "a", 32800)
	c := clientUDP(t, w, "udp4", &net.UDPAddr{IP: w.s.HostIP, Port: 32800})
	cport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	mtu0 := clientPMTU(t, w, w.s.HostIP)
	var snd *traffic.ICMPSender
	if err := a.c.Do(func() (err error) { snd, err = traffic.OpenICMPSender(); return err }); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	quote := func(typ, code uint8, mtu uint16) []byte {
		return traffic.ICMPError(typ, code, mtu, unix.IPPROTO_UDP, w.s.ClientIP, cport, w.s.HostIP, 32800)
	}
	paramProblem := quote(12, 0, 0)
	paramProblem[2], paramProblem[3] = 0, 0
	binary.BigEndian.PutUint16(paramProblem[2:], traffic.Checksum(paramProblem))
	attacks := [][]byte{quote(3, 4, 552), quote(11, 0, 0), quote(5, 1, 0), paramProblem, quote(3, 1, 0)}
	counters := []string{"InDestUnreachs", "InTimeExcds", "InRedirects", "InParmProbs"}
	before := map[string]int64{}
	for _, k := range counters {
		before[k] = icmpIn(t, w.s.Client.Do, k)
	}
	drops0, _ := a.vf.Drops()
	for _, m := range attacks {
		if err := snd.Send(w.s.ClientIP, m); err != nil {
			t.Fatal(err)
		}
	}
	// the canary: a port unreachable about the same flow passes
	if err := snd.Send(w.s.ClientIP, quote(3, 3, 0)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the port unreachable at the client", 10*time.Second, func() bool {
		return icmpIn(t, w.s.Client.Do, "InDestUnreachs") > before["InDestUnreachs"]
	})
	for i, k := range counters {
		if n := icmpIn(t, w.s.Client.Do, k) - before[k]; (i == 0 && n != 1) || (i > 0 && n != 0) {
			t.Errorf("the client's %s rose by %d (only the port unreachable may arrive)", k, n)
		}
	}
	if mtu := clientPMTU(t, w, w.s.HostIP); mtu != mtu0 {
		t.Errorf("the client's path MTU to the host IP is %d after the container's frag-needed, was %d", mtu, mtu0)
	}
	drops, err := a.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}
	if n := drops[DropICMPState] - drops0[DropICMPState]; n != uint64(len(attacks)) {
		t.Errorf("icmp_state drops: %d, want %d (all drops %v)", n, len(attacks), drops)
	}
}

// TestICMPv6StateAttack is the IPv6 twin: a Packet Too Big (MTU 1280),
// time exceeded and parameter problem quoting A's own flow never reach
// the client (its path MTU to the host address is unchanged), counted as
// icmp_state; port unreachable passes.
func TestICMPv6StateAttack(t *testing.T) {
	w := newWire6(t)
	a := w.plumb6(t, "ca", 1, rg(32768, 33791))
	serve6(t, a.c.Do, "a", 32800)
	c := clientUDP(t, w, "udp6", &net.UDPAddr{IP: host6, Port: 32800})
	cport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	mtu0 := clientPMTU(t, w, host6)
	var snd net.PacketConn
	if err := a.c.Do(func() (err error) { snd, err = net.ListenPacket("ip6:ipv6-icmp", "::"); return err }); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	quote := func(typ, code uint8, info uint32) []byte {
		m := make([]byte, 8, 8+40+8)
		m[0], m[1] = typ, code
		binary.BigEndian.PutUint32(m[4:], info)
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], 10)
		ip[6], ip[7] = ipprotoUDP, 64
		copy(ip[8:24], client6.To16())
		copy(ip[24:40], host6.To16())
		return append(append(m, ip...), udp6(cport, 32800, nil)...)
	}
	attacks := [][]byte{quote(2, 0, 1280), quote(3, 0, 0), quote(4, 0, 0), quote(1, 0, 0), quote(1, 3, 0)}
	counters := []string{"Icmp6InDestUnreachs", "Icmp6InPktTooBigs", "Icmp6InTimeExcds", "Icmp6InParmProblems"}
	before := map[string]int64{}
	for _, k := range counters {
		before[k] = snmp6(t, w.s.Client.Do, k)
	}
	drops0, _ := a.vf.Drops()
	for _, m := range append(attacks, quote(1, 4, 0)) {
		if _, err := snd.WriteTo(m, &net.IPAddr{IP: client6}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the port unreachable at the client", 10*time.Second, func() bool {
		return snmp6(t, w.s.Client.Do, "Icmp6InDestUnreachs") > before["Icmp6InDestUnreachs"]
	})
	for i, k := range counters {
		if n := snmp6(t, w.s.Client.Do, k) - before[k]; (i == 0 && n != 1) || (i > 0 && n != 0) {
			t.Errorf("the client's %s rose by %d (only the port unreachable may arrive)", k, n)
		}
	}
	if mtu := clientPMTU(t, w, host6); mtu != mtu0 {
		t.Errorf("the client's path MTU to the host address is %d after the container's Packet Too Big, was %d", mtu, mtu0)
	}
	drops, err := a.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}
	if n := drops[DropICMPState] - drops0[DropICMPState]; n != uint64(len(attacks)) {
		t.Errorf("icmp_state drops: %d, want %d (all drops %v)", n, len(attacks), drops)
	}
}
