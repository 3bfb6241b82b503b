package tcfilter

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/test/wait"
)

// TestTrafficSpreadUse: each node of a shared port's spread tells when it
// last steered a packet (its own action): a TCP exchange from a pinned
// source port makes only its pin recent, one from another port only that
// port's bucket; the other buckets of the same holder stay idle.
func TestTrafficSpreadUse(t *testing.T) {
	w := newWire(t)
	const port = 9292
	a := w.plumb(t, "ca", 1, rg(32768, 33023))
	b := w.plumb(t, "cb", 2, rg(33024, 33279))
	holdPort(t, port, a, b)
	two := []spread.Holder{{Slot: a.slot, Target: a.veth}, {Slot: b.slot, Target: b.veth}}
	want, _ := spread.Assign(port, two)
	var pinned, free uint16 // in b's buckets; pinned goes to a
	for p := uint16(50000); free == 0; p += 2 {
		switch bk := spread.Bucket(p); {
		case want[bk].Slot != b.slot:
		case pinned == 0:
			pinned = p
		case bk != spread.Bucket(pinned):
			free = p
		}
	}
	s := spread.Spread{Buckets: want, Pins: map[spread.Flow]spread.Holder{fl(pinned): two[0]}}
	if err := w.eth0D.SetSpread(port, s); err != nil {
		t.Fatal(err)
	}
	use := func() *SpreadUse {
		t.Helper()
		u, err := w.eth0D.SpreadUse(port, port+1)
		if err != nil || len(u) != 1 || u[port] == nil {
			t.Fatalf("SpreadUse: %v, %v", u, err)
		}
		return u[port]
	}
	if u := use(); u.Buckets[0] > time.Second || u.Pins[fl(pinned)] > time.Second || len(u.Pins) != 1 {
		t.Fatalf("fresh nodes: bucket 0 idle %v, pin %v (%d pins): installing is a use", u.Buckets[0], u.Pins[fl(pinned)], len(u.Pins))
	}
	const old = 400 * time.Millisecond
	wait.For(t, 10*time.Second, "every node idle", func() bool {
		u := use()
		for _, age := range u.Buckets {
			if age < old {
				return false
			}
		}
		return u.Pins[fl(pinned)] >= old
	})
	addr := net.JoinHostPort(w.s.HostIP.String(), fmt.Sprint(port))
	if l := dialLive(t, w, addr, pinned); l.name != "ca" {
		t.Fatalf("pinned port answered by %s", l.name)
	}
	u := use()
	if u.Pins[fl(pinned)] >= old || u.Buckets[spread.Bucket(pinned)] < old {
		t.Errorf("after traffic from the pinned port: pin idle %v, its bucket %v", u.Pins[fl(pinned)], u.Buckets[spread.Bucket(pinned)])
	}
	if l := dialLive(t, w, addr, free); l.name != "cb" {
		t.Fatalf("free port answered by %s", l.name)
	}
	u = use()
	for bk, age := range u.Buckets {
		if recent := age < old; recent != (bk == spread.Bucket(free)) {
			t.Errorf("bucket %d (holder %d) idle %v after traffic in bucket %d only", bk, want[bk].Slot, age, spread.Bucket(free))
		}
	}
}
