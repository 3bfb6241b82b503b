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
	m.WatchNeighbours(func() neighsync.Stats { return neighsync.Stats{Asked: 5, Pushed: 4, Deleted: 3, Kicks: 2, Errors: 1} })
	f = scrape(t, m.Handler())
	for i, s := range neighbourSeries {
		if v := f.value(t, Namespace+"_"+s.name); v != float64(5-i) {
			t.Errorf("%s = %v, want %d", s.name, v, 5-i)
		}
	}
}
