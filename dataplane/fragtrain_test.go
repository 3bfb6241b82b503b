package dataplane

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// fragClient sends crafted fragment trains from the client namespace.
type fragClient struct {
	t   testing.TB
	e   *env
	snd *traffic.FrameSender
	mac net.HardwareAddr
}

func newFragClient(t testing.TB, e *env) *fragClient {
	t.Helper()
	c := &fragClient{t: t, e: e}
	err := e.sb.Client.Do(func() (err error) {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c.mac = ifi.HardwareAddr
		c.snd, err = traffic.OpenFrameSender("eth0")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.snd.Close() })
	return c
}

// train cuts a datagram from src:sport to the host's address of dst's
// family, port dport.
func (c *fragClient) train(src, dst net.IP, sport, dport uint16, id uint32, payload string, mtu int) [][]byte {
	return fragTrain(c.e.sb.HostMAC, c.mac, src, dst, sport, dport, id, []byte(payload), mtu)
}

func (c *fragClient) send(frames ...[]byte) {
	c.t.Helper()
	for _, f := range frames {
		if err := c.snd.Send(f); err != nil {
			c.t.Fatalf("send frame: %v", err)
		}
	}
}

// listen binds a UDP socket in the client namespace (replies to crafted
// datagrams come to it).
func (c *fragClient) listen(ip net.IP, port uint16) net.PacketConn {
	c.t.Helper()
	return udpListenIn(c.t, c.e.sb.Client, net.JoinHostPort(ip.String(), fmt.Sprint(port)))
}

