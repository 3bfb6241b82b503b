package metrics

import (
	"testing"

	"github.com/isolatord/isolatord/neighsync"
)

func TestNeighbourSeries(t *testing.T) {
	m := New("test")
	f := scrape(t, m.Handler())
	for _, s := range neighbourSeries {
		if v := f.value(t, Namespace+"_"+s.name); v != 0 {
			t.Errorf("%s = %v before WatchNeighbours, want 0", s.name, v)
		}
	}
	m.WatchNeighbours(func() neighsync.Stats {
		return neighsync.Stats{Asked: 6, Pushed: 5, Deleted: 4, Kicks: 3, Errors: 2, Refused: 1}
	})
	f = scrape(t, m.Handler())
	for i, s := range neighbourSeries {
		if v := f.value(t, Namespace+"_"+s.name); v != float64(6-i) {
			t.Errorf("%s = %v, want %d", s.name, v, 6-i)
		}
	}
}
