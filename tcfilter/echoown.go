package tcfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Owned echo entries: what the learn programs (echo.go, echo6.go) do with
// an echo request once they know its key {identifier, peer} and its origin
// (the container's veth, or 0 for the host).
//
// An entry of the echo map is {owner, window, last}: the origin that made
// it, the quota window it was last counted in, and when (CLOCK_MONOTONIC,
// bpf_ktime_get_ns) its owner last sent a request with that key. It is
// live for echoLive after that request.
//
//   - the owner's request refreshes it (last = now);
//   - another origin's request takes it over only when it is not live, or
//     when the other origin is the host (the host always wins); otherwise
//     the request is dropped and counted under DropEcho for the sender;
//   - a request with a key nobody has creates the entry;
//   - creating, taking over, or refreshing in a new window counts one
//     against the origin's quota for the current window (2^echoWindowShift
//     ns, 34.4 s): echoQuota for a container, echoHostQuota for the host.
//     Over its quota a container's request is dropped (and counted); the
//     host's is sent, not learned.
//
// A live entry was last counted in the current window or the one before
// (echoLive is shorter than a window), so a container owns at most
// 2 x echoQuota live entries; the sweeper (a goroutine per map, every
// echoSweepEvery) deletes entries that stopped being live, so the map
// holds at most 3 x echoQuota entries per container (last counted in the
// windows met by the last echoLive + echoSweepEvery): echoEntries is sized
// for that many for every origin the origin map can hold, so no flood
// fills it and nothing is ever evicted (the map is a plain hash, allocated
// as it fills). The program never deletes; the sweeper deleting an entry
// its owner refreshes at that moment (after echoLive of silence, when
// anyone could have taken it) costs the owner at most the replies to that
// request.
//
// Per packet: one ktime read, one lookup in the echo map and, a few times
// per window and origin, one in the quota map: flat in the number of
// containers.
const (
	echoEntries     = 1 << 20 // learned {identifier, peer} per family
	echoQuota       = 64      // a container's new keys per window
	echoHostQuota   = 4096    // the host's
	echoWindowShift = 35      // a quota window: 2^35 ns, 34.4 s
	echoLive        = 30 * time.Second
	echoSweepEvery  = 10 * time.Second
	echoValueSize   = 16 // owner (4), window (4), last (8)
	quotaEntries    = originMax + 1
	quotaValueSize  = 16   // window (8), count (8)
	bpfFetchAdd     = 0x01 // BPF_ADD | BPF_FETCH
)

// stack slots of the ownership code, below both families' own
const (
	stkOwnNew   = -120 // 16: a new entry
	stkOwnQuota = -136 // 16: a new quota entry
	stkOwnCount = -144 // 8: drop count key: veth (4), reason (4)
	stkOwnOne   = -152 // 8: the value 1
)

// ownMaps are the maps of the ownership code: the family's echo map and
// quota map, and the drop count map (-1: drops are not counted).
type ownMaps struct{ echo, quota, counts int }

