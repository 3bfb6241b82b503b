package liteclient

import (
	"bytes"
	"math"
	"math/rand"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// TestVarintsAsProtowire: varints encode and decode as protowire's do,
// at every length and at the edges (overlong, more than 64 bits, cut).
func TestVarintsAsProtowire(t *testing.T) {
	vals := []uint64{0, 1, 127, 128, 300, 16383, 16384, math.MaxUint32, math.MaxInt64, math.MaxUint64}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 2000; i++ {
		vals = append(vals, rng.Uint64()>>uint(rng.Intn(64)))
	}
	for _, v := range vals {
		got, want := appendVarintValue(nil, v), protowire.AppendVarint(nil, v)
		if !bytes.Equal(got, want) {
			t.Fatalf("%d encodes as %x, protowire %x", v, got, want)
		}
		for cut := 0; cut <= len(want); cut++ {
			gv, gn := varint(want[:cut])
			wv, wn := protowire.ConsumeVarint(want[:cut])
			if (gn < 0) != (wn < 0) || (gn >= 0 && (gv != wv || gn != wn)) {
				t.Fatalf("%x: varint %d,%d; protowire %d,%d", want[:cut], gv, gn, wv, wn)
			}
		}
	}
	for _, b := range [][]byte{
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},       // 2^64-1
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},       // 65 bits
		{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, // 11 bytes
		{0x80, 0x00}, // overlong zero
	} {
		gv, gn := varint(b)
		wv, wn := protowire.ConsumeVarint(b)
		if (gn < 0) != (wn < 0) || (gn >= 0 && (gv != wv || gn != wn)) {
			t.Errorf("%x: varint %d,%d; protowire %d,%d", b, gv, gn, wv, wn)
		}
	}
}

// TestSkipAsProtowire: every wire type, groups nested and broken, is
// skipped by the length protowire consumes.
func TestSkipAsProtowire(t *testing.T) {
	grp := protowire.AppendTag(nil, 7, protowire.VarintType)
	grp = protowire.AppendVarint(grp, 300)
	grp = protowire.AppendTag(grp, 8, protowire.StartGroupType)
	grp = protowire.AppendTag(grp, 9, protowire.Fixed32Type)
	grp = protowire.AppendFixed32(grp, 1)
	grp = protowire.AppendTag(grp, 8, protowire.EndGroupType)
	grp = protowire.AppendTag(grp, 5, protowire.EndGroupType)
	cases := []struct {
		typ protowire.Type
		b   []byte
	}{
		{protowire.VarintType, protowire.AppendVarint(nil, 1<<50)},
		{protowire.Fixed32Type, []byte{1, 2, 3, 4, 5}},
		{protowire.Fixed32Type, []byte{1, 2, 3}},
		{protowire.Fixed64Type, []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		{protowire.Fixed64Type, []byte{1, 2, 3, 4, 5, 6, 7}},
		{protowire.BytesType, protowire.AppendString(nil, "hello")},
		{protowire.BytesType, []byte{0x05, 'h'}},
		{protowire.StartGroupType, grp},
		{protowire.StartGroupType, grp[:len(grp)-1]},
		{protowire.StartGroupType, append(grp[:len(grp)-1:len(grp)-1], byte(protowire.EncodeTag(6, protowire.EndGroupType)))},
		{protowire.EndGroupType, nil},
		{6, []byte{0}},
	}
	for _, c := range cases {
		got := skip(5, wireType(c.typ), c.b, recursionLimit)
		want := protowire.ConsumeFieldValue(5, c.typ, c.b)
		if (got < 0) != (want < 0) || (got >= 0 && got != want) {
			t.Errorf("type %d %x: skip %d, protowire %d", c.typ, c.b, got, want)
		}
	}
}
