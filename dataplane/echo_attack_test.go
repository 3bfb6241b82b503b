package dataplane

// Echo steering under attack (tcfilter/echoown.go): a container that sends
// echo requests with another container's or the host's identifier to the
// same peer gets none of their replies, and they get all of theirs; a
// container flooding random identifiers costs the others' pings nothing.
// Raw ICMP sockets in the namespaces; the hijacker's side also captures
// every frame on its eth0.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// pinger is a raw ICMP (or ICMPv6) socket in one namespace and the echo
// replies it read.
type pinger struct {
	c    net.PacketConn
	v6   bool
	mu   sync.Mutex
	got  map[[2]uint16]int // {identifier, sequence} -> replies
	msgs [][]byte          // every reply's payload
}

func openPinger(t *testing.T, ns doer, v6 bool) *pinger {
	t.Helper()
	p := &pinger{v6: v6, got: map[[2]uint16]int{}}
	if err := ns.Do(func() (err error) {
		if v6 {
			p.c, err = net.ListenPacket("ip6:ipv6-icmp", "::")
		} else {
			p.c, err = net.ListenPacket("ip4:icmp", "0.0.0.0")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, _, err := p.c.ReadFrom(buf)
			if err != nil {
				return
			}
			reply := byte(0)
			if v6 {
				reply = 129
			}
			if n < 8 || buf[0] != reply {
				continue
			}
			k := [2]uint16{binary.BigEndian.Uint16(buf[4:]), binary.BigEndian.Uint16(buf[6:])}
			p.mu.Lock()
			p.got[k]++
			p.msgs = append(p.msgs, bytes.Clone(buf[8:n]))
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() { p.c.Close(); <-done })
	return p
}

// echoRequest is an echo request (the ICMPv4 checksum filled in; the
// kernel fills ICMPv6's).
func echoRequest(v6 bool, id, seq uint16, payload []byte) []byte {
	m := append([]byte{8, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq)}, payload...)
	if v6 {
		m[0] = 128
	} else {
		binary.BigEndian.PutUint16(m[2:], traffic.Checksum(m))
	}
	return m
}

func (p *pinger) send(t *testing.T, dst net.IP, id, seq uint16, payload []byte) {
	t.Helper()
	if _, err := p.c.WriteTo(echoRequest(p.v6, id, seq, payload), &net.IPAddr{IP: dst}); err != nil {
		t.Fatal(err)
	}
}

func (p *pinger) count(id, seq uint16) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[[2]uint16{id, seq}]
}

// replies counts the replies with identifier id (any sequence).
func (p *pinger) replies(id uint16) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for k, v := range p.got {
		if k[0] == id {
			n += v
		}
	}
	return n
}

// carrying counts the replies whose payload holds marker.
func (p *pinger) carrying(marker []byte) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, m := range p.msgs {
		if bytes.Contains(m, marker) {
			n++
		}
	}
	return n
}

// ping sends one request and waits for its reply (bounded).
func (p *pinger) ping(t *testing.T, dst net.IP, id, seq uint16, payload []byte) bool {
	t.Helper()
	p.send(t, dst, id, seq, payload)
	return wait.Until(3*time.Second, func() bool { return p.count(id, seq) > 0 })
}

func echoDrops(t *testing.T, e *env, c ctr) uint64 {
	t.Helper()
	s, err := e.d.Stats(context.Background(), c.c)
	if err != nil {
		t.Fatal(err)
	}
	return s.Dropped[tcfilter.DropEcho]
}

