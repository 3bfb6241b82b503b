package tcfilter

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/test/sandbox"
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
	drops0, err := a.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}
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
	drops0, err := a.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}
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

// tryEcho is echo with a short timeout (for requests expected to fail).
func tryEcho(do func(func() error) error, network, addr string, d time.Duration) (string, error) {
	var reply string
	err := do(func() error {
		var err error
		reply, err = traffic.Echo(context.Background(), network, addr, "hi", traffic.WithTimeout(d))
		return err
	})
	return traffic.ReplyName(reply), err
}

// TestLoopbackAttack: host services bound only to 127.0.0.1, 127.0.0.53
// and ::1 (TCP and UDP) do not answer a container, whose loopback drops
// rise; containers still reach each other through 127.0.0.1 and ::1, the
// host reaches a container there; once the operator opens two of the
// ports (SetLoopPorts), exactly those answer.
func TestLoopbackAttack(t *testing.T) {
	w := newWire6(t)
	// the data plane's table: the containers' port space and the host's
	// ip_local_port_range
	space := ephemeral.MustParseSet("32768-34815," + strings.ReplaceAll(sandbox.HostPortRange, " ", "-"))
	w.loopPorts = ephemeral.Split(space)
	a := w.plumb6(t, "ca", 1, rg(32768, 33791))
	b := w.plumb6(t, "cb", 2, rg(33792, 34815))
	serveOn(t, w.s.Host.Do, "h1", "127.0.0.1", 7001)
	serveOn(t, w.s.Host.Do, "h53", "127.0.0.53", 7002)
	serveOn(t, w.s.Host.Do, "h6", "::1", 7003)
	serve6(t, a.c.Do, "a", 32800)
	serve6(t, b.c.Do, "b", 33800)
	hostOnly := []struct{ network, addr, name string }{
		{"tcp4", "127.0.0.1:7001", "h1"}, {"udp4", "127.0.0.1:7001", "h1"},
		{"tcp4", "127.0.0.53:7002", "h53"}, {"udp4", "127.0.0.53:7002", "h53"},
		{"tcp6", "[::1]:7003", "h6"}, {"udp6", "[::1]:7003", "h6"},
	}
	// the listeners are there: the host itself reaches them
	for _, x := range hostOnly {
		if got, err := echo(w.s.Host.Do, x.network, x.addr); err != nil || got != x.name {
			t.Fatalf("host -> %s %s: %q, %v", x.network, x.addr, got, err)
		}
	}
	reachable := func(what string) {
		t.Helper()
		for _, x := range []struct {
			do                  func(func() error) error
			network, addr, name string
		}{
			{a.c.Do, "tcp4", "127.0.0.1:33800", "b"}, {a.c.Do, "udp4", "127.0.0.1:33800", "b"},
			{b.c.Do, "tcp6", "[::1]:32800", "a"}, {b.c.Do, "udp6", "[::1]:32800", "a"},
			{w.s.Host.Do, "tcp4", "127.0.0.1:32800", "a"}, {w.s.Host.Do, "udp4", "127.0.0.1:32800", "a"},
			{w.s.Host.Do, "tcp6", "[::1]:33800", "b"}, {w.s.Host.Do, "udp6", "[::1]:33800", "b"},
		} {
			if got, err := echo(x.do, x.network, x.addr); err != nil || got != x.name {
				t.Errorf("%s: %s %s answered %q, %v; want %s", what, x.network, x.addr, got, err, x.name)
			}
		}
	}
	reachable("by default")
	drops0, err := a.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range hostOnly {
		if got, err := tryEcho(a.c.Do, x.network, x.addr, time.Second); err == nil {
			t.Errorf("container -> host-only %s %s answered %q", x.network, x.addr, got)
		}
	}
	drops, err := a.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}
	if n := drops[DropLoopback] - drops0[DropLoopback]; n < uint64(len(hostOnly)) {
		t.Errorf("loopback drops rose by %d, want >= %d (%v)", n, len(hostOnly), drops)
	}

	// the operator opens 7001 and 7003
	a.vf.LoopPorts = ephemeral.Split(space.Union(ephemeral.MustParseSet("7001,7003")))
	if err := a.vf.SetLoopPorts(); err != nil {
		t.Fatal(err)
	}
	for _, x := range hostOnly {
		got, err := tryEcho(a.c.Do, x.network, x.addr, 2*time.Second)
		if open := x.name != "h53"; open && (err != nil || got != x.name) {
			t.Errorf("opened %s %s: %q, %v", x.network, x.addr, got, err)
		} else if !open && err == nil {
			t.Errorf("still closed %s %s answered %q", x.network, x.addr, got)
		}
	}
	reachable("with ports opened")
	// and closed again: the nodes beyond the new list go
	a.vf.LoopPorts = ephemeral.Split(space)
	if err := a.vf.SetLoopPorts(); err != nil {
		t.Fatal(err)
	}
	if got, err := tryEcho(a.c.Do, "udp4", "127.0.0.1:7001", time.Second); err == nil {
		t.Errorf("closed again: 127.0.0.1:7001 answered %q", got)
	}
}

