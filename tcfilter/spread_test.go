package tcfilter

import (
	"testing"

	"github.com/isolatord/isolatord/ephemeral/spread"
)

func TestPinID(t *testing.T) {
	// pin ids are unique within a bucket and fit 1..0x100 (below the bucket node)
	seen := map[[2]uint32]uint16{}
	for p := 0; p <= 65535; p++ {
		id := pinID(uint16(p))
		if id < 1 || id > 0x100 || id >= nodeSpread {
			t.Fatalf("pinID(%d) = %#x", p, id)
		}
		k := [2]uint32{uint32(spread.Bucket(uint16(p))), id}
		if o, dup := seen[k]; dup {
			t.Fatalf("ports %d and %d share bucket %d pin id %#x", o, p, k[0], id)
		}
		seen[k] = uint16(p)
	}
}

func TestCheckSpread(t *testing.T) {
	good, _ := spread.Assign(80, spreadHolders(1, 2))
	s := spread.Spread{Buckets: good, Pins: map[uint16]spread.Holder{}}
	if err := checkSpread(80, &s); err != nil {
		t.Fatal(err)
	}
	bad := s.Clone()
	bad.Buckets[7] = spread.Holder{}
	if checkSpread(80, &bad) == nil {
		t.Error("an empty bucket was accepted")
	}
	refuse := s.Clone()
	for b := range refuse.Buckets {
		refuse.Buckets[b] = spread.Refuse
	}
	refuse.Draining = map[uint16]bool{1: true}
	if err := checkSpread(80, &refuse); err != nil {
		t.Errorf("every bucket to the host (every holder drains): %v", err)
	}
	bad = s.Clone()
	bad.Pins[14] = spread.Holder{Slot: 1, Target: 999}
	if checkSpread(80, &bad) == nil {
		t.Error("a slot with two targets was accepted")
	}
	bad = s.Clone()
	for i := 0; i <= spread.MaxPinsPerBucket; i++ {
		bad.Pins[uint16(6|i<<9)] = spread.Holder{Slot: 1, Target: 101}
	}
	if checkSpread(80, &bad) == nil {
		t.Error("too many pins in one bucket were accepted")
	}
}

func spreadHolders(slots ...uint16) []spread.Holder {
	var out []spread.Holder
	for _, s := range slots {
		out = append(out, spread.Holder{Slot: s, Target: int(s) + 100})
	}
	return out
}

// flowsOf returns a FlowSource from a fixed map of slot -> source ports
// (slots missing from known are unreadable) and records who was asked.
func flowsOf(known map[uint16][]uint16, asked map[uint16]int) spread.FlowSource {
	return func(slot uint16) ([]uint16, bool) {
		if asked != nil {
			asked[slot]++
		}
		ps, ok := known[slot]
		return ps, ok
	}
}