// learnOwned applies the rules above to the request whose key is at stack
// offset key and origin at value (4 bytes): it goes on ("pass") or is
// dropped (TC_ACT_SHOT). It uses r6-r9.
func learnOwned(a *asm, m ownMaps, key, value int16) {
	a.call(helperKtimeGetNs)
	a.movReg(r8, r0) // now
	a.movReg(r9, r0)
	a.emit(opRshImm, r9, 0, 0, echoWindowShift) // the window
	a.ldxW(r1, r10, value)
	a.stxW(r10, r1, stkOwnNew)
	a.stxW(r10, r9, stkOwnNew+4)
	a.stxDW(r10, r8, stkOwnNew+8)
	a.ldMap(r1, m.echo)
	a.movReg(r2, r10)
	a.addImm(r2, int32(key))
	a.call(helperMapLookup)
	a.jmp(opJeqImm, r0, 0, "own_new")
	a.movReg(r7, r0)
	a.ldxW(r1, r7, 0)
	a.ldxW(r2, r10, value)
	a.jmpReg(opJeqReg, r1, r2, "own_mine")
	// another origin's entry: anyone's once it is not live, the host's
	// at any time
	a.ldxDW(r3, r7, 8)
	a.movReg(r4, r8)
	a.emit(opSubReg, r4, r3, 0, 0)
	a.ldImm64(r3, uint64(echoLive))
	// signed: an entry refreshed on another CPU after this request read
	// the clock is younger than now, not ancient (ns since boot < 2^63)
	a.jmpReg(opJsgeReg, r4, r3, "own_take")
	a.jmp(opJeqImm, r2, 0, "own_take")
	a.jmp(opJa, 0, 0, "own_drop")

	a.label("own_mine")
	a.ldxW(r1, r7, 4)
	a.jmpReg(opJeq32Reg, r1, r9, "own_refresh")
	quota(a, m.quota, value, "own_q1_", "own_drop")
	a.stxW(r7, r9, 4)
	a.label("own_refresh")
	a.stxDW(r7, r8, 8)
	a.jmp(opJa, 0, 0, "pass")

	a.label("own_take")
	quota(a, m.quota, value, "own_q2_", "own_drop")
	a.stxW(r7, r9, 4)
	a.stxDW(r7, r8, 8)
	a.ldxW(r1, r10, value)
	a.stxW(r7, r1, 0) // the owner last: the steer program reads only it
	a.jmp(opJa, 0, 0, "pass")

	a.label("own_new")
	quota(a, m.quota, value, "own_q3_", "own_drop")
	mapUpdateFlags(a, m.echo, int32(key), stkOwnNew, bpfNoExist)
	a.jmp(opJeqImm, r0, 0, "pass")
	// not inserted (another CPU inserted it first, or the map is full):
	// dropped like a request that may not be learned

	a.label("own_drop")
	a.ldxW(r1, r10, value)
	a.jmp(opJeq32, r1, 0, "pass") // the host's own requests are never dropped
	if m.counts >= 0 {
		countDrop(a, m.counts, value, slices.Index(DropReasons, DropEcho))
	}
	a.movImm(r0, tcActShot)
	a.exit()
}

// quota counts one against the quota of the origin at stack offset value
// for the window in r9, jumping to over when it is used up. A window's
// first count resets the origin's entry (two CPUs doing so at once may
// each count from zero: a quota is exact up to the CPUs racing at a
// window's turn).
func quota(a *asm, fd int, value int16, p, over string) {
	a.ldMap(r1, fd)
	a.movReg(r2, r10)
	a.addImm(r2, int32(value))
	a.call(helperMapLookup)
	a.jmp(opJeqImm, r0, 0, p+"ins")
	a.ldxDW(r1, r0, 0)
	a.jmpReg(opJeqReg, r1, r9, p+"add")
	a.stxDW(r0, r9, 0)
	a.emit(opStDW, r0, 0, 8, 0)
	a.label(p + "add")
	a.movImm(r1, 1)
	a.emit(opAtomicDW, r0, r1, 8, bpfFetchAdd) // r1: the count before
	a.movImm(r2, echoQuota)
	a.ldxW(r3, r10, value)
	a.jmp(opJne32, r3, 0, p+"cmp")
	a.movImm(r2, echoHostQuota)
	a.label(p + "cmp")
	a.jmpReg(opJgeReg, r1, r2, over)
	a.jmp(opJa, 0, 0, p+"ok")
	a.label(p + "ins")
	a.stxDW(r10, r9, stkOwnQuota)
	a.emit(opStDW, r10, 0, stkOwnQuota+8, 1)
	mapUpdateFlags(a, fd, int32(value), stkOwnQuota, bpfNoExist)
	a.jmp(opJeqImm, r0, 0, p+"ok")
	a.jmp(opJa, 0, 0, over) // not inserted (full, or another CPU first): fail closed
	a.label(p + "ok")
}

// countDrop adds one to the drop count map's entry {veth, reason code r}
// for the veth at stack offset value, as the drop sinks' programs do
// (countProgram). The program counts itself, under the veth its origin
// map gives (skb_iif may be a shaper's exit): the sink of DropEcho
// receives nothing.
func countDrop(a *asm, fd int, value int16, r int) {
	a.ldxW(r1, r10, value)
	a.stxW(r10, r1, stkOwnCount)
	a.stW(r10, stkOwnCount+4, int32(r))
	a.emit(opStDW, r10, 0, stkOwnOne, 1)
	addCount(a, fd, stkOwnCount, stkOwnOne, "own_counted")
}

// newOwnMaps creates a family's echo map (key size keySize) and quota map.
func newOwnMaps(keySize uint32, echoName, quotaName string) (echo, quota *bpfMap, err error) {
	if echo, err = newBPFMapFlags(unix.BPF_MAP_TYPE_HASH, keySize, echoValueSize, echoEntries, bpfNoPrealloc, echoName); err != nil {
		return nil, nil, err
	}
	if quota, err = newBPFMapFlags(unix.BPF_MAP_TYPE_HASH, 4, quotaValueSize, quotaEntries, bpfNoPrealloc, quotaName); err != nil {
		echo.close()
		return nil, nil, err
	}
	return echo, quota, nil
}

