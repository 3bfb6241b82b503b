package tcfilter

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/tcfilter/bpfprog"
)

// snmp6 reads one counter of /proc/net/snmp6 in the namespace of do.
func snmp6(t *testing.T, do func(func() error) error, name string) int64 {
	t.Helper()
	var v int64 = -1
	if err := do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp6")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == name {
				v, err = strconv.ParseInt(f[1], 10, 64)
				return err
			}
		}
		return fmt.Errorf("no %s in snmp6", name)
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// icmp6Conn is a raw ICMPv6 socket in the client namespace (the kernel
// fills in the checksum).
func icmp6Conn(t *testing.T, w *wire) net.PacketConn {
	t.Helper()
	var c net.PacketConn
	if err := w.s.Client.Do(func() error {
		var err error
		c, err = net.ListenPacket("ip6:ipv6-icmp", "::")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestICMPv6Steered: the outside pings the host's IPv6 address and gets
// one reply per request, from the host (no container sees the request);
// an ICMPv6 error quoting a flow of container A (its source port) reaches
// A only, one about a port nobody owns the host; an echo reply whose
// identifier is one of A's ports reaches A only; neighbour solicitations
// for the host address reach no container.
func TestICMPv6Steered(t *testing.T) {
	w := newWire6(t)
	a := w.plumb6(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	b := w.plumb6(t, "cb", 2, rg(33792, 34047))
	c := icmp6Conn(t, w)
	dst := &net.IPAddr{IP: host6}
	nss := func() [3]int64 {
		return [3]int64{snmp6(t, a.c.Do, "Icmp6InNeighborSolicits"), snmp6(t, b.c.Do, "Icmp6InNeighborSolicits"), 0}
	}
	ns0 := nss()

	t.Run("ping", func(t *testing.T) {
		reqA, reqB, reqH := snmp6(t, a.c.Do, "Icmp6InEchos"), snmp6(t, b.c.Do, "Icmp6InEchos"), snmp6(t, w.s.Host.Do, "Icmp6InEchos")
		const id, n = 0x4242, 3
		replies := 0
		buf := make([]byte, 1500)
		for seq := 1; seq <= n; seq++ {
			req := []byte{icmp6EchoRequest, 0, 0, 0, id >> 8, id & 0xff, 0, byte(seq), 'v', '6'}
			if _, err := c.WriteTo(req, dst); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			for {
				k, _, err := c.ReadFrom(buf)
				if err != nil {
					t.Fatalf("echo %d: no reply: %v", seq, err)
				}
				if k >= 8 && buf[0] == icmp6EchoReply && binary.BigEndian.Uint16(buf[4:]) == id {
					replies++
					if int(buf[7]) == seq {
						break
					}
				}
			}
		}
		if replies != n {
			t.Errorf("%d replies to %d echo requests, want exactly one each", replies, n)
		}
		if d := snmp6(t, w.s.Host.Do, "Icmp6InEchos") - reqH; d != n {
			t.Errorf("the host received %d echo requests, want %d", d, n)
		}
		if da, db := snmp6(t, a.c.Do, "Icmp6InEchos")-reqA, snmp6(t, b.c.Do, "Icmp6InEchos")-reqB; da != 0 || db != 0 {
			t.Errorf("containers received echo requests: ca %d, cb %d", da, db)
		}
	})

	// quoted builds the first bytes of an IPv6 UDP packet src:sport -> dst:dport.
	quoted := func(src net.IP, sport uint16, dst net.IP, dport uint16) []byte {
		q := frame6(nil, nil, src, dst, ipprotoUDP, udp6(sport, dport, []byte("q")))[14:]
		return q
	}
	unreach := func(q []byte) []byte { return append([]byte{1, 4, 0, 0, 0, 0, 0, 0}, q...) }
	counters := func(name string) [3]int64 {
		return [3]int64{snmp6(t, a.c.Do, name), snmp6(t, b.c.Do, name), snmp6(t, w.s.Host.Do, name)}
	}
	// send sends msg to the host address and waits until counter name rose
	// in exactly the namespace want (0 ca, 1 cb, 2 host); the others must
	// not have moved once it did.
	send := func(t *testing.T, what, name string, msg []byte, want int) {
		t.Helper()
		before := counters(name)
		if _, err := c.WriteTo(msg, dst); err != nil {
			t.Fatal(err)
		}
		var now [3]int64
		waitFor(t, what, 3*time.Second, func() bool { now = counters(name); return now[want] > before[want] })
		for i := range now {
			if i != want && now[i] != before[i] {
				t.Errorf("%s: %s moved in namespace %d (%d -> %d)", what, name, i, before[i], now[i])
			}
		}
	}
	t.Run("errors", func(t *testing.T) {
		send(t, "error about ca's flow", "Icmp6InDestUnreachs", unreach(quoted(host6, 20001, client6, 9000)), 0)
		send(t, "error about cb's flow", "Icmp6InDestUnreachs", unreach(quoted(host6, 33900, client6, 9000)), 1)
		send(t, "error about a port nobody owns", "Icmp6InDestUnreachs", unreach(quoted(host6, 45000, client6, 9000)), 2)
	})
	t.Run("echo-reply-by-id", func(t *testing.T) {
		send(t, "echo reply with ca's id", "Icmp6InEchoReplies", []byte{icmp6EchoReply, 0, 0, 0, 20002 >> 8, 20002 & 0xff, 0, 1}, 0)
		send(t, "echo reply with nobody's id", "Icmp6InEchoReplies", []byte{icmp6EchoReply, 0, 0, 0, 0xaf, 0xc8, 0, 1}, 2)
	})
	t.Run("ndp", func(t *testing.T) {
		// the client resolved the host address (the traffic above) and
		// sends one more solicitation to the host address: the host's
		// own NUD counter proves it arrived
		ns := ndp(icmp6NS, host6, 0, nil)
		send(t, "solicitation for the host address", "Icmp6InNeighborSolicits", ns, 2)
		if now := nss(); now[0] != ns0[0] || now[1] != ns0[1] {
			t.Errorf("containers received neighbour solicitations: %v -> %v", ns0, now)
		}
	})
}

// ping6 sends n echo requests with identifier id from the namespace of do
// (a raw ICMPv6 socket) to dst, each after the reply to the one before,
// and returns how many replies with that identifier it read.
func ping6(t *testing.T, do func(func() error) error, dst net.IP, id uint16, n int) int {
	t.Helper()
	var c net.PacketConn
	if err := do(func() error {
		var err error
		c, err = net.ListenPacket("ip6:ipv6-icmp", "::")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	replies := 0
	buf := make([]byte, 1500)
	for seq := 1; seq <= n; seq++ {
		req := []byte{icmp6EchoRequest, 0, 0, 0, byte(id >> 8), byte(id), 0, byte(seq), 'v', '6'}
		if _, err := c.WriteTo(req, &net.IPAddr{IP: dst}); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		for {
			k, _, err := c.ReadFrom(buf)
			if err != nil {
				return replies
			}
			if k >= 8 && buf[0] == icmp6EchoReply && binary.BigEndian.Uint16(buf[4:]) == id {
				replies++
				if int(buf[7]) == seq {
					break
				}
			}
		}
	}
	return replies
}

// TestICMPv6EchoLearned: a container pings the outside over IPv6 with an
// identifier outside its ports (a raw-socket pinger): the replies reach it
// once each, and no other container; the host's own pings get theirs.
func TestICMPv6EchoLearned(t *testing.T) {
	w := newWire6(t)
	if err := w.eth0D.Echo6Steering(); err != nil {
		t.Fatalf("ICMPv6 echo programs: %v", err)
	}
	a := w.plumb6(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	b := w.plumb6(t, "cb", 2, rg(33792, 34047))
	for _, tc := range []struct {
		name string
		do   func(func() error) error
		id   uint16
		want int // namespace that must see the replies: 0 ca, 1 cb, 2 host; -1 none
	}{
		{"ca", a.c.Do, 0x1234, 0},
		{"cb", b.c.Do, 0x1235, 1},
		{"host", w.s.Host.Do, 0x1236, 2},
		// ca's entry is live: cb's requests are dropped (echoown.go)
		{"cb again, ca's identifier", b.c.Do, 0x1234, -1},
	} {
		before := [3]int64{snmp6(t, a.c.Do, "Icmp6InEchoReplies"), snmp6(t, b.c.Do, "Icmp6InEchoReplies"), snmp6(t, w.s.Host.Do, "Icmp6InEchoReplies")}
		if got, want := ping6(t, tc.do, client6, tc.id, 3), min(3, 3*(tc.want+1)); got != want {
			t.Errorf("%s: %d replies to 3 echo requests, want %d", tc.name, got, want)
		}
		after := [3]int64{snmp6(t, a.c.Do, "Icmp6InEchoReplies"), snmp6(t, b.c.Do, "Icmp6InEchoReplies"), snmp6(t, w.s.Host.Do, "Icmp6InEchoReplies")}
		for i := range after {
			want := int64(0)
			if i == tc.want {
				want = 3
			}
			if d := after[i] - before[i]; d != want {
				t.Errorf("%s: namespace %d received %d echo replies, want %d", tc.name, i, d, want)
			}
		}
	}
	// A restarted daemon adopts the programs and what they learned.
	if got := echo6Learned(w.eth0D, 0x1234, client6); got != a.veth {
		t.Fatalf("{0x1234, client} learned as %d, want ca's veth %d", got, a.veth)
	}
	before := w.tcShow(t, w.s.HostEth0)
	d2 := NewHostDemux(w.h, w.eth0, "eth0", w.s.HostIP, nil)
	if err := d2.SetIPv6(&IPv6Demux{Addrs: []net.IP{host6}, Sink: w.sink}); err != nil {
		t.Fatal(err)
	}
	if err := d2.Init(); err != nil {
		t.Fatal(err)
	}
	if err := d2.Echo6Steering(); err != nil {
		t.Fatal(err)
	}
	if got := echo6Learned(d2, 0x1234, client6); got != a.veth {
		t.Errorf("after a restart {0x1234, client} learned as %d, want %d", got, a.veth)
	}
	if after := w.tcShow(t, w.s.HostEth0); after != before {
		t.Errorf("a restart changed eth0's filters:\n%s", lineDiffs(before, after))
	}
}

// echo6Learned returns the veth x's ICMPv6 echo map holds for {id, peer}
// (0: none, or the host).
func echo6Learned(x *HostDemux, id uint16, peer net.IP) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.echo6 == nil {
		return 0
	}
	k := make([]byte, 20)
	binary.BigEndian.PutUint16(k, id)
	copy(k[4:], peer.To16())
	var v bpfprog.Echo6EchoEntry
	if x.echo6.m.Lookup(k, &v) != nil {
		return 0
	}
	return int(v.Owner)
}
