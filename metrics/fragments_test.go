package metrics

import "testing"

func TestFragmentSeries(t *testing.T) {
	m := New("test")
	steered := Namespace + "_fragments_steered_total"
	toHost := Namespace + "_fragments_to_host_total"
	if v := scrape(t, m.Handler()).value(t, steered, "family", "ipv4"); v != 0 {
		t.Errorf("%s = %v before WatchFragments, want 0", steered, v)
	}
	f := Fragments{Enabled: true, Steered4: 7, Steered6: 3, Host4: 2, Host6: 1, Evicted: 5, Entries: 9}
	m.WatchFragments(func() (Fragments, error) { return f, nil })
	fams := scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{steered, []string{"family", "ipv4"}, 7},
		{steered, []string{"family", "ipv6"}, 3},
		{toHost, []string{"family", "ipv4"}, 2},
		{toHost, []string{"family", "ipv6"}, 1},
		{Namespace + "_fragment_table_evictions_total", nil, 5},
		{Namespace + "_fragment_table_entries", nil, 9},
	} {
		if v := fams.value(t, c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	// a restarted daemon's tables may count from 0: counters never go back
	f = Fragments{Enabled: true, Steered4: 1}
	if v := scrape(t, m.Handler()).value(t, steered, "family", "ipv4"); v != 7 {
		t.Errorf("%s went back to %v, want 7", steered, v)
	}
}