// TestEchoHijackFails: victim V and the host ping the client; hijacker H
// sends, after each of their requests, one with the same identifier to the
// same peer (its own payload), while their replies are on their way (the
// peer answers after 20 ms). V and the host get each of their 10 replies
// exactly once, H gets none of them (neither its raw socket nor a capture
// on its eth0 sees their payloads), and H's requests, dropped, are counted
// under "echo" (V counts none). IPv4 and IPv6.
func TestEchoHijackFails(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	if !e.info.Features[plane.FeatureClsBPF] {
		t.Skip("the kernel does not load cls_bpf programs")
	}
	if err := e.d.eth0.EchoSteering(); err != nil {
		t.Skipf("echo replies are not steered by learning: %v", err)
	}
	v := e.start("V", 1, "40960-41983", "31000-31009", "", 31001)
	h := e.start("H", 2, "41984-43007", "31010-31019", "", 31011)
	inH := traffic.StartCapture(t, h.proc.Do, ContainerEth0, "container H")
	for _, fam := range []struct {
		name       string
		v6         bool
		peer       net.IP
		idV, idHst uint16
	}{
		{"ipv4", false, e.sb.ClientIP, 0x5a01, 0x5a02},
		{"ipv6", true, e.sb.ClientIP6, 0x5b01, 0x5b02},
	} {
		t.Run(fam.name, func(t *testing.T) {
			if fam.v6 {
				if err := e.d.eth0.Echo6Steering(); err != nil {
					t.Skipf("ICMPv6 echo replies are not steered by learning: %v", err)
				}
			}
			slowPeer(t, e, fam.v6, 20*time.Millisecond)
			pv, ph, pHost := openPinger(t, v.proc, fam.v6), openPinger(t, h.proc, fam.v6), openPinger(t, e.sb.Host, fam.v6)
			mV, mHost, mH := newMarker(t, "victim"), newMarker(t, "host"), newMarker(t, "hijack")
			before, beforeV := echoDrops(t, e, h), echoDrops(t, e, v)
			// V's and the host's pings are under way (their first reply
			// came back) when H starts.
			if !pv.ping(t, fam.peer, fam.idV, 0, mV) || !pHost.ping(t, fam.peer, fam.idHst, 0, mHost) {
				t.Fatal("no reply to the first requests of V and the host: the bed is broken")
			}
			for seq := uint16(1); seq <= 10; seq++ {
				pv.send(t, fam.peer, fam.idV, seq, mV)
				ph.send(t, fam.peer, fam.idV, seq, mH)
				pHost.send(t, fam.peer, fam.idHst, seq, mHost)
				ph.send(t, fam.peer, fam.idHst, seq, mH)
				wait.Until(3*time.Second, func() bool { return pv.count(fam.idV, seq) > 0 && pHost.count(fam.idHst, seq) > 0 })
			}
			// H's own ping goes the way the replies would have: once its
			// reply is in, theirs would be too.
			if !ph.ping(t, fam.peer, 0x5c01, 1, nil) {
				t.Fatal("H's own ping got no reply")
			}
			canary := []byte("canary-" + fam.name)
			ph.send(t, fam.peer, 0x5c01, 2, canary)
			if !inH.WaitFor(canary, 5*time.Second) {
				t.Fatal("H's capture never saw its own reply")
			}
			for seq := uint16(0); seq <= 10; seq++ {
				if n, m := pv.count(fam.idV, seq), pHost.count(fam.idHst, seq); n != 1 || m != 1 {
					t.Errorf("reply %d: V got %d, the host %d; want exactly one each", seq, n, m)
				}
			}
			if n, m := ph.replies(fam.idV), ph.replies(fam.idHst); n != 0 || m != 0 {
				t.Errorf("H received %d of V's replies and %d of the host's, want none", n, m)
			}
			if n, m := inH.Count(mV), inH.Count(mHost); n != 0 || m != 0 {
				t.Errorf("H's eth0 saw %d frames with V's payload and %d with the host's, want none", n, m)
			}
			if n := pv.carrying(mH) + pHost.carrying(mH) + ph.carrying(mH); n != 0 {
				t.Errorf("%d replies to H's hijacking requests came back, want none (dropped)", n)
			}
			if d := echoDrops(t, e, h) - before; d < 20 {
				t.Errorf("H's echo drop counter rose by %d, want at least 20", d)
			}
			if d := echoDrops(t, e, v) - beforeV; d != 0 {
				t.Errorf("V's echo drop counter rose by %d, want 0", d)
			}
		})
	}
	// A restarted daemon takes over the programs and what they learned:
	// V's IPv4 entry (its last request a few seconds ago) stays V's.
	t.Run("restart", func(t *testing.T) {
		egress := func() string {
			out, err := e.sb.Host.Command("tc", "filter", "show", "dev", e.sb.HostEth0, "egress").CombinedOutput()
			if err != nil {
				t.Fatalf("tc filter show: %v\n%s", err, out)
			}
			return string(out)
		}
		before := egress()
		d2 := e.newDataPlane()
		if _, err := d2.PrepareHost(context.Background()); err != nil {
			t.Fatal(err)
		}
		if after := egress(); after != before {
			t.Errorf("a restart replaced eth0's echo programs:\n%s\n%s", before, after)
		}
		ph := openPinger(t, h.proc, false)
		ph.send(t, e.sb.ClientIP, 0x5a01, 99, nil)
		if !ph.ping(t, e.sb.ClientIP, 0x5c02, 1, nil) {
			t.Fatal("H's own ping got no reply")
		}
		if n := ph.replies(0x5a01); n != 0 {
			t.Errorf("after a restart H got %d replies with V's identifier, want none", n)
		}
	})
}

