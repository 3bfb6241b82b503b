package ephemeral

import (
	"math/rand/v2"
	"testing"
)

// bitmap is a test model of a port set: one bit per port.
type bitmap [1024]uint64

func (b *bitmap) set(p int)      { b[p/64] |= 1 << (p % 64) }
func (b *bitmap) has(p int) bool { return b[p/64]&(1<<(p%64)) != 0 }

func bitmapOf(s Set) *bitmap {
	var b bitmap
	for _, r := range s.Ranges() {
		for p := int(r.Begin); p <= int(r.End); p++ {
			b.set(p)
		}
	}
	return &b
}

func (b *bitmap) count() int {
	n := 0
	for p := 0; p < 65536; p++ {
		if b.has(p) {
			n++
		}
	}
	return n
}

// setOf builds a Set from a bitmap, independently of NewSet's merging.
func (b *bitmap) setOf() Set {
	var rs []Range
	for p := 0; p < 65536; p++ {
		if !b.has(p) {
			continue
		}
		q := p
		for q+1 < 65536 && b.has(q+1) {
			q++
		}
		rs = append(rs, Range{Begin: uint16(p), End: uint16(q)})
		p = q
	}
	return Set{rs: rs}
}

// checkCanonical fails unless s's ranges are valid, sorted, disjoint and
// non-adjacent.
func checkCanonical(t testing.TB, s Set) {
	t.Helper()
	for i, r := range s.rs {
		if r.End < r.Begin {
			t.Fatalf("set %v: reversed range %v", s.rs, r)
		}
		if i > 0 && int(s.rs[i-1].End)+1 >= int(r.Begin) {
			t.Fatalf("set %v: ranges %v and %v not sorted/merged", s.rs, s.rs[i-1], r)
		}
	}
}

// randomSet returns up to n random ranges inside [base, base+width), some
// overlapping, adjacent or single ports.
func randomSet(rng *rand.Rand, base, width, n int) Set {
	k := rng.IntN(n + 1)
	rs := make([]Range, 0, k)
	for range k {
		b := base + rng.IntN(width)
		e := b + rng.IntN(min(width/4+1, base+width-b))
		if rng.IntN(4) == 0 {
			e = b
		}
		rs = append(rs, Range{Begin: uint16(b), End: uint16(e)})
	}
	return NewSet(rs...)
}

// windows are the places random sets are drawn from: the edges of the port
// space (0 and 65535 catch overflow) and a typical static range.
var windows = []struct{ base, width int }{
	{0, 200},
	{31000, 300},
	{65536 - 200, 200},
	{0, 65536},
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed*31+1)) }
