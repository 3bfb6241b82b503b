package ephemeral

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestParseSetValid(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"   ", ""},
		{"31000-31999,32500", "31000-31999,32500"},
		{" 32500 , 31000-31999 ", "31000-31999,32500"},
		{"31000 - 31999", "31000-31999"},
		{"1", "1"},
		{"65535", "65535"},
		{"1-65535", "1-65535"},
		{"5-5", "5"},
		{"10-20,15-25", "10-25"},       // overlap merges
		{"10-20,21-30", "10-30"},       // adjacency merges
		{"10-20,22-30", "10-20,22-30"}, // a gap of one port stays
		{"30,10,20", "10,20,30"},
		{"7,7,7", "7"},
		{"65534,65535,1,2", "1-2,65534-65535"},
		{"0031000", "31000"},
	} {
		s, err := ParseSet(tc.in)
		if err != nil {
			t.Errorf("ParseSet(%q): %v", tc.in, err)
			continue
		}
		checkCanonical(t, s)
		if got := s.String(); got != tc.want {
			t.Errorf("ParseSet(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseSetInvalid(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"70000", `invalid port range "70000": port 70000 out of range 1-65535`},
		{"31000-70000", `invalid port range "31000-70000": port 70000 out of range 1-65535`},
		{"0", `invalid port range "0": port 0 out of range 1-65535`},
		{"0-10", `invalid port range "0-10": port 0 out of range 1-65535`},
		{"65536", `invalid port range "65536": port 65536 out of range 1-65535`},
		{"99999999999999999999999", `invalid port range "99999999999999999999999": port 99999999999999999999999 out of range 1-65535`},
		{"5-3", `invalid port range "5-3": range is reversed (5 > 3)`},
		{"1,2,5-3", `invalid port range "5-3"`},
		{"abc", `invalid port range "abc": "abc" is not a port number`},
		{"31000-31999,x", `invalid port range "x"`},
		{"1-2-3", `invalid port range "1-2-3": "2-3" is not a port number`},
		{"-5", `invalid port range "-5": missing port number`},
		{"5-", `invalid port range "5-": missing port number`},
		{"+5", `invalid port range "+5"`},
		{"0x10", `invalid port range "0x10"`},
		{"1 2", `invalid port range "1 2"`},
		{"1;2", `invalid port range "1;2"`},
		{"1,,2", `invalid port range "" (element 2 of "1,,2"): empty element`},
		{",", `invalid port range "" (element 1 of ","): empty element`},
		{"1,", `invalid port range "" (element 2 of "1,"): empty element`},
		{"１", `invalid port range "１"`}, // full-width digit
	} {
		s, err := ParseSet(tc.in)
		if err == nil {
			t.Errorf("ParseSet(%q) = %q, want error", tc.in, s)
			continue
		}
		if !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("ParseSet(%q) error %q, want prefix %q", tc.in, err, tc.want)
		}
	}
}

func TestParseRange(t *testing.T) {
	r, err := ParseRange(" 32768-60999 ")
	if err != nil || r != (Range{32768, 60999}) {
		t.Fatalf("ParseRange = %v, %v", r, err)
	}
	if _, err := ParseRange("1,2"); err == nil {
		t.Fatal("ParseRange accepted a list")
	}
}

func TestMustParseSetPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("MustParseSet did not panic on bad input")
		}
	}()
	MustParseSet("5-3")
}

func TestNewSet(t *testing.T) {
	s := NewSet(Range{20, 30}, Range{5, 10}, Range{11, 12}, Range{9, 3}, Range{65535, 65535}, Range{0, 0})
	if got, want := s.String(), "0,5-12,20-30,65535"; got != want {
		t.Fatalf("NewSet = %q, want %q (reversed ranges dropped, adjacent merged)", got, want)
	}
	if !NewSet().Equal(Set{}) || !NewSet(Range{3, 1}).Empty() {
		t.Fatal("empty sets differ")
	}
	if NewSet(Range{0, 65535}).Len() != 65536 {
		t.Fatal("full set length")
	}
}

func TestSetImmutable(t *testing.T) {
	in := []Range{{10, 20}, {30, 40}}
	s := NewSet(in...)
	in[0] = Range{1, 100}
	rs := s.Ranges()
	rs[0] = Range{1, 100}
	_ = s.Union(MustParseSet("15-35"))
	_ = s.Subtract(MustParseSet("15-35"))
	_ = s.Intersect(MustParseSet("15-35"))
	if got := s.String(); got != "10-20,30-40" {
		t.Fatalf("set changed to %q", got)
	}
}

