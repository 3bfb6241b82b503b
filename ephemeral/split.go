package ephemeral

// Split decomposes s into the minimal list of aligned power-of-two ranges
// whose union is exactly s, sorted ascending. Each range r in the result
// satisfies r.IsAligned(), so the u32 key "port & r.Mask() == r.Begin" (the
// mask being ^(size-1)) matches exactly the ports of r.
//
// Algorithm: the ranges of a Set are merged, so no aligned block can span two
// of them, and each is split on its own. Within [lo, hi] we greedily take, at
// lo, the largest block that is aligned at lo (its size divides lo) and ends
// at or before hi, then continue after it. This is minimal: aligned blocks
// form a binary tree (two blocks are either disjoint or nested), so every
// exact cover of [lo, hi] must contain a block starting at lo, and the greedy
// one contains every other candidate; replacing the optimum's block at lo by
// the greedy block (and dropping the blocks it swallows) never adds a block.
// For example 31000-31499 splits into 7 ranges:
// 31000-31007, 31008-31039, 31040-31103, 31104-31231, 31232-31487,
// 31488-31495, 31496-31499.
func Split(s Set) []Range {
	var out []Range
	for _, r := range s.rs {
		out = appendSplit(out, int(r.Begin), int(r.End))
	}
	return out
}

// SplitCount is len(Split(s)) without building the list.
func SplitCount(s Set) int {
	n := 0
	for _, r := range s.rs {
		lo, hi := int(r.Begin), int(r.End)
		for lo <= hi {
			lo += blockAt(lo, hi)
			n++
		}
	}
	return n
}

func appendSplit(out []Range, lo, hi int) []Range {
	for lo <= hi {
		size := blockAt(lo, hi)
		out = append(out, Range{Begin: uint16(lo), End: uint16(lo + size - 1)})
		lo += size
	}
	return out
}

// blockAt is the size of the largest power-of-two block aligned at lo that
// fits in [lo, hi] (0 <= lo <= hi <= 65535).
func blockAt(lo, hi int) int {
	size := lo & -lo // largest power of two dividing lo
	if lo == 0 {
		size = 1 << 16
	}
	for lo+size-1 > hi {
		size >>= 1
	}
	return size
}
