package spread

import "testing"

func TestAssignConsistent(t *testing.T) {
	hs := func(slots ...uint16) []Holder {
		var out []Holder
		for _, s := range slots {
			out = append(out, Holder{Slot: s, Target: int(s) + 100})
		}
		return out
	}
	for _, port := range []uint16{80, 8080, 9090, 65535} {
		a3, err := Assign(port, hs(1, 2, 3))
		if err != nil {
			t.Fatal(err)
		}
		// order of holders does not matter
		if b3, _ := Assign(port, hs(3, 1, 2)); b3 != a3 {
			t.Fatalf("port %d: assignment depends on holder order", port)
		}
		count := map[uint16]int{}
		for _, h := range a3 {
			count[h.Slot]++
			if h.Target != int(h.Slot)+100 {
				t.Fatalf("bucket holder %+v has the wrong target", h)
			}
		}
		for _, s := range []uint16{1, 2, 3} {
			if count[s] < Buckets/8 {
				t.Errorf("port %d: slot %d got only %d of %d buckets", port, s, count[s], Buckets)
			}
		}
		// adding a holder moves buckets only to the new holder
		a4, _ := Assign(port, hs(1, 2, 3, 4))
		moved := 0
		for b := range a4 {
			if a4[b] != a3[b] {
				moved++
				if a4[b].Slot != 4 {
					t.Fatalf("port %d bucket %d moved from %d to %d, not to the new holder", port, b, a3[b].Slot, a4[b].Slot)
				}
			}
		}
		if moved == 0 || moved > Buckets/2 {
			t.Errorf("port %d: adding a 4th holder moved %d buckets", port, moved)
		}
		// removing a holder moves only its own buckets
		a2, _ := Assign(port, hs(1, 3))
		for b := range a2 {
			if a3[b].Slot != 2 && a2[b] != a3[b] {
				t.Fatalf("port %d: removing slot 2 moved bucket %d of slot %d", port, b, a3[b].Slot)
			}
		}
	}
	// every holder gets a bucket, even with as many holders as buckets
	var many []Holder
	for s := uint16(1); s <= MaxHolders; s++ {
		many = append(many, Holder{Slot: s * 7, Target: 1})
	}
	a, err := Assign(443, many)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint16]bool{}
	for _, h := range a {
		got[h.Slot] = true
	}
	if len(got) != MaxHolders {
		t.Fatalf("%d of %d holders got a bucket", len(got), MaxHolders)
	}
	if _, err := Assign(443, append(many, Holder{Slot: 4000, Target: 1})); err == nil {
		t.Error("more holders than buckets accepted")
	}
	if _, err := Assign(443, hs(1, 1)); err == nil {
		t.Error("duplicate slot accepted")
	}
}