func TestSetQueries(t *testing.T) {
	s := MustParseSet("10-20,30,65530-65535")
	for _, tc := range []struct {
		p    uint16
		want bool
	}{{9, false}, {10, true}, {20, true}, {21, false}, {29, false}, {30, true}, {31, false}, {65529, false}, {65535, true}, {0, false}} {
		if got := s.Contains(tc.p); got != tc.want {
			t.Errorf("Contains(%d) = %v", tc.p, got)
		}
	}
	for _, tc := range []struct {
		r    Range
		want bool
	}{{Range{10, 20}, true}, {Range{12, 15}, true}, {Range{10, 21}, false}, {Range{20, 30}, false}, {Range{30, 30}, true}, {Range{65530, 65535}, true}, {Range{5, 3}, true}} {
		if got := s.ContainsRange(tc.r); got != tc.want {
			t.Errorf("ContainsRange(%v) = %v", tc.r, got)
		}
	}
	if s.Len() != 11+1+6 {
		t.Errorf("Len = %d", s.Len())
	}
	if got := MustParseSet("3-5,9").Ports(); !slices.Equal(got, []uint16{3, 4, 5, 9}) {
		t.Errorf("Ports = %v", got)
	}
	if !s.ContainsSet(MustParseSet("11,30,65535")) || s.ContainsSet(MustParseSet("11,31")) || !s.ContainsSet(Set{}) {
		t.Error("ContainsSet")
	}
}

func TestSetAlgebra(t *testing.T) {
	for _, tc := range []struct{ a, b, union, inter, sub string }{
		{"", "", "", "", ""},
		{"1-10", "", "1-10", "", "1-10"},
		{"", "1-10", "1-10", "", ""},
		{"1-10", "5-15", "1-15", "5-10", "1-4"},
		{"1-10", "11-20", "1-20", "", "1-10"},
		{"1-10", "3-4,6,8-9", "1-10", "3-4,6,8-9", "1-2,5,7,10"},
		{"1-5,10-15,20-25", "4-11,14-21", "1-25", "4-5,10-11,14-15,20-21", "1-3,12-13,22-25"},
		{"1-65535", "1,65535", "1-65535", "1,65535", "2-65534"},
		{"65535", "65534-65535", "65534-65535", "65535", ""},
		{"100-200", "1-65535", "1-65535", "100-200", ""},
	} {
		a, b := MustParseSet(tc.a), MustParseSet(tc.b)
		check := func(op string, got Set, want string) {
			t.Helper()
			checkCanonical(t, got)
			if got.String() != want {
				t.Errorf("%q %s %q = %q, want %q", tc.a, op, tc.b, got, want)
			}
		}
		check("∪", a.Union(b), tc.union)
		check("∩", a.Intersect(b), tc.inter)
		check("−", a.Subtract(b), tc.sub)
		if got, want := a.Overlaps(b), tc.inter != ""; got != want {
			t.Errorf("%q overlaps %q = %v", tc.a, tc.b, got)
		}
	}
}

