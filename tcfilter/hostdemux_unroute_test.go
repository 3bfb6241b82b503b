package tcfilter

import (
	"errors"
	"slices"
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
)

// TestUnrouteMany: one Unroute removes several slots' ranges and fan-out
// nodes; each entry gets its own outcome: a bad entry (unaligned range,
// another slot's range) fails alone and changes nothing, a node already
// gone is counted as missing, and the device returns to its starting set.
func TestUnrouteMany(t *testing.T) {
	e := newKernelEnv(t, 3)
	d := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil)
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	start := e.tcShow(t, "eth0")
	rs := func(i int) []ephemeral.Range {
		b := uint16(32768 + (i-1)*64)
		return []ephemeral.Range{rg(b, b+63), rg(uint16(8000+i), uint16(8000+i))}
	}
	for i := 1; i <= 6; i++ {
		if err := d.AddRanges(uint16(i), e.targets[i%3], rs(i)); err != nil {
			t.Fatal(err)
		}
		if err := d.AddFanout(uint16(i), e.targets[i%3]); err != nil {
			t.Fatal(err)
		}
	}
	// Slot 3's static port is gone already: counted as missing.
	if _, err := d.DelRanges(3, rs(3)[1:]); err != nil {
		t.Fatal(err)
	}
	before := e.tcShow(t, "eth0")
	out := d.Unroute([]Unroute{
		{Slot: 1, Ranges: rs(1), Fanout: true},
		{Slot: 2, Ranges: []ephemeral.Range{rg(8001, 8001)}},               // slot 1's port
		{Slot: 3, Ranges: rs(3), Fanout: true},                             // its port is missing
		{Slot: 4, Ranges: []ephemeral.Range{rg(8003, 8004)}, Fanout: true}, // not aligned
		{Slot: 5, Ranges: rs(5), Fanout: true},
	})
	if len(out) != 5 {
		t.Fatalf("%d outcomes for 5 entries", len(out))
	}
	for _, i := range []int{0, 4} {
		if o := out[i]; o.Err != nil || o.MissingRanges != 0 || o.MissingFanout != 0 {
			t.Errorf("entry %d: %+v", i, o)
		}
	}
	if o := out[1]; o.Err == nil {
		t.Errorf("removing slot 1's port as slot 2's succeeded: %+v", o)
	}
	if o := out[2]; o.Err != nil || o.MissingRanges != 1 || o.MissingFanout != 0 {
		t.Errorf("entry 2: %+v, want 1 range node missing", o)
	}
	if o := out[3]; !errors.Is(o.Err, ErrNotAligned) {
		t.Errorf("entry 3: %+v, want ErrNotAligned", o)
	}
	ents, err := d.Entries()
	if err != nil {
		t.Fatal(err)
	}
	slots := map[uint16]bool{}
	for _, en := range ents {
		slots[en.Slot] = true
	}
	for s, want := range map[uint16]bool{1: false, 2: true, 3: false, 4: true, 5: false, 6: true} {
		if slots[s] != want {
			t.Errorf("slot %d has entries: %v, want %v (entries %v)", s, slots[s], want, ents)
		}
	}
	if after := e.tcShow(t, "eth0"); after == before {
		t.Fatal("Unroute changed nothing")
	}
	// The rest, then nothing is left.
	out = d.Unroute([]Unroute{
		{Slot: 2, Ranges: rs(2), Fanout: true},
		{Slot: 4, Ranges: rs(4), Fanout: true},
		{Slot: 6, Ranges: rs(6), Fanout: true},
	})
	for i, o := range out {
		if o.Err != nil || o.MissingRanges != 0 || o.MissingFanout != 0 {
			t.Errorf("second Unroute, entry %d: %+v", i, o)
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if end := e.tcShow(t, "eth0"); end != start {
		t.Fatalf("device did not return to its starting set (tables %v, handles %v)", tables(end), handles(end))
	}
	if ents, _ := d.Entries(); slices.ContainsFunc(ents, func(en Entry) bool { return en.Slot != 0 }) {
		t.Fatalf("entries left: %v", ents)
	}
}
