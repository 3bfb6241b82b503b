package metrics

import (
	"testing"

	"github.com/isolatord/isolatord/netns/neighsync"
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
		return neighsync.Stats{Asked: 1, Pushed: 2, Deleted: 3, Kicks: 4, Errors: 5, Refused: 6, Resyncs: 7, Throttled: 8}
	})
	f = scrape(t, m.Handler())
	for i, s := range neighbourSeries {
		if v := f.value(t, Namespace+"_"+s.name); v != float64(i+1) {
			t.Errorf("%s = %v, want %d", s.name, v, i+1)
		}
	}
}