// TestSetProperties checks every operation against a bitmap model on random
// sets, including sets that touch ports 0 and 65535.
func TestSetProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 1500 {
		w := windows[i%len(windows)]
		a := randomSet(rng, w.base, w.width, 6)
		b := randomSet(rng, w.base, w.width, 6)
		if rng.IntN(8) == 0 {
			b = a
		}
		ma, mb := bitmapOf(a), bitmapOf(b)
		var mu, mi, ms bitmap
		overlap, subset := false, true
		for j := range ma {
			mu[j] = ma[j] | mb[j]
			mi[j] = ma[j] & mb[j]
			ms[j] = ma[j] &^ mb[j]
			overlap = overlap || mi[j] != 0
			subset = subset && mb[j]&^ma[j] == 0
		}
		for _, op := range []struct {
			name string
			got  Set
			want *bitmap
		}{{"Union", a.Union(b), &mu}, {"Intersect", a.Intersect(b), &mi}, {"Subtract", a.Subtract(b), &ms}} {
			checkCanonical(t, op.got)
			if !op.got.Equal(op.want.setOf()) {
				t.Fatalf("%v.%s(%v) = %v, want %v", a, op.name, b, op.got, op.want.setOf())
			}
		}
		checkCanonical(t, a)
		if a.Overlaps(b) != overlap || a.ContainsSet(b) != subset {
			t.Fatalf("%v vs %v: Overlaps %v ContainsSet %v, model %v %v", a, b, a.Overlaps(b), a.ContainsSet(b), overlap, subset)
		}
		if a.Len() != ma.count() || a.Empty() != (ma.count() == 0) || len(a.Ports()) != a.Len() {
			t.Fatalf("%v: Len %d, model %d", a, a.Len(), ma.count())
		}
		if a.Equal(b) != (*ma == *mb) {
			t.Fatalf("%v Equal %v = %v", a, b, a.Equal(b))
		}
		for range 20 {
			p := uint16(w.base + rng.IntN(w.width))
			if a.Contains(p) != ma.has(int(p)) {
				t.Fatalf("%v.Contains(%d)", a, p)
			}
			r := Range{p, p + uint16(rng.IntN(min(20, 65535-int(p)+1)))}
			in := true
			for q := int(r.Begin); q <= int(r.End); q++ {
				in = in && ma.has(q)
			}
			if a.ContainsRange(r) != in {
				t.Fatalf("%v.ContainsRange(%v) = %v", a, r, !in)
			}
		}
		// Printing and parsing round-trip (port 0 cannot be parsed).
		if !a.Contains(0) {
			back, err := ParseSet(a.String())
			if err != nil || !back.Equal(a) {
				t.Fatalf("round trip of %q: %v, %v", a, back, err)
			}
		}
	}
}

func TestSetJSON(t *testing.T) {
	type cfg struct {
		Static Set  `json:"static"`
		Eph    *Set `json:"eph,omitempty"`
	}
	in := cfg{Static: MustParseSet("31000-31999,32500")}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"static":"31000-31999,32500"}` {
		t.Fatalf("Marshal = %s", b)
	}
	var out cfg
	if err := json.Unmarshal(b, &out); err != nil || !out.Static.Equal(in.Static) {
		t.Fatalf("Unmarshal = %v, %v", out, err)
	}
	if b, _ := json.Marshal(Set{}); string(b) != `""` {
		t.Fatalf("empty set marshals as %s", b)
	}
	err = json.Unmarshal([]byte(`{"static":"5-3"}`), &out)
	if err == nil || !strings.Contains(err.Error(), `"5-3"`) {
		t.Fatalf("bad set: %v", err)
	}
	if err := json.Unmarshal([]byte(`{"static":[1,2]}`), &out); err == nil {
		t.Fatal("non-string accepted")
	}
	var s Set
	if err := s.UnmarshalText([]byte("1-3")); err != nil || s.String() != "1-3" {
		t.Fatalf("UnmarshalText: %v %v", s, err)
	}
	if err := s.UnmarshalText([]byte("x")); err == nil || s.String() != "1-3" {
		t.Fatalf("failed UnmarshalText changed the set: %v %v", s, err)
	}
}

func TestRange(t *testing.T) {
	for _, tc := range []struct {
		r       Range
		aligned bool
		mask    uint16
	}{
		{Range{31232, 31487}, true, 0xff00},
		{Range{0, 65535}, true, 0},
		{Range{32768, 65535}, true, 0x8000},
		{Range{5, 5}, true, 0xffff},
		{Range{31000, 31255}, false, 0},
		{Range{0, 2}, false, 0},
		{Range{3, 1}, false, 0},
	} {
		if tc.r.IsAligned() != tc.aligned {
			t.Errorf("%v.IsAligned() = %v", tc.r, !tc.aligned)
		}
		if tc.aligned && tc.r.Mask() != tc.mask {
			t.Errorf("%v.Mask() = %#x, want %#x", tc.r, tc.r.Mask(), tc.mask)
		}
	}
	if (Range{3, 1}).Size() != 0 || (Range{3, 1}).Contains(2) {
		t.Error("reversed range size")
	}
}

func TestPortSet(t *testing.T) {
	for _, c := range []struct {
		ports []uint16
		want  string
	}{
		{nil, ""},
		{[]uint16{80}, "80"},
		{[]uint16{82, 80, 81, 80, 9000}, "80-82,9000"},
	} {
		if got := PortSet(c.ports...); got.String() != c.want || !got.Equal(MustParseSet(c.want)) {
			t.Errorf("PortSet(%v) = %q, want %q", c.ports, got, c.want)
		}
	}
}
