package ephemeral

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestSplitTable(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Range
	}{
		{"", nil},
		{"31000-31499", []Range{{31000, 31007}, {31008, 31039}, {31040, 31103}, {31104, 31231}, {31232, 31487}, {31488, 31495}, {31496, 31499}}},
		{"32768-33791", []Range{{32768, 33791}}},
		{"32768-65535", []Range{{32768, 65535}}},
		{"1-65535", []Range{{1, 1}, {2, 3}, {4, 7}, {8, 15}, {16, 31}, {32, 63}, {64, 127}, {128, 255}, {256, 511}, {512, 1023},
			{1024, 2047}, {2048, 4095}, {4096, 8191}, {8192, 16383}, {16384, 32767}, {32768, 65535}}},
		{"65535", []Range{{65535, 65535}}},
		{"7-8", []Range{{7, 7}, {8, 8}}},
		{"31000-31999,32500", []Range{{31000, 31007}, {31008, 31039}, {31040, 31103}, {31104, 31231}, {31232, 31743},
			{31744, 31999}, {32500, 32500}}},
	} {
		got := Split(MustParseSet(tc.in))
		if !slices.Equal(got, tc.want) {
			t.Errorf("Split(%q) = %v, want %v", tc.in, got, tc.want)
		}
		if n := SplitCount(MustParseSet(tc.in)); n != len(tc.want) {
			t.Errorf("SplitCount(%q) = %d, want %d", tc.in, n, len(tc.want))
		}
	}
	if got := Split(NewSet(Range{0, 65535})); !slices.Equal(got, []Range{{0, 65535}}) {
		t.Errorf("Split(all ports) = %v", got)
	}
}

// checkSplit verifies the shape of a decomposition: sorted, disjoint,
// aligned, and its union is exactly s.
func checkSplit(t testing.TB, s Set, parts []Range) {
	t.Helper()
	for i, r := range parts {
		if !r.IsAligned() {
			t.Fatalf("Split(%v): %v is not aligned", s, r)
		}
		if r.Begin&r.Mask() != r.Begin {
			t.Fatalf("Split(%v): %v: begin not matched by its own mask", s, r)
		}
		if i > 0 && parts[i-1].End >= r.Begin {
			t.Fatalf("Split(%v): %v and %v overlap or are unsorted", s, parts[i-1], r)
		}
	}
	if u := NewSet(parts...); !u.Equal(s) {
		t.Fatalf("Split(%v): union is %v", s, u)
	}
	// Every port of the union is matched by exactly one value/mask key and
	// that key only matches ports of s (the kernel sees keys, not ranges).
	for _, r := range parts {
		for _, p := range []uint16{r.Begin, r.End, r.Begin + uint16(r.Size()/2)} {
			if p&r.Mask() != r.Begin || !s.Contains(p) {
				t.Fatalf("Split(%v): key %d/%#x does not match port %d", s, r.Begin, r.Mask(), p)
			}
		}
	}
}

// minBlocksTree is an independent minimum: for the aligned block [b, b+size)
// of the binary block tree, a block inside s costs 1, a block disjoint from s
// costs 0, and a mixed block costs the sum of its halves (it cannot be used,
// and any cover of its part of s lies inside one of its halves).
func minBlocksTree(s Set, b, size int) int {
	r := Range{uint16(b), uint16(b + size - 1)}
	switch {
	case s.ContainsRange(r):
		return 1
	case !s.Overlaps(NewSet(r)):
		return 0
	}
	return minBlocksTree(s, b, size/2) + minBlocksTree(s, b+size/2, size/2)
}

// TestSplitMinimalExhaustive compares Split with a brute-force minimum over
// every subset of a 16-port window: dp[mask] is the fewest aligned blocks
// inside the window whose union is exactly mask (an exact cover may as well
// be a partition, since aligned blocks are nested or disjoint).
func TestSplitMinimalExhaustive(t *testing.T) {
	for _, base := range []int{31008, 31000, 65520, 0} { // aligned to 16, to 8 only, top of the port space, bottom
		var blocks []uint32 // bit masks of aligned blocks inside the window
		for size := 1; size <= 16; size *= 2 {
			for off := 0; off+size <= 16; off++ {
				if (base+off)%size == 0 {
					blocks = append(blocks, uint32(1<<size-1)<<off)
				}
			}
		}
		dp := make([]int, 1<<16)
		for m := 1; m < 1<<16; m++ {
			low := uint32(m & -m)
			dp[m] = 1 << 30
			for _, b := range blocks {
				if b&low != 0 && b&^uint32(m) == 0 {
					dp[m] = min(dp[m], 1+dp[uint32(m)&^b])
				}
			}
		}
		for m := range 1 << 16 {
			var rs []Range
			for i := range 16 {
				if m&(1<<i) != 0 {
					p := uint16(base + i)
					rs = append(rs, Range{p, p})
				}
			}
			s := NewSet(rs...)
			parts := Split(s)
			if len(parts) != dp[m] || SplitCount(s) != dp[m] {
				t.Fatalf("base %d: Split(%v) has %d ranges, minimum is %d", base, s, len(parts), dp[m])
			}
			if m%97 == 0 || m == 1<<16-1 {
				checkSplit(t, s, parts)
			}
		}
	}
}

// TestSplitProperties checks random sets anywhere in the port space: exact
// union, no overlap, aligned, and the count equals the block-tree minimum.
func TestSplitProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		w := windows[i%len(windows)]
		s := randomSet(rng, w.base, w.width, 8)
		parts := Split(s)
		checkSplit(t, s, parts)
		if want := minBlocksTree(s, 0, 1<<16); len(parts) != want {
			t.Fatalf("Split(%v) has %d ranges, minimum is %d", s, len(parts), want)
		}
	}
}
