package tcfilter

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/isolatord/isolatord/tcfilter/bpfprog"

	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// TestEchoSweep: a sweep deletes the echo entries whose owner has been
// silent for echoLive and the quota entries of windows before the last
// one, and nothing else.
func TestEchoSweep(t *testing.T) {
	if err := BPFAvailable(); err != nil {
		t.Skipf("no cls_bpf: %v", err)
	}
	spec, err := bpfprog.LoadEcho()
	if err != nil {
		t.Fatal(err)
	}
	echo, err := ebpf.NewMap(spec.Maps[bpfprog.EchoMapIsoEcho])
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	quota, err := ebpf.NewMap(spec.Maps[bpfprog.EchoMapIsoEchoQuota])
	if err != nil {
		t.Fatal(err)
	}
	defer quota.Close()
	now := monotonicNow()
	w := now >> echoWindowShift
	entry := func(owner uint32, last uint64) bpfprog.EchoEchoEntry {
		return bpfprog.EchoEchoEntry{Owner: owner, Window: uint32(last >> echoWindowShift), Last: last}
	}
	key := func(i int) []byte { return []byte{0, byte(i), 0, 0, 198, 18, 0, 2} }
	// -1 s: refreshed after now was read (the walk takes time)
	ages := []time.Duration{-time.Second, 0, time.Second, echoLive - time.Second, echoLive, echoLive + time.Second, time.Hour}
	for i, age := range ages {
		if err := echo.Update(key(i), entry(7, now-uint64(age)), ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	for i, win := range []uint64{w, w - 1, w - 2, w - 5} {
		if err := quota.Update(uint32(i+1), bpfprog.EchoQuota{Window: win}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	if n := sweepEcho(echo, quota, now); n != 3 {
		t.Errorf("swept %d echo entries, want 3", n)
	}
	var v bpfprog.EchoEchoEntry
	for i, age := range ages {
		err := echo.Lookup(key(i), &v)
		if live := age < echoLive; live != (err == nil) {
			t.Errorf("entry %v old: present %v, want %v", age, err == nil, live)
		}
	}
	for i, want := range []bool{true, true, false, false} {
		var q bpfprog.EchoQuota
		if got := quota.Lookup(uint32(i+1), &q) == nil; got != want {
			t.Errorf("quota entry %d windows old: present %v, want %v", i, got, want)
		}
	}
}

// TestEchoQuota: a container's echo requests with 200 new identifiers
// are learned up to its quota (a window's, or two if the window turned
// meanwhile), the others not; the host's 200 are all learned.
func TestEchoQuota(t *testing.T) {
	w := newWire(t)
	if err := w.eth0D.EchoSteering(); err != nil {
		t.Skipf("echo replies are not steered by learning here: %v", err)
	}
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	for _, tc := range []struct {
		name   string
		do     func(func() error) error
		target int
		base   uint16
		min    int
		max    int
	}{
		{"ca", a.c.Do, a.veth, 0x7000, echoQuota, 2 * echoQuota},
		{"host", w.s.Host.Do, 0, 0x7800, 200, 200},
	} {
		var snd *traffic.ICMPSender
		if err := tc.do(func() (err error) { snd, err = traffic.OpenICMPSender(); return err }); err != nil {
			t.Fatal(err)
		}
		for i := uint16(0); i < 200; i++ {
			if err := snd.Send(w.s.ClientIP, traffic.EchoRequest(tc.base+i, 1)); err != nil {
				t.Fatal(err)
			}
		}
		snd.Close()
		learned := func() int {
			n := 0
			for i := uint16(0); i < 200; i++ {
				if w.eth0D.echoOwner(tc.base+i, w.s.ClientIP) == tc.target {
					n++
				}
			}
			return n
		}
		// eth0 sees a request before its sendto returns (the softirq
		// runs as the veth's transmit ends), but the wait allows for
		// stragglers
		n := 0
		wait.Until(5*time.Second, func() bool { n = learned(); return n >= tc.min })
		if n < tc.min || n > tc.max {
			t.Errorf("%s: %d of 200 identifiers learned, want %d..%d", tc.name, n, tc.min, tc.max)
		}
	}
}

// A request that read the clock before another CPU refreshed the owner's
// entry sees a stamp younger than its own clock: the entry is live, and a
// request from another container for it is dropped, not a takeover.
func TestEchoEntryStampedAfterRequestNotTaken(t *testing.T) {
	w := newWire(t)
	if err := w.eth0D.EchoSteering(); err != nil {
		t.Skipf("echo replies are not steered by learning here: %v", err)
	}
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	b := w.plumb(t, "cb", 2, rg(33792, 34815))
	const id = 0x7a00
	last := monotonicNow() + uint64(10*time.Second)
	k := make([]byte, 8)
	binary.BigEndian.PutUint16(k, id)
	copy(k[4:], w.s.ClientIP.To4())
	v := bpfprog.EchoEchoEntry{Owner: uint32(a.veth), Window: uint32(last >> echoWindowShift), Last: last}
	w.eth0D.mu.Lock()
	err := w.eth0D.echo.echo.Update(k, v, ebpf.UpdateAny)
	w.eth0D.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	var snd *traffic.ICMPSender
	if err := b.c.Do(func() (err error) { snd, err = traffic.OpenICMPSender(); return err }); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	// cb's request for ca's identifier, then one for a fresh identifier:
	// once the second is learned as cb's, the first has passed the learn
	// program too (one path, in order)
	for _, i := range []uint16{id, id + 1} {
		if err := snd.Send(w.s.ClientIP, traffic.EchoRequest(i, 1)); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, 5*time.Second, "cb's fresh identifier learned", func() bool {
		return w.eth0D.echoOwner(id+1, w.s.ClientIP) == b.veth
	})
	if o := w.eth0D.echoOwner(id, w.s.ClientIP); o != a.veth {
		t.Fatalf("entry owner %d after cb's request, want ca's veth %d (cb %d)", o, a.veth, b.veth)
	}
}

// echoOwner returns the owner of {id, peer} in the IPv4 echo map: a veth,
// 0 for the host, -1 for none.
func (x *HostDemux) echoOwner(id uint16, peer net.IP) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := make([]byte, 8)
	binary.BigEndian.PutUint16(k, id)
	copy(k[4:], peer.To4())
	var v bpfprog.EchoEchoEntry
	if x.echo == nil || x.echo.echo.Lookup(k, &v) != nil {
		return -1
	}
	return int(v.Owner)
}

// echoLearned returns the veth learned for {id, peer} (0: none); for tests.
func (x *HostDemux) echoLearned(id uint16, peer net.IP) int {
	return max(x.echoOwner(id, peer), 0)
}

// BenchmarkEchoLearn times the IPv4 learn program on the host's echo
// request to a peer it already owns (the common case: a refresh), in the
// kernel (BPF_PROG_TEST_RUN): ns/op is the program's mean run time.
func BenchmarkEchoLearn(b *testing.B) {
	if err := BPFAvailable(); err != nil {
		b.Skipf("no cls_bpf: %v", err)
	}
	e, err := newEchoSteer(net.IPv4(198, 18, 0, 1), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer e.close()
	frame := make([]byte, 14+20+8)
	frame[12], frame[13] = 0x08, 0x00
	ip := frame[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 1
	copy(ip[12:], []byte{198, 18, 0, 1})
	copy(ip[16:], []byte{198, 18, 0, 2})
	icmp := ip[20:]
	icmp[0], icmp[4], icmp[5] = 8, 0x12, 0x34
	if v, _, err := e.learn.Benchmark(frame, 1, nil); err != nil || int32(v) != tcActUnspec {
		b.Fatalf("learn program: verdict %d, %v", int32(v), err)
	}
	b.ResetTimer()
	_, d, err := e.learn.Benchmark(frame, b.N, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(d.Nanoseconds()), "kernel-ns/op")
}
