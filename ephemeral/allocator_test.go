package ephemeral

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestNewAllocatorErrors(t *testing.T) {
	for _, tc := range []struct {
		pool  string
		block int
		want  string
	}{
		{"32768-65535", 0, "below the minimum 16"},
		{"32768-65535", 8, "below the minimum 16"},
		{"32768-65535", -64, "below the minimum 16"},
		{"32768-65535", 24, "not a power of two"},
		{"32768-65535", 100, "not a power of two"},
		{"32768-65535", 1 << 17, "larger than the port space"},
		{"", 64, "pool is empty"},
		{"31000-31999", 1024, "no aligned block of 1024 ports fits in ephemeral pool 31000-31999 (largest aligned block: 512 ports)"},
		{"32769-33791", 1024, "no aligned block of 1024 ports"},
		{"40000-40010,40020-40030", 16, "no aligned block of 16 ports"},
	} {
		a, err := NewAllocator(MustParseSet(tc.pool), tc.block)
		if err == nil {
			t.Errorf("NewAllocator(%q, %d) = %d blocks, want error", tc.pool, tc.block, a.Total())
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewAllocator(%q, %d): %q, want %q", tc.pool, tc.block, err, tc.want)
		}
	}
}

func TestAllocatorBlocks(t *testing.T) {
	for _, tc := range []struct {
		pool  Set
		block int
		want  []Range // every block, in allocation order
	}{
		{MustParseSet("31000-31999"), 512, []Range{{31232, 31743}}},
		{MustParseSet("31000-31999"), 256, []Range{{31232, 31487}, {31488, 31743}, {31744, 31999}}},
		{MustParseSet("32768-33791"), 256, []Range{{32768, 33023}, {33024, 33279}, {33280, 33535}, {33536, 33791}}},
		{MustParseSet("40000-40100,50000-50040"), 32, []Range{{40000, 40031}, {40032, 40063}, {40064, 40095}}},
		{MustParseSet("65280-65535"), 128, []Range{{65280, 65407}, {65408, 65535}}},
		{MustParseSet("1-65535"), 1 << 15, []Range{{32768, 65535}}},
		{NewSet(Range{0, 65535}), 1 << 16, []Range{{0, 65535}}},
	} {
		a, err := NewAllocator(tc.pool, tc.block)
		if err != nil {
			t.Fatalf("NewAllocator(%q, %d): %v", tc.pool, tc.block, err)
		}
		if a.Total() != len(tc.want) || a.Free() != len(tc.want) || a.Used() != 0 || a.BlockSize() != tc.block {
			t.Fatalf("%q/%d: total %d free %d used %d", tc.pool, tc.block, a.Total(), a.Free(), a.Used())
		}
		var got []Range
		for {
			r, err := a.Allocate()
			if errors.Is(err, ErrExhausted) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, r)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q/%d: allocated %v, want %v", tc.pool, tc.block, got, tc.want)
		}
		if a.Free() != 0 || a.Used() != a.Total() || !slices.Equal(a.Allocated(), tc.want) {
			t.Errorf("%q/%d: after exhaustion free %d used %d allocated %v", tc.pool, tc.block, a.Free(), a.Used(), a.Allocated())
		}
	}
}

func TestAllocatorFirstFitAndErrors(t *testing.T) {
	a, err := NewAllocator(MustParseSet("32768-33791"), 256)
	if err != nil {
		t.Fatal(err)
	}
	b0, _ := a.Allocate()
	b1, _ := a.Allocate()
	b2, _ := a.Allocate()
	if err := a.Release(b1); err != nil {
		t.Fatal(err)
	}
	if r, _ := a.Allocate(); r != b1 {
		t.Fatalf("first fit gave %v, want the released %v", r, b1)
	}
	// Claim the last block, then the pool is exhausted.
	last := Range{33536, 33791}
	if err := a.Claim(last); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "all 4 blocks of 256 ports in 32768-33791") {
		t.Fatalf("Allocate on a full pool: %v", err)
	}
	for _, tc := range []struct {
		name string
		op   func() error
		want error
		msg  string
	}{
		{"claim taken", func() error { return a.Claim(b0) }, ErrTaken, "cannot claim ephemeral range 32768-33023: block already allocated"},
		{"claim unaligned start", func() error { return a.Claim(Range{32800, 33055}) }, ErrUnaligned, "cannot claim ephemeral range 32800-33055"},
		{"claim wrong size", func() error { return a.Claim(Range{32768, 32895}) }, ErrUnaligned, "256 ports starting at a multiple of 256"},
		{"claim outside", func() error { return a.Claim(Range{33792, 34047}) }, ErrNotManaged, "outside the ephemeral pool 32768-33791"},
		{"claim straddling", func() error { return a.Claim(Range{33700, 33900}) }, ErrNotManaged, ""},
		{"claim reversed", func() error { return a.Claim(Range{33023, 32768}) }, ErrNotManaged, ""},
		{"release outside", func() error { return a.Release(Range{1, 256}) }, ErrNotAllocated, "outside the ephemeral pool"},
		{"release unaligned", func() error { return a.Release(Range{32769, 33024}) }, ErrUnaligned, ""},
	} {
		used := a.Allocated()
		err := tc.op()
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
		if !slices.Equal(a.Allocated(), used) {
			t.Errorf("%s changed the allocation", tc.name)
		}
	}
	if err := a.Release(Range{32769, 33024}); !errors.Is(err, ErrNotAllocated) {
		t.Errorf("release of a non-block should also wrap ErrNotAllocated: %v", err)
	}
	// Double release.
	if err := a.Release(b2); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(b2); !errors.Is(err, ErrNotAllocated) || a.Used() != 3 {
		t.Fatalf("double release: %v, used %d", err, a.Used())
	}
	if !a.IsManaged(b2) || a.IsManaged(Range{33700, 33900}) || a.IsManaged(Range{100, 50}) || !a.IsManaged(Range{33000, 33001}) {
		t.Error("IsManaged")
	}
	if a.IsAllocated(b2) || !a.IsAllocated(b0) || !a.Pool().Equal(MustParseSet("32768-33791")) {
		t.Error("IsAllocated/Pool")
	}
}