// slowPeer makes the client answer echo requests from user space, each
// after delay (a peer a round trip away): its kernel's own answers are
// turned off for the test. A hijacker's request sent while a reply is on
// its way would, with "last sender wins", get that reply.
func slowPeer(t *testing.T, e *env, v6 bool, delay time.Duration) {
	t.Helper()
	key, network, any := "net/ipv4/icmp_echo_ignore_all", "ip4:icmp", "0.0.0.0"
	if v6 {
		key, network, any = "net/ipv6/icmp/echo_ignore_all", "ip6:ipv6-icmp", "::"
	}
	if err := e.sb.Client.SetSysctl(key, "1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.sb.Client.SetSysctl(key, "0") })
	var c net.PacketConn
	if err := e.sb.Client.Do(func() (err error) { c, err = net.ListenPacket(network, any); return err }); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { c.Close(); <-done })
	req, rep := byte(8), byte(0)
	if v6 {
		req, rep = 128, 129
	}
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 8 || buf[0] != req {
				continue
			}
			m := bytes.Clone(buf[:n])
			m[0], m[2], m[3] = rep, 0, 0
			if !v6 {
				binary.BigEndian.PutUint16(m[2:], traffic.Checksum(m))
			}
			time.AfterFunc(delay, func() { c.WriteTo(m, from) })
		}
	}()
}

