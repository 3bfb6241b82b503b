package nlattr

import (
	"bytes"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// TestAppendMatchesNetlink: Append writes what vishvananda/netlink's
// RtAttr.Serialize does, padding included, for values of every length
// modulo 4.
func TestAppendMatchesNetlink(t *testing.T) {
	for n := range 9 {
		v := bytes.Repeat([]byte{0xab}, n)
		if got, want := Append([]byte{1, 2}, 7, v), append([]byte{1, 2}, nl.NewRtAttr(7, v).Serialize()...); !bytes.Equal(got, want) {
			t.Errorf("value of %d bytes: % x, want % x", n, got, want)
		}
	}
}

// TestWalk: every attribute in order, padded or not, the type's flag bits
// cleared; a stop on fn's word; a length that runs past the end or is
// shorter than the header ends the walk and is reported; a last attribute
// without its padding and trailing bytes too few for a header are fine.
func TestWalk(t *testing.T) {
	var b []byte
	b = Append(b, 1, []byte("abc"))         // padded
	b = Append(b, 2|unix.NLA_F_NESTED, nil) // flag cleared
	b = Append(b, 3, []byte{1, 2, 3, 4})
	b = Append(b, 4, []byte{9})
	b = b[:len(b)-3] // the last one's padding is missing
	type seen struct {
		typ uint16
		v   string
	}
	var got []seen
	if !Walk(append(b, 0, 0), func(typ uint16, v []byte) bool { got = append(got, seen{typ, string(v)}); return true }) {
		t.Error("a well-formed list reported bad")
	}
	want := []seen{{1, "abc"}, {2, ""}, {3, "\x01\x02\x03\x04"}, {4, "\x09"}}
	if len(got) != len(want) {
		t.Fatalf("walked %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("attribute %d: %v, want %v", i, got[i], want[i])
		}
	}
	n := 0
	if !Walk(b, func(uint16, []byte) bool { n++; return n < 2 }) || n != 2 {
		t.Errorf("a walk stopped by fn at the second attribute saw %d", n)
	}
	if v := Get(b, 3); string(v) != "\x01\x02\x03\x04" {
		t.Errorf("Get(3) = % x", v)
	}
	if v := Get(b, 5); v != nil {
		t.Errorf("Get(5) = % x, want nil", v)
	}
	for _, l := range []byte{200, 3} { // past the end; shorter than a header
		bad := append([]byte(nil), b...)
		bad[8] = l // the second attribute's length (the first takes 8 bytes)
		n = 0
		if Walk(bad, func(uint16, []byte) bool { n++; return true }) || n != 1 {
			t.Errorf("length %d: walk reported good or saw %d attributes, want bad after 1", l, n)
		}
		if v := Get(bad, 3); v != nil {
			t.Errorf("length %d: Get(3) = % x past a bad attribute", l, v)
		}
	}
}
