package ephemeral

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzParseSet: ParseSet never panics; a parsed set is canonical, holds no
// port 0, survives String/ParseSet and JSON round trips, and every error
// quotes the bad element.
func FuzzParseSet(f *testing.F) {
	for _, s := range []string{
		"", "31000-31999,32500", " 1 , 2-3 ", "65535", "0", "70000", "5-3", "abc",
		"1,,2", ",", "1-2-3", "-", "1-65535", "31000 - 31999", "99999999999999999999",
		"10-20,15-25,21", "\t7\n", "1,2,3,4,5,6,7,8,9,10,11,12", "+5", "0x10", "١",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSet(in)
		if err != nil {
			if !strings.HasPrefix(err.Error(), `invalid port range "`) || !s.Empty() {
				t.Fatalf("ParseSet(%q): error %q, set %v", in, err, s)
			}
			return
		}
		checkCanonical(t, s)
		if s.Contains(0) {
			t.Fatalf("ParseSet(%q) holds port 0", in)
		}
		// Every parsed element is inside the set, and the set has nothing else.
		var elems []Range
		if strings.TrimSpace(in) != "" {
			for _, tok := range strings.Split(in, ",") {
				r, err := ParseRange(tok)
				if err != nil {
					t.Fatalf("ParseSet(%q) ok but element %q: %v", in, tok, err)
				}
				elems = append(elems, r)
			}
		}
		if !NewSet(elems...).Equal(s) {
			t.Fatalf("ParseSet(%q) = %v, elements give %v", in, s, NewSet(elems...))
		}
		back, err := ParseSet(s.String())
		if err != nil || !back.Equal(s) || back.String() != s.String() {
			t.Fatalf("round trip %q -> %q -> %v, %v", in, s, back, err)
		}
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var j Set
		if err := json.Unmarshal(b, &j); err != nil || !j.Equal(s) {
			t.Fatalf("JSON round trip of %v: %s -> %v, %v", s, b, j, err)
		}
	})
}

// setFromBytes reads pairs of big-endian uint16 (begin, length byte) as ranges.
func setFromBytes(data []byte) Set {
	var rs []Range
	for len(data) >= 3 {
		b := int(data[0])<<8 | int(data[1])
		e := min(b+int(data[2])*int(data[2]), 65535) // lengths up to 65025
		rs = append(rs, Range{uint16(b), uint16(e)})
		data = data[3:]
	}
	return NewSet(rs...)
}

// FuzzSplit: the decomposition is aligned, sorted, disjoint, its union is
// exactly the input, and its count is the block-tree minimum.
func FuzzSplit(f *testing.F) {
	f.Add([]byte{0x79, 0x18, 22})             // 31000-31484
	f.Add([]byte{0x80, 0x00, 32})             // 32768-33792
	f.Add([]byte{0, 0, 255})                  // 0-65025
	f.Add([]byte{0xff, 0xff, 0})              // 65535
	f.Add([]byte{0xff, 0x00, 16, 0x10, 1, 3}) // two ranges
	f.Add([]byte{1, 1, 1, 1, 3, 1, 1, 5, 0})  // adjacent ranges
	f.Fuzz(func(t *testing.T, data []byte) {
		s := setFromBytes(data)
		parts := Split(s)
		checkSplit(t, s, parts)
		if want := minBlocksTree(s, 0, 1<<16); len(parts) != want || SplitCount(s) != want {
			t.Fatalf("Split(%v): %d ranges, minimum %d", s, len(parts), want)
		}
	})
}

// FuzzAllocator: random pools, block sizes and operation sequences keep the
// allocator's invariants (no double allocation, first fit, aligned blocks
// inside the pool, claim/release round trips, errors change nothing).
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{0x80, 0x00, 32}, uint8(2), []byte{0, 0, 0, 3, 2, 1, 0, 3, 3})
	f.Add([]byte{0x79, 0x18, 31, 0x9c, 0x40, 10}, uint8(0), []byte{2, 5, 1, 2, 5, 0, 3, 7, 1, 1, 1, 1})
	f.Add([]byte{0xff, 0x00, 16}, uint8(3), []byte{1, 1, 1, 1, 3, 0, 3, 1, 2, 1, 0})
	f.Add([]byte{0x04, 0x00, 2}, uint8(8), []byte{0}) // pool too small for the block
	f.Add([]byte{}, uint8(0), []byte{0})              // empty pool
	f.Add([]byte{0, 0, 255, 0xfe, 0x01, 255}, uint8(12), []byte{0, 0, 0, 2, 0, 1, 3, 0, 3, 1})
	f.Fuzz(func(t *testing.T, pool []byte, shift uint8, ops []byte) {
		s := setFromBytes(pool)
		block := 16 << (shift % 14)
		a, err := NewAllocator(s, block)
		if err != nil {
			// Only legitimate refusals: no aligned block of that size fits.
			fits := false
			for _, r := range Split(s) {
				fits = fits || r.Size() >= block
			}
			if fits {
				t.Fatalf("NewAllocator(%v, %d): %v, but an aligned block fits", s, block, err)
			}
			return
		}
		// The model check is O(blocks) per step: keep runs on huge pools short.
		limit := 500
		if a.Total() > 512 {
			limit = 64
		}
		if len(ops) > limit {
			ops = ops[:limit]
		}
		i := 0
		choose := func(n int) int {
			if i >= len(ops) {
				return 0
			}
			v := int(ops[i]) % n
			i++
			return v
		}
		runAllocatorModel(t, a, choose, len(ops))
		// Release everything: the allocator is empty again.
		for _, r := range a.Allocated() {
			if err := a.Release(r); err != nil {
				t.Fatal(err)
			}
		}
		if a.Used() != 0 || a.Free() != a.Total() {
			t.Fatalf("after releasing all: used %d free %d", a.Used(), a.Free())
		}
		if _, err := a.Allocate(); errors.Is(err, ErrExhausted) {
			t.Fatal("empty allocator exhausted")
		}
	})
}

// FuzzLedger: random Reserve/Update/Release sequences agree with the model
// of the sharing rules and never leave a failed request half applied.
func FuzzLedger(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add([]byte{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 4000 {
			ops = ops[:4000]
		}
		i := 0
		choose := func(n int) int {
			if i >= len(ops) {
				return 0
			}
			v := int(ops[i]) % n
			i++
			return v
		}
		runLedgerModel(t, choose, len(ops)/4)
	})
}