// floodSocket opens a raw ICMP (ICMPv6) socket in ns for the flood.
func floodSocket(t *testing.T, ns doer, v6 bool) int {
	t.Helper()
	fd := -1
	if err := ns.Do(func() (err error) {
		if v6 {
			fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
		} else {
			fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// flood sends n echo requests with random identifiers (never one in
// skip) from fd within limit, every other one to dst, the others to random
// addresses beyond the sandbox's gateway (198.19.0.0/16, or a /64 beside
// dst's): more keys than any table of a fixed size. It returns how many it
// sent.
func flood(fd int, v6 bool, dst net.IP, n int, limit time.Duration, skip ...uint16) int {
	peer := &unix.SockaddrInet4{}
	far := &unix.SockaddrInet4{Addr: [4]byte{198, 19}}
	var sa6, far6 unix.SockaddrInet6
	copy(peer.Addr[:], dst.To4())
	copy(sa6.Addr[:], dst.To16())
	far6.Addr = sa6.Addr
	far6.Addr[7] ^= 0xff
	end := time.Now().Add(limit)
	sent := 0
	for i := 0; i < n && (i&1023 != 0 || time.Now().Before(end)); i++ {
		id := uint16(rand.Uint32())
		for containsID(skip, id) {
			id++
		}
		var sa unix.Sockaddr = peer
		switch {
		case v6 && i&1 == 0:
			sa = &sa6
		case v6:
			binary.NativeEndian.PutUint64(far6.Addr[8:], rand.Uint64())
			sa = &far6
		case i&1 == 1:
			far.Addr[2], far.Addr[3] = byte(rand.Uint32()), byte(rand.Uint32())
			sa = far
		}
		err := unix.Sendto(fd, echoRequest(v6, id, uint16(i), nil), 0, sa)
		if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err == nil {
			sent++
		}
	}
	return sent
}

func containsID(ids []uint16, id uint16) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// TestEchoFloodCostsOthersNothing: container F sends 800,000 echo requests
// with random identifiers, half to the client, half to random addresses
// beyond it, while container V and the host ping the client (answering
// after 20 ms); V and the host get every reply, during the flood and after it
// (the same identifier, and new ones), and F's requests beyond its quota
// are dropped and counted under "echo" (the client sees only the quota's
// few). IPv4 and IPv6.
func TestEchoFloodCostsOthersNothing(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	if !e.info.Features[plane.FeatureClsBPF] {
		t.Skip("the kernel does not load cls_bpf programs")
	}
	if err := e.d.eth0.EchoSteering(); err != nil {
		t.Skipf("echo replies are not steered by learning: %v", err)
	}
	v := e.start("V", 1, "40960-41983", "31000-31009", "", 31001)
	f := e.start("F", 2, "41984-43007", "31010-31019", "", 31011)
	const n = 800_000
	for _, fam := range []struct {
		name     string
		v6       bool
		peer     net.IP
		idV, idH uint16
		counter  string
	}{
		{"ipv4", false, e.sb.ClientIP, 0x6a01, 0x6a02, "InEchos"},
		{"ipv6", true, e.sb.ClientIP6, 0x6b01, 0x6b02, "Icmp6InEchos"},
	} {
		t.Run(fam.name, func(t *testing.T) {
			if fam.v6 {
				if err := e.d.eth0.Echo6Steering(); err != nil {
					t.Skipf("ICMPv6 echo replies are not steered by learning: %v", err)
				}
			}
			// replies take 20 ms: the entries must last through the flood
			slowPeer(t, e, fam.v6, 20*time.Millisecond)
			pv, pHost := openPinger(t, v.proc, fam.v6), openPinger(t, e.sb.Host, fam.v6)
			fd := floodSocket(t, f.proc, fam.v6)
			before, inBefore := echoDrops(t, e, f), clientEchos(t, e, fam.v6, fam.counter)
			if !pv.ping(t, fam.peer, fam.idV, 0, nil) || !pHost.ping(t, fam.peer, fam.idH, 0, nil) {
				t.Fatal("no reply to the first requests of V and the host: the bed is broken")
			}
			start := time.Now()
			done := make(chan int, 1)
			idNew := fam.idV + 0x100 // V's next ping, after the flood
			go func() { done <- flood(fd, fam.v6, fam.peer, n, 120*time.Second, fam.idV, fam.idH, idNew) }()
			// V and the host ping all through the flood
			lost, seq := 0, uint16(1)
			for flooding := true; flooding && seq < 1000; seq++ {
				select {
				case sent := <-done:
					flooding = false
					done <- sent
				default:
				}
				if !pv.ping(t, fam.peer, fam.idV, seq, nil) {
					lost++
				}
				if !pHost.ping(t, fam.peer, fam.idH, seq, nil) {
					lost++
				}
				time.Sleep(50 * time.Millisecond)
			}
			sent := <-done
			t.Logf("%s: %d of %d requests flooded in %v; V and the host pinged %d times each meanwhile",
				fam.name, sent, n, time.Since(start).Round(time.Millisecond), seq-1)
			if sent < n*9/10 {
				t.Errorf("only %d of %d flood requests were sent", sent, n)
			}
			if lost != 0 {
				t.Errorf("%d pings of V and the host lost their reply during the flood", lost)
			}
			// after the flood: the same identifier, and a new one
			for i := uint16(0); i < 5; i++ {
				if !pv.ping(t, fam.peer, fam.idV, 2000+i, nil) || !pv.ping(t, fam.peer, idNew, i, nil) ||
					!pHost.ping(t, fam.peer, fam.idH, 2000+i, nil) {
					t.Errorf("ping %d after the flood lost its reply", i)
				}
			}
			for k, c := range map[string]int{"V": pv.replies(fam.idV) + pv.replies(idNew), "host": pHost.replies(fam.idH)} {
				want := int(seq) + 5
				if k == "V" {
					want += 5
				}
				if c != want {
					t.Errorf("%s got %d replies, want %d (one per request)", k, c, want)
				}
			}
			drops := echoDrops(t, e, f) - before
			reached := clientEchos(t, e, fam.v6, fam.counter) - inBefore
			t.Logf("%s: F's echo drops +%d; echo requests at the client +%d", fam.name, drops, reached)
			// Not dropped: the requests with an identifier F got within its
			// quota (64 a window, a window or two meeting the flood), each
			// drawn again some n/65536 times: about 800 to 2,000.
			if drops < uint64(sent)-4000 {
				t.Errorf("F's echo drop counter rose by %d for %d requests, want all but its quota's identifiers", drops, sent)
			}
			if reached > 5000 {
				t.Errorf("the client received %d echo requests, want those of the quota's identifiers and the pings", reached)
			}
		})
	}
}

// clientEchos reads the client's echo request counter (name: Icmp's or
// Icmp6's).
func clientEchos(t *testing.T, e *env, v6 bool, name string) uint64 {
	t.Helper()
	var v int64
	if err := e.sb.Client.Do(func() error {
		if !v6 {
			c, err := traffic.ICMPCounters()
			v = c[name]
			return err
		}
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
	return uint64(v)
}
