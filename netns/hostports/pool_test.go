package hostports

import (
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
)

func TestMergeReserved(t *testing.T) {
	for _, c := range []struct{ cur, prev, pool, next, ours string }{
		{"", "", "100-199", "100-199", "100-199"},
		{"150", "", "100-199", "100-199", "100-149,151-199"},
		{"100-199", "100-199", "300-399", "300-399", "300-399"},
		{"50,100-199", "100-199", "150-249", "50,150-249", "150-249"},
		{"", "100-199", "100-199", "100-199", "100-199"}, // someone removed ours: put back
	} {
		next, ours := MergeReserved(ephemeral.MustParseSet(c.cur), ephemeral.MustParseSet(c.prev), ephemeral.MustParseSet(c.pool))
		if next.String() != c.next || ours.String() != c.ours {
			t.Errorf("MergeReserved(%q, %q, %q) = %q, %q; want %q, %q", c.cur, c.prev, c.pool, next, ours, c.next, c.ours)
		}
	}
}