// reply reads one datagram from pc within d ("" on timeout).
func reply(pc net.PacketConn, d time.Duration) string {
	buf := make([]byte, 65536)
	pc.SetReadDeadline(time.Now().Add(d))
	n, _, err := pc.ReadFrom(buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

func fragStats(t testing.TB, e *env) FragmentStats {
	t.Helper()
	st, err := e.d.Fragments()
	if err != nil {
		t.Fatal(err)
	}
	if !st.Enabled {
		t.Fatal("fragment steering is off: the kernel could not run the programs")
	}
	return st
}

type family struct {
	name     string
	host     net.IP
	client   net.IP
	mtu      int
	steered  func(FragmentStats) uint64
	leftHost func(FragmentStats) uint64
}

func families(e *env) []family {
	return []family{
		{"ipv4", sandbox.HostIP, sandbox.ClientIP, 1500,
			func(s FragmentStats) uint64 { return s.Steered4 }, func(s FragmentStats) uint64 { return s.Host4 }},
		{"ipv6", e.sb.HostIP6, e.sb.ClientIP6, 1500,
			func(s FragmentStats) uint64 { return s.Steered6 }, func(s FragmentStats) uint64 { return s.Host6 }},
	}
}

// TestFragmentFirstLast: a train whose first fragment comes last. Its
// later fragments find no entry: they stay with the host (counted), the
// first one goes to the container, and neither can reassemble the
// datagram (lost, as it would be on a host whose reassembly gets half of
// it). The sender's next datagram (a new id) in order gets through.
func TestFragmentFirstLast(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	c := newFragClient(t, e)
	for i, f := range families(e) {
		t.Run(f.name, func(t *testing.T) {
			pc := c.listen(f.client, uint16(20000+i))
			msg := bigMsg("late-"+f.name, 4000)
			fr := c.train(f.client, f.host, uint16(20000+i), 31000, 0x7000, msg, f.mtu)
			before := fragStats(t, e)
			c.send(fr[1:]...)
			c.send(fr[0])
			if got := reply(pc, 1500*time.Millisecond); got != "" {
				t.Errorf("a datagram whose first fragment came last was answered: %.40q", got)
			}
			after := fragStats(t, e)
			if d := f.leftHost(after) - f.leftHost(before); d != uint64(len(fr)-1) {
				t.Errorf("later fragments left to the host: %d counted, want %d", d, len(fr)-1)
			}
			if d := f.steered(after) - f.steered(before); d != 0 {
				t.Errorf("%d later fragments steered before their first arrived", d)
			}
			// the next datagram, in order
			c.send(c.train(f.client, f.host, uint16(20000+i), 31000, 0x7001, msg, f.mtu)...)
			if got := reply(pc, 3*time.Second); got != "A "+msg+"\n" {
				t.Errorf("in-order datagram after the lost one: reply %.40q, want A's echo", got)
			}
			if d := f.steered(fragStats(t, e)) - f.steered(after); d != uint64(len(fr)-1) {
				t.Errorf("in-order train: %d later fragments steered, want %d", d, len(fr)-1)
			}
		})
	}
}

// fragKey names a fragment: source address and id.
type fragKey struct {
	src string
	id  uint32
}

// fragments counts the IP fragments among frames by (source, id).
func fragments(frames [][]byte) map[fragKey]int {
	m := map[fragKey]int{}
	for _, f := range frames {
		if len(f) < 14+48 {
			continue
		}
		p := f[14:]
		switch binary.BigEndian.Uint16(f[12:]) {
		case 0x0800:
			if binary.BigEndian.Uint16(p[6:])&0x3fff != 0 {
				m[fragKey{net.IP(p[12:16]).String(), uint32(binary.BigEndian.Uint16(p[4:]))}]++
			}
		case 0x86dd:
			if p[6] == 44 {
				m[fragKey{net.IP(p[8:24]).String(), binary.BigEndian.Uint32(p[44:])}]++
			}
		}
	}
	return m
}

// TestFragmentTrainsInterleaved: trains from several sources to three
// containers, their fragments interleaved (fragment k of every train,
// then k+1), every source using the same ids: each datagram reaches its
// owner whole, and a capture on every container's veth shows that no
// fragment reaches a container that does not own its port.
func TestFragmentTrainsInterleaved(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	ctrs := []ctr{
		e.start("A", 1, "40960-41983", "31000-31009", "", 31000),
		e.start("B", 2, "41984-43007", "31010-31019", "", 31010),
		e.start("C", 3, "43008-44031", "31020-31029", "", 31020),
	}
	names := []string{"A", "B", "C"}
	ports := []uint16{31000, 31010, 31020}
	// what the host sends each container on its veth
	capt := map[string]*traffic.Capture{}
	for i, c := range ctrs {
		capt[names[i]] = traffic.StartCapture(t, e.sb.Host.Do, plane.VethName(c.c.ID), names[i]+"'s veth")
	}
	fc := newFragClient(t, e)
	// extra client addresses (the client plays several hosts)
	const sources = 4
	src4 := []net.IP{sandbox.ClientIP}
	src6 := []net.IP{e.sb.ClientIP6}
	for s := 1; s < sources; s++ {
		a4 := net.IPv4(198, 18, 0, byte(100+s)).To4()
		a6 := append(net.IP(nil), e.sb.ClientIP6...)
		a6[15] = byte(100 + s)
		e.sb.Client.Run(t, "ip", "addr", "add", a4.String()+"/24", "dev", "eth0")
		e.sb.Client.Run(t, "ip", "-6", "addr", "add", a6.String()+"/64", "dev", "eth0", "nodad")
		src4, src6 = append(src4, a4), append(src6, a6)
	}
	type want struct {
		pc    net.PacketConn
		reply string
		owner string
		key   fragKey
	}
	var wants []want
	var trains [][][]byte
	for fi, f := range families(e) {
		srcs := src4
		if fi == 1 {
			srcs = src6
		}
		for s, src := range srcs {
			for ci := range ctrs {
				sport := uint16(21000 + 100*fi + 10*s + ci)
				id := uint32(0x100 + ci) // the same ids from every source
				msg := bigMsg(fmt.Sprintf("%s-s%d-to-%s", f.name, s, names[ci]), 4000+500*ci)
				pc := fc.listen(src, sport)
				trains = append(trains, fc.train(src, f.host, sport, ports[ci], id, msg, f.mtu))
				wants = append(wants, want{pc, names[ci] + " " + msg + "\n", names[ci], fragKey{src.String(), id}})
			}
		}
	}
	for k := 0; ; k++ {
		sent := false
		for _, tr := range trains {
			if k < len(tr) {
				fc.send(tr[k])
				sent = true
			}
		}
		if !sent {
			break
		}
	}
	for _, w := range wants {
		if got := reply(w.pc, 3*time.Second); got != w.reply {
			t.Errorf("train %v to %s: reply %.50q, want %s's echo", w.key, w.owner, got, w.owner)
		}
	}
	// every train reached its owner: the captures have caught up
	seen := map[string]map[fragKey]int{}
	read := func() {
		for _, n := range names {
			seen[n] = fragments(capt[n].Outgoing())
		}
	}
	wait.Until(5*time.Second, func() bool {
		read()
		for i, w := range wants {
			if seen[w.owner][w.key] < len(trains[i]) {
				return false
			}
		}
		return true
	})
	for _, w := range wants {
		tr := trains[0]
		for i := range wants {
			if wants[i].key == w.key && wants[i].owner == w.owner {
				tr = trains[i]
			}
		}
		for _, n := range names {
			got := seen[n][w.key]
			switch {
			case n == w.owner && got != len(tr):
				t.Errorf("%s's veth carried %d fragments of train %v, want %d", n, got, w.key, len(tr))
			case n != w.owner && got != 0:
				t.Errorf("%s's veth carried %d fragments of train %v, which is %s's", n, got, w.key, w.owner)
			}
		}
	}
}

// TestFragmentFlood: the rule of package fragbpf's table (an entry is
// dropped only when the table is full, least recently used first; the
// kernel's LRU may take up to 128 entries per CPU early): with the table
// full of a flood's entries, a datagram whose later fragments arrive
// before size - 128*CPUs more datagrams have been learned is delivered,
// and the evictions are counted.
func TestFragmentFlood(t *testing.T) {
	checkRootUnchanged(t)
	const size = 1024
	e := newFragEnv(t, size)
	e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	fc := newFragClient(t, e)
	host, client := sandbox.HostIP, sandbox.ClientIP
	// The flood comes from another address: the container's stack drops
	// a datagram when more than ipfrag_max_dist (64) fragments from its
	// source arrived between two of its fragments.
	flooder := net.IPv4(198, 18, 0, 250).To4()
	flood := func(from, n int) {
		for i := range n {
			// first fragments only; small (the container's reassembly
			// memory holds them all)
			tr := fc.train(flooder, host, 30000, 31000, uint32(from+i), bigMsg("f", 200), 100)
			fc.send(tr[0])
		}
	}
	learned := func(n uint64) {
		t.Helper()
		wait.For(t, 10*time.Second, fmt.Sprintf("%d datagrams learned", n), func() bool { return fragStats(t, e).Learned >= n })
	}
	flood(1, size)
	learned(size)
	pc := fc.listen(client, 20001)
	msg := bigMsg("kept", 4000)
	d := fc.train(client, host, 20001, 31000, 50000, msg, 1500)
	fc.send(d[0])
	learned(size + 1)
	more := size - 128*runtime.NumCPU()
	flood(10000, more)
	learned(uint64(size + 1 + more))
	before := fragStats(t, e).Steered4
	fc.send(d[1:]...)
	wait.For(t, 5*time.Second, "the datagram's later fragments steered", func() bool {
		return fragStats(t, e).Steered4-before == uint64(len(d)-1)
	})
	if got := reply(pc, 3*time.Second); got != "A "+msg+"\n" {
		t.Errorf("after a flood of %d datagrams into a full table, the datagram's reply is %.40q, want A's echo", more, got)
	}
	st := fragStats(t, e)
	t.Logf("after the flood: %+v", st)
	if st.Evicted == 0 {
		t.Errorf("no eviction counted after %d datagrams into a table of %d: %+v", size+1+more, size, st)
	}
	if st.Entries > size { // (the IPv4 table alone is used here)
		t.Errorf("tables hold %d entries, more than the IPv4 table's size %d", st.Entries, size)
	}
}

// newFragEnv is newEnv (IPv4 only) with a data plane whose fragment
// tables hold size datagrams.
func newFragEnv(t *testing.T, size int) *env {
	t.Helper()
	sb := sandbox.New(t)
	e := &env{t: t, sb: sb, ops: new(atomic.Int64), errs: new(atomic.Int64), ipv6: IPv6Off}
	d, err := New(Config{HostNS: sb.Host.Path, IPv6: IPv6Off, Logger: quietLogger(t), FragmentTableSize: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	e.d = d
	if e.info, err = d.PrepareHost(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

// htons: a 16-bit value in network byte order, as AF_PACKET wants its
// protocol (lopath_test.go's capture; traffic.Capture serves the rest).
func htons(v uint16) uint16 { return v<<8 | v>>8 }
