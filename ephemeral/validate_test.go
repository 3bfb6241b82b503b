package ephemeral

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestCheckOverlap(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want string // "" = no error
	}{
		{"32768-33791", "31000-31999", ""},
		{"", "1-100", ""},
		{"1000-2047", "1-1023", "A 1000-2047 overlap B 1-1023 (shared: 1000-1023)"},
		{"31000-31999,40000-40999", "31500,50000", "A 31000-31999 overlap B 31500 (shared: 31500)"},
		{"1-10,20-30,40-50", "5-25,60", "A 1-10,20-30 overlap B 5-25 (shared: 5-10,20-25)"},
	} {
		err := CheckOverlap("A", MustParseSet(tc.a), "B", MustParseSet(tc.b))
		if tc.want == "" {
			if err != nil {
				t.Errorf("%q vs %q: %v", tc.a, tc.b, err)
			}
			continue
		}
		var oe *OverlapError
		if err == nil || err.Error() != tc.want || !errors.Is(err, ErrOverlap) || !errors.As(err, &oe) {
			t.Errorf("%q vs %q: %v, want %q", tc.a, tc.b, err, tc.want)
			continue
		}
		if !oe.Common.Equal(MustParseSet(tc.a).Intersect(MustParseSet(tc.b))) {
			t.Errorf("%q vs %q: Common %v", tc.a, tc.b, oe.Common)
		}
	}
}

func TestValidatePools(t *testing.T) {
	host := Range{32768, 60999}
	for _, tc := range []struct {
		eph, static string
		host        Range
		want        []string
	}{
		{"61000-65535", "31000-31999", host, nil},
		{"61440-65535", "", Range{1, 0}, nil}, // unknown host range
		{"1000-2047", "31000-31999", host, []string{"ephemeral ports 1000-2047 overlap well-known ports 0-1023 (shared: 1000-1023)"}},
		{"1-1023", "", host, []string{"ephemeral ports 1-1023 overlap well-known ports 0-1023 (shared: 1-1023)"}},
		{"61000-65535", "31000-31999,62000", host, []string{"ephemeral ports 61000-65535 overlap static ports 62000 (shared: 62000)"}},
		{"49152-65535", "31000-31999", host, []string{"ephemeral ports 49152-65535 overlap host ip_local_port_range 32768-60999 (shared: 49152-60999)"}},
		{"512-65535", "31000-31999", host, []string{
			"ephemeral ports 512-65535 overlap well-known ports 0-1023 (shared: 512-1023)",
			"ephemeral ports 512-65535 overlap static ports 31000-31999 (shared: 31000-31999)",
			"ephemeral ports 512-65535 overlap host ip_local_port_range 32768-60999 (shared: 32768-60999)",
		}},
	} {
		err := ValidatePools(MustParseSet(tc.eph), MustParseSet(tc.static), tc.host)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s/%s/%v: %v", tc.eph, tc.static, tc.host, err)
			}
			continue
		}
		if err == nil || err.Error() != strings.Join(tc.want, "\n") || !errors.Is(err, ErrOverlap) {
			t.Errorf("%s/%s/%v: %v, want %q", tc.eph, tc.static, tc.host, err, tc.want)
		}
	}
	if err := CheckWellKnown("static ports", MustParseSet("80,31000")); err == nil || !strings.Contains(err.Error(), "static ports 80 overlap well-known ports 0-1023") {
		t.Errorf("CheckWellKnown: %v", err)
	}
}

// TestCheckOverlapProperties: an error exactly when the sets intersect, and
// the ranges it names are ranges of each side that meet the other side.
func TestCheckOverlapProperties(t *testing.T) {
	rng := newRand(7)
	for i := range 1000 {
		w := windows[i%len(windows)]
		a, b := randomSet(rng, w.base, w.width, 5), randomSet(rng, w.base, w.width, 5)
		err := CheckOverlap("a", a, "b", b)
		if (err != nil) != a.Overlaps(b) {
			t.Fatalf("%v vs %v: %v", a, b, err)
		}
		var oe *OverlapError
		if !errors.As(err, &oe) {
			continue
		}
		for _, side := range []struct{ named, full, other Set }{{oe.A, a, b}, {oe.B, b, a}} {
			for _, r := range side.named.Ranges() {
				if !slices.Contains(side.full.Ranges(), r) || !side.other.Overlaps(NewSet(r)) {
					t.Fatalf("%v vs %v: named range %v", a, b, r)
				}
			}
			if !side.named.ContainsSet(oe.Common) {
				t.Fatalf("%v vs %v: named %v misses common %v", a, b, side.named, oe.Common)
			}
		}
	}
}
