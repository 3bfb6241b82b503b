package spread

import (
	"strings"
	"testing"
)

// slotsFrom returns n slots first, first+1, ...
func slotsFrom(first uint16, n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = first + uint16(i)
	}
	return out
}

// shares counts the buckets of each slot.
func shares(a *[Buckets]Holder) map[uint16]int {
	n := map[uint16]int{}
	for _, h := range a {
		n[h.Slot]++
	}
	return n
}

func TestAssignEdges(t *testing.T) {
	for _, c := range []struct {
		name    string
		holders []Holder
		err     string // substring of the error; "" = valid
		minEach int    // buckets every holder gets at least
	}{
		{"none", nil, "no holders", 0},
		{"one holder takes every bucket", holders(7), "", Buckets},
		{"two", holders(1, 2), "", Buckets / 4},
		{"MaxHolders: one bucket each", holders(slotsFrom(1, MaxHolders)...), "", 1},
		{"MaxHolders with high slots", holders(slotsFrom(4095-MaxHolders+1, MaxHolders)...), "", 1},
		{"one more than MaxHolders", holders(slotsFrom(1, MaxHolders+1)...), "at most 256", 0},
		{"a slot twice", holders(3, 5, 3), "slot 3 listed twice", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, port := range []uint16{1, 80, 31000, 65535} {
				a, err := Assign(port, c.holders)
				if c.err != "" {
					if err == nil || !strings.Contains(err.Error(), c.err) {
						t.Fatalf("port %d: err %v, want one saying %q", port, err, c.err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("port %d: %v", port, err)
				}
				n := shares(&a)
				if len(n) != len(c.holders) {
					t.Errorf("port %d: %d of %d holders got buckets", port, len(n), len(c.holders))
				}
				for _, h := range c.holders {
					if n[h.Slot] < c.minEach {
						t.Errorf("port %d: slot %d got %d buckets, want >= %d", port, h.Slot, n[h.Slot], c.minEach)
					}
				}
				for b, h := range a {
					if h.Target != int(h.Slot)+100 {
						t.Fatalf("port %d bucket %d: holder %+v lost its target", port, b, h)
					}
				}
			}
		})
	}
}

// TestAssignChurn adds and removes one holder from sets of every size and
// checks that most buckets stay where they were: a join moves buckets only
// to the newcomer (about 1/(n+1) of them), a leave moves only the
// leaver's.
func TestAssignChurn(t *testing.T) {
	// (Near MaxHolders the step that gives every holder a bucket trades
	// buckets among the others: TestAssignEdges covers that end.)
	for _, n := range []int{1, 2, 3, 5, 8, 16, 64} {
		for _, port := range []uint16{80, 8443, 50000} {
			before := slotsFrom(10, n)
			a, err := Assign(port, holders(before...))
			if err != nil {
				t.Fatal(err)
			}
			join, err := Assign(port, holders(append(before, 9)...))
			if err != nil {
				t.Fatal(err)
			}
			moved := 0
			for b := range join {
				if join[b] == a[b] {
					continue
				}
				moved++
				if join[b].Slot != 9 {
					t.Fatalf("n=%d port %d: join moved bucket %d from %d to %d", n, port, b, a[b].Slot, join[b].Slot)
				}
			}
			// the newcomer's fair share is Buckets/(n+1); allow 3x (at
			// least a few buckets) for the hash's spread
			if limit := max(3*Buckets/(n+1), 4); moved == 0 || moved > limit {
				t.Errorf("n=%d port %d: a join moved %d buckets, want 1..%d", n, port, moved, limit)
			}
			if n == 1 {
				continue
			}
			gone := before[n/2]
			rest := append(slotsFrom(10, n/2), before[n/2+1:]...)
			leave, err := Assign(port, holders(rest...))
			if err != nil {
				t.Fatal(err)
			}
			for b := range leave {
				if a[b].Slot != gone && leave[b] != a[b] {
					t.Fatalf("n=%d port %d: removing slot %d moved bucket %d of slot %d", n, port, gone, b, a[b].Slot)
				}
				if leave[b].Slot == gone {
					t.Fatalf("n=%d port %d: bucket %d still goes to the leaver", n, port, b)
				}
			}
		}
	}
}

// TestPlanPinBound: a bucket that moves away from a holder that stays
// carries that holder's live flows as pins up to MaxPinsPerBucket; with
// more, or when its flows cannot be read, it stays where it is. Pins kept
// from an earlier change (another holder's, in the same bucket) count
// towards the bound.
func TestPlanPinBound(t *testing.T) {
	const port = 12000
	want, _ := Assign(port, holders(1, 2, 3))
	b := -1 // a bucket the consistent assignment gives to slot 2
	for i := range want {
		if want[i].Slot == 2 {
			b = i
			break
		}
	}
	// flowsIn returns n distinct source ports of bucket b, from the k-th on.
	flowsIn := func(k, n int) []uint16 {
		var ps []uint16
		for i := k; i < k+n; i++ {
			ps = append(ps, uint16(b<<1|(i&1)|(i>>1+1)<<9))
		}
		return ps
	}
	for _, c := range []struct {
		name       string
		flows      int  // live flows of slot 1, which holds bucket b now
		kept       int  // live pins of slot 3 in bucket b
		unreadable bool // slot 1's flows cannot be read
		moves      bool // bucket b goes to slot 2
		pins1      int  // pins of slot 1 in bucket b afterwards
	}{
		{"no flow: moves without pins", 0, 0, false, true, 0},
		{"one flow: moves with its pin", 1, 0, false, true, 1},
		{"at the bound: moves", MaxPinsPerBucket, 0, false, true, MaxPinsPerBucket},
		{"over the bound: stays", MaxPinsPerBucket + 1, 0, false, false, 0},
		{"with kept pins at the bound: moves", MaxPinsPerBucket / 2, MaxPinsPerBucket / 2, false, true, MaxPinsPerBucket / 2},
		{"with kept pins over the bound: stays", MaxPinsPerBucket / 2, MaxPinsPerBucket/2 + 1, false, false, 0},
		{"flows unreadable: stays", 1, 0, true, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cur := Spread{Buckets: want, Pins: map[Flow]Holder{}}
			cur.Buckets[b] = holders(1)[0]
			mine, theirs := flowsIn(0, c.flows), flowsIn(c.flows, c.kept)
			for _, p := range theirs {
				cur.Pins[fl(p)] = holders(3)[0]
			}
			known := map[uint16][]uint16{1: mine, 2: nil, 3: theirs}
			if c.unreadable {
				delete(known, 1)
			}
			next, err := Plan(port, holders(1, 2, 3), &cur, flowsOf(known, nil))
			if err != nil {
				t.Fatal(err)
			}
			if got := next.Buckets[b].Slot == 2; got != c.moves {
				t.Errorf("bucket %d moved = %v, want %v", b, got, c.moves)
			}
			per := map[uint16]int{}
			for p, h := range next.Pins {
				if Bucket(p.Port()) == b {
					per[h.Slot]++
				}
			}
			if n := per[1] + per[3]; n > MaxPinsPerBucket {
				t.Errorf("%d pins in bucket %d, more than %d", n, b, MaxPinsPerBucket)
			}
			if per[1] != c.pins1 || per[3] != c.kept {
				t.Errorf("pins in bucket %d: %d of slot 1, %d of slot 3; want %d and %d", b, per[1], per[3], c.pins1, c.kept)
			}
			for slot, ps := range map[uint16][]uint16{1: mine, 3: theirs} {
				for _, p := range ps {
					if got := next.Holder(fl(p)).Slot; got != slot {
						t.Errorf("live flow %d of slot %d now goes to %d", p, slot, got)
					}
				}
			}
		})
	}
}