// TestLoopbackFromEth0: packets for 127.0.0.1 and ::1 arriving on the
// host's eth0 (route_localnet is set on lo only) reach neither a host
// socket on 127.0.0.1 nor a container: a canary to the host IP sent after
// them arrives, they do not.
func TestLoopbackFromEth0(t *testing.T) {
	w := newWire6(t)
	a := w.plumb6(t, "ca", 1, rg(32768, 33791))
	listen := func(do func(func() error) error, network, addr string) net.PacketConn {
		var c net.PacketConn
		if err := do(func() (err error) { c, err = net.ListenPacket(network, addr); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	victims := map[string]net.PacketConn{
		"host 127.0.0.1:7001": listen(w.s.Host.Do, "udp4", "127.0.0.1:7001"),
		"host [::1]:7003":     listen(w.s.Host.Do, "udp6", "[::1]:7003"),
		"container :32801":    listen(a.c.Do, "udp", ":32801"),
	}
	canary := listen(a.c.Do, "udp", ":32802")
	var snd *traffic.FrameSender
	if err := w.s.Client.Do(func() (err error) { snd, err = traffic.OpenFrameSender("eth0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	lo4 := net.IPv4(127, 0, 0, 1)
	for _, f := range [][]byte{
		frame4(w.mac, w.cmac, w.s.ClientIP, lo4, 40000, 7001),
		frame4(w.mac, w.cmac, w.s.ClientIP, lo4, 40000, 32801),
		frame4(w.mac, w.cmac, lo4, lo4, 40000, 7001),
		frame6(w.mac, w.cmac, client6, net.IPv6loopback, ipprotoUDP, udp6sum(client6, net.IPv6loopback, 40000, 7003)),
		frame6(w.mac, w.cmac, client6, net.IPv6loopback, ipprotoUDP, udp6sum(client6, net.IPv6loopback, 40000, 32801)),
		// the canaries, last (the IPv6 one also proves udp6sum right)
		frame4(w.mac, w.cmac, w.s.ClientIP, w.s.HostIP, 40000, 32802),
		frame6(w.mac, w.cmac, client6, host6, ipprotoUDP, udp6sum(client6, host6, 40000, 32802)),
	} {
		if err := snd.Send(f); err != nil {
			t.Fatal(err)
		}
	}
	canary.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	for i := range 2 {
		if _, _, err := canary.ReadFrom(buf); err != nil {
			t.Fatalf("canary %d of 2 to the host's address did not arrive: %v", i+1, err)
		}
	}
	for name, c := range victims {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, from, err := c.ReadFrom(buf); err == nil {
			t.Errorf("%s received %d bytes from %v arriving on eth0", name, n, from)
		}
	}
}

// frame4 is an Ethernet frame of a UDP datagram src:sport -> dst:dport
// (no UDP checksum) with the payload "x".
func frame4(dstMAC, srcMAC net.HardwareAddr, src, dst net.IP, sport, dport uint16) []byte {
	f := make([]byte, 14+20+8+1)
	copy(f[0:6], dstMAC)
	copy(f[6:12], srcMAC)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 20+8+1)
	ip[8], ip[9] = 64, ipprotoUDP
	copy(ip[12:16], src.To4())
	copy(ip[16:20], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], traffic.Checksum(ip))
	u := f[34:]
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], 8+1)
	u[8] = 'x'
	return f
}

// udp6sum is a UDP datagram src:sport -> dst:dport with the payload "x"
// and a valid checksum (IPv6 receivers drop a zero one).
func udp6sum(src, dst net.IP, sport, dport uint16) []byte {
	u := udp6(sport, dport, []byte("x"))
	ph := make([]byte, 0, 40+len(u))
	ph = append(append(ph, src.To16()...), dst.To16()...)
	ph = binary.BigEndian.AppendUint32(ph, uint32(len(u)))
	ph = append(ph, 0, 0, 0, ipprotoUDP)
	sum := traffic.Checksum(append(ph, u...))
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], sum)
	return u
}
