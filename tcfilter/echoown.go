package tcfilter

import (
	"fmt"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/bpfprog"
)

// Owned echo entries: what the learn programs (echo.go, echo6.go; the C is
// bpfprog's own.h, whose constants must match these) do with an echo
// request once they know its key {identifier, peer} and its origin (the
// container's veth, or 0 for the host).
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
)

// echoSweeper deletes an echo map's entries that are no longer live, and
// the quota entries of windows gone by, every echoSweepEvery.
type echoSweeper struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// startSweep starts sweeping echo and quota. The maps must stay open until
// the sweeper is stopped.
func startSweep(echo, quota *ebpf.Map) *echoSweeper {
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
			sweepEcho(echo, quota, monotonicNow())
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
func sweepEcho(echo, quota *ebpf.Map, now uint64) int {
	n := sweepMap(echo, func(v bpfprog.EchoEchoEntry) bool {
		// an entry refreshed after now was read is live, not ancient
		return now > v.Last && now-v.Last >= uint64(echoLive)
	})
	w := now >> echoWindowShift
	sweepMap(quota, func(v bpfprog.EchoQuota) bool { return v.Window+1 < w })
	return n
}

// sweepMap deletes the entries of m for which gone holds; it walks the
// keys once, reading a key's successor before it may delete the key (an
// iterator would start over after a deletion).
func sweepMap[V any](m *ebpf.Map, gone func(v V) bool) int {
	cur, err := m.NextKeyBytes(nil)
	var v V
	n := 0
	for i := 0; err == nil && cur != nil && i < 2*echoEntries; i++ {
		var next []byte
		next, err = m.NextKeyBytes(cur)
		if m.Lookup(cur, &v) == nil && gone(v) && m.Delete(cur) == nil {
			n++
		}
		cur = next
	}
	return n
}

// SetDropSinks makes the echo programs count the requests they drop under
// DropEcho in the count map of s (call before Init; nil or no count map:
// dropped, not counted).
func (x *HostDemux) SetDropSinks(s *DropSinks) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.counts != nil {
		x.counts.Close()
		x.counts = nil
	}
	if !s.BPF() {
		return nil
	}
	m, err := s.counts.Clone()
	if err != nil {
		return fmt.Errorf("drop count map: %w", err)
	}
	x.counts = m
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
		x.counts.Close()
		x.counts = nil
	}
}
