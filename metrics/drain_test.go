package metrics

import "testing"

func TestDrainSeries(t *testing.T) {
	ports, flows := Namespace+"_draining_ports", Namespace+"_draining_live_flows"
	m := New("test")
	if v := scrape(t, m.Handler()).value(t, ports); v != 0 {
		t.Errorf("%s = %v before WatchDrains, want 0", ports, v)
	}
	m.WatchDrains(func() (int, int) { return 2, 41 })
	s := scrape(t, m.Handler())
	if v := s.value(t, ports); v != 2 {
		t.Errorf("%s = %v, want 2", ports, v)
	}
	if v := s.value(t, flows); v != 41 {
		t.Errorf("%s = %v, want 41", flows, v)
	}
}