// TestAllocatorProperties drives random Allocate/Claim/Release against a
// model: no block is handed out twice, every block is aligned and inside the
// pool, allocation is first fit, counts add up, errors change nothing.
func TestAllocatorProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pools := []string{"32768-33791", "31000-31999,40000-40511", "49152-65535", "1024-1279,1290-1600,65000-65535"}
	for i := range 40 {
		pool := MustParseSet(pools[i%len(pools)])
		block := 16 << rng.IntN(4)
		a, err := NewAllocator(pool, block)
		if err != nil {
			t.Fatal(err)
		}
		runAllocatorModel(t, a, func(n int) int { return rng.IntN(n) }, 400)
	}
}

// runAllocatorModel applies steps random operations (choose(n) picks in
// [0,n)) to a and checks it against a model after each one.
func runAllocatorModel(t testing.TB, a *Allocator, choose func(int) int, steps int) {
	t.Helper()
	bs := a.BlockSize()
	var all []Range // every block of the pool, ascending
	for _, r := range a.Pool().Ranges() {
		for b := (int(r.Begin) + bs - 1) / bs * bs; b+bs-1 <= int(r.End); b += bs {
			all = append(all, Range{uint16(b), uint16(b + bs - 1)})
		}
	}
	if a.Total() != len(all) {
		t.Fatalf("Total %d, model %d", a.Total(), len(all))
	}
	held := map[Range]bool{}
	for range steps {
		var r Range
		switch op := choose(4); op {
		case 0, 1: // allocate
			got, err := a.Allocate()
			want := -1
			for i, b := range all {
				if !held[b] {
					want = i
					break
				}
			}
			if want < 0 {
				if !errors.Is(err, ErrExhausted) {
					t.Fatalf("full pool: Allocate = %v, %v", got, err)
				}
				break
			}
			if err != nil || got != all[want] {
				t.Fatalf("Allocate = %v, %v; first free is %v", got, err, all[want])
			}
			held[got] = true
		case 2: // claim or release a block (or a near miss)
			if len(all) > 0 {
				r = all[choose(len(all))]
			}
			switch choose(4) {
			case 0:
				r.Begin += uint16(choose(3)) // maybe unaligned
			case 1:
				r = Range{r.Begin, r.Begin + uint16(bs/2-1)} // too small
			}
			wasHeld := held[r]
			err := a.Claim(r)
			isBlock := slices.Contains(all, r)
			switch {
			case !isBlock && err == nil:
				t.Fatalf("Claim(%v) of a non-block succeeded", r)
			case isBlock && wasHeld && !errors.Is(err, ErrTaken):
				t.Fatalf("double Claim(%v) = %v", r, err)
			case isBlock && !wasHeld && err != nil:
				t.Fatalf("Claim(%v) of a free block: %v", r, err)
			case isBlock && !wasHeld:
				held[r] = true
				// Round trip: release and claim again.
				if err := a.Release(r); err != nil {
					t.Fatalf("Release(%v) after Claim: %v", r, err)
				}
				if err := a.Claim(r); err != nil {
					t.Fatalf("re-Claim(%v): %v", r, err)
				}
			}
		case 3:
			if len(all) > 0 {
				r = all[choose(len(all))]
			}
			err := a.Release(r)
			if held[r] != (err == nil) || err != nil && !errors.Is(err, ErrNotAllocated) {
				t.Fatalf("Release(%v) held=%v: %v", r, held[r], err)
			}
			delete(held, r)
		}
		// Invariants.
		got := a.Allocated()
		if len(got) != len(held) || a.Used() != len(held) || a.Free()+a.Used() != a.Total() {
			t.Fatalf("counts: allocated %d used %d free %d total %d, model %d", len(got), a.Used(), a.Free(), a.Total(), len(held))
		}
		for i, g := range got {
			if !held[g] || !g.IsAligned() || g.Size() != bs || !a.Pool().ContainsRange(g) || i > 0 && got[i-1].End >= g.Begin {
				t.Fatalf("allocated %v: bad block %v", got, g)
			}
		}
	}
}
