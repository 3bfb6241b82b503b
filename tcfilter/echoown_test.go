package tcfilter

import (
	"encoding/binary"
	"net"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

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
	echo, quota, err := newOwnMaps(8, "iso_echo_t", "iso_echo_quota_t")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.close()
	defer quota.close()
	now := monotonicNow()
	w := now >> echoWindowShift
	entry := func(owner uint32, last uint64) []byte {
		v := make([]byte, echoValueSize)
		binary.NativeEndian.PutUint32(v, owner)
		binary.NativeEndian.PutUint32(v[4:], uint32(last>>echoWindowShift))
		binary.NativeEndian.PutUint64(v[8:], last)
		return v
	}
	// -1 s: refreshed after now was read (the walk takes time)
	ages := []time.Duration{-time.Second, 0, time.Second, echoLive - time.Second, echoLive, echoLive + time.Second, time.Hour}
	for i, age := range ages {
		if err := echo.update([]byte{0, byte(i), 0, 0, 198, 18, 0, 2}, entry(7, now-uint64(age))); err != nil {
			t.Fatal(err)
		}
	}
	for i, win := range []uint64{w, w - 1, w - 2, w - 5} {
		v := make([]byte, quotaValueSize)
		binary.NativeEndian.PutUint64(v, win)
		if err := quota.update(ifKey(i+1), v); err != nil {
			t.Fatal(err)
		}
	}
	if n := sweepEcho(echo, quota, 8, now); n != 3 {
		t.Errorf("swept %d echo entries, want 3", n)
	}
	v := make([]byte, echoValueSize)
	for i, age := range ages {
		err := echo.lookup([]byte{0, byte(i), 0, 0, 198, 18, 0, 2}, v)
		if live := age < echoLive; live != (err == nil) {
			t.Errorf("entry %v old: present %v, want %v", age, err == nil, live)
		}
	}
	for i, want := range []bool{true, true, false, false} {
		if got := quota.lookup(ifKey(i+1), make([]byte, quotaValueSize)) == nil; got != want {
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
	v := make([]byte, echoValueSize)
	binary.NativeEndian.PutUint32(v, uint32(a.veth))
	binary.NativeEndian.PutUint32(v[4:], uint32(last>>echoWindowShift))
	binary.NativeEndian.PutUint64(v[8:], last)
	w.eth0D.mu.Lock()
	err := w.eth0D.echo.echo.update(k, v)
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
	v := make([]byte, echoValueSize)
	if x.echo == nil || x.echo.echo.lookup(k, v) != nil {
		return -1
	}
	return int(binary.NativeEndian.Uint32(v))
}

// echoLearned returns the veth learned for {id, peer} (0: none); for tests.
func (x *HostDemux) echoLearned(id uint16, peer net.IP) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.echo == nil {
		return 0
	}
	k := make([]byte, 8)
	binary.BigEndian.PutUint16(k, id)
	copy(k[4:], peer.To4())
	v := make([]byte, echoValueSize)
	if x.echo.echo.lookup(k, v) != nil {
		return 0
	}
	return int(binary.NativeEndian.Uint32(v))
}

// testRun runs program fd on frame repeat times in the kernel
// (BPF_PROG_TEST_RUN) and returns its verdict and the mean time per run.
func testRun(fd int, frame []byte, repeat int) (int32, time.Duration, error) {
	attr := struct {
		progFd, retval, sizeIn, sizeOut uint32
		dataIn, dataOut                 uint64
		repeat, duration                uint32
		ctxSizeIn, ctxSizeOut           uint32
		ctxIn, ctxOut                   uint64
		flags, cpu, batch               uint32
		_                               uint32
	}{progFd: uint32(fd), sizeIn: uint32(len(frame)), dataIn: uint64(uintptr(unsafe.Pointer(&frame[0]))), repeat: uint32(repeat)}
	_, err := bpfSys(unix.BPF_PROG_TEST_RUN, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(frame)
	return int32(attr.retval), time.Duration(attr.duration), err
}

// BenchmarkEchoLearn times the IPv4 learn program on the host's echo
// request to a peer it already owns (the common case: a refresh), in the
// kernel: ns/op is the program's mean run time.
func BenchmarkEchoLearn(b *testing.B) {
	if err := BPFAvailable(); err != nil {
		b.Skipf("no cls_bpf: %v", err)
	}
	e, err := newEchoSteer(net.IPv4(198, 18, 0, 1), -1)
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
	if v, _, err := testRun(e.learnFd, frame, 1); err != nil || v != tcActUnspec {
		b.Fatalf("learn program: verdict %d, %v", v, err)
	}
	b.ResetTimer()
	_, d, err := testRun(e.learnFd, frame, b.N)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(d.Nanoseconds()), "kernel-ns/op")
}
