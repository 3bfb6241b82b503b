package metrics

import (
	"errors"
	"testing"
)

func TestIPv6ToHostSeries(t *testing.T) {
	name := Namespace + "_ipv6_to_host_packets_total"
	m := New("test")
	if v := scrape(t, m.Handler()).value(t, name); v != 0 {
		t.Errorf("%s = %v before WatchIPv6ToHost, want 0", name, v)
	}
	n, err := uint64(7), error(nil)
	m.WatchIPv6ToHost(func() (uint64, error) { return n, err })
	if v := scrape(t, m.Handler()).value(t, name); v != 7 {
		t.Errorf("%s = %v, want 7", name, v)
	}
	// a restarted demux starts from zero, a failed read says nothing:
	// the counter never goes back
	n = 2
	if v := scrape(t, m.Handler()).value(t, name); v != 7 {
		t.Errorf("%s = %v after the source went back, want 7", name, v)
	}
	n, err = 100, errors.New("dump failed")
	if v := scrape(t, m.Handler()).value(t, name); v != 7 {
		t.Errorf("%s = %v after a failed read, want 7", name, v)
	}
}