// echoSweeper deletes an echo map's entries that are no longer live, and
// the quota entries of windows gone by, every echoSweepEvery.
type echoSweeper struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// startSweep starts sweeping echo (keys of keySize bytes) and quota. The
// maps must stay open until the sweeper is stopped.
func startSweep(echo, quota *bpfMap, keySize int) *echoSweeper {
	s := &echoSweeper{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(echoSweepEvery)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			sweepEcho(echo, quota, keySize, monotonicNow())
		}
	}()
	return s
}

// halt stops the sweeper and waits for it (nil is fine).
func (s *echoSweeper) halt() {
	if s == nil {
		return
	}
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// monotonicNow is bpf_ktime_get_ns's clock.
func monotonicNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// sweepEcho makes one pass at now: it returns how many echo entries it
// deleted.
func sweepEcho(echo, quota *bpfMap, keySize int, now uint64) int {
	n := sweepMap(echo, keySize, echoValueSize, func(v []byte) bool {
		// an entry refreshed after now was read is live, not ancient
		last := binary.NativeEndian.Uint64(v[8:])
		return now > last && now-last >= uint64(echoLive)
	})
	w := now >> echoWindowShift
	sweepMap(quota, 4, quotaValueSize, func(v []byte) bool { return binary.NativeEndian.Uint64(v)+1 < w })
	return n
}

// sweepMap deletes the entries of m for which gone holds; it walks the
// keys once, reading a key's successor before it may delete the key.
func sweepMap(m *bpfMap, keySize, valueSize int, gone func(v []byte) bool) int {
	cur, err := m.nextKey(nil, keySize)
	v := make([]byte, valueSize)
	n := 0
	for i := 0; err == nil && cur != nil && i < 2*echoEntries; i++ {
		var next []byte
		next, err = m.nextKey(cur, keySize)
		if m.lookup(cur, v) == nil && gone(v) && m.delete(cur) == nil {
			n++
		}
		cur = next
	}
	return n
}

// nextKey returns the key after prev (nil: the first), nil after the last.
func (m *bpfMap) nextKey(prev []byte, size int) ([]byte, error) {
	next := make([]byte, size)
	attr := struct {
		fd        uint32
		_         uint32
		key, next uint64
	}{fd: uint32(m.fd), next: uint64(uintptr(unsafe.Pointer(&next[0])))}
	if prev != nil {
		attr.key = uint64(uintptr(unsafe.Pointer(&prev[0])))
	}
	_, err := bpfSys(unix.BPF_MAP_GET_NEXT_KEY, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(prev)
	runtime.KeepAlive(next)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bpf: map keys: %w", err)
	}
	return next, nil
}

// usesMap reports whether the program behind progFd uses the map behind
// mapFd.
func usesMap(progFd, mapFd int) bool {
	id := mapID(mapFd)
	return id != 0 && slices.Contains(progMapIDs(progFd), id)
}

// SetDropSinks makes the echo programs count the requests they drop under
// DropEcho in the count map of s (call before Init; nil or no count map:
// dropped, not counted).
func (x *HostDemux) SetDropSinks(s *DropSinks) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.counts != nil {
		x.counts.close()
		x.counts = nil
	}
	if !s.BPF() {
		return nil
	}
	fd, err := unix.FcntlInt(uintptr(s.counts.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("drop count map: %w", err)
	}
	x.counts = &bpfMap{fd: fd}
	return nil
}

// ReleaseEcho stops the echo maps' sweepers and closes the demux's
// descriptors of the echo programs and maps (they stay attached to eth0;
// a later Init takes them over again).
func (x *HostDemux) ReleaseEcho() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.echo6 != nil {
		x.echo6.close()
		x.echo6 = nil
	}
	if x.echo != nil {
		x.echo.close()
		x.echo = nil
	}
	if x.counts != nil {
		x.counts.close()
		x.counts = nil
	}
}

// countsFd is the count map's fd for the programs (-1: none).
func (x *HostDemux) countsFd() int {
	if x.counts == nil {
		return -1
	}
	return x.counts.fd
}

// countsCode is the count map reference of the programs' digest: 0 when
// drops are counted, -1 when not (the code differs).
func (x *HostDemux) countsCode() int {
	if x.counts == nil {
		return -1
	}
	return 0
}
