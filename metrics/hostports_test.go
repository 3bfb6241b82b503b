package metrics

import (
	"errors"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator"
)

type heldErr struct{}

func (heldErr) Error() string    { return "port 31005 is held on the host by nginx (pid 42)" }
func (heldErr) HeldPort() uint16 { return 31005 }

func TestHostPortSeries(t *testing.T) {
	m := New("test")
	f := scrape(t, m.Handler())
	for _, name := range []string{"isolatord_host_port_reservations", "isolatord_host_port_conflicts"} {
		if v := f.value(t, name); v != 0 {
			t.Errorf("%s = %v without a source", name, v)
		}
	}
	for _, op := range HostPortOps {
		if v := f.value(t, "isolatord_host_port_refusals_total", "op", op); v != 0 {
			t.Errorf("refusals{%s} = %v", op, v)
		}
	}

	src := &fakeSource{status: isolator.Status{HostPorts: isolator.HostPortsStatus{Enabled: true, Reserved: 12,
		Conflicts: []isolator.HostPortConflict{{Port: 31001, Holder: "x"}, {Port: 31002, Holder: "y"}}}}}
	m.WatchState(src, false)
	m.Operation("prepare", time.Millisecond, &isolator.Error{Msg: "ports: ...", Err: heldErr{}})
	m.Operation("update", time.Millisecond, errors.New("something else"))
	m.Operation("prepare", time.Millisecond, nil)
	f = scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"isolatord_host_port_reservations", nil, 12},
		{"isolatord_host_port_conflicts", nil, 2},
		{"isolatord_host_port_refusals_total", []string{"op", "prepare"}, 1},
		{"isolatord_host_port_refusals_total", []string{"op", "update"}, 0},
	} {
		if v := f.value(t, c.name, c.labels...); v != c.want {
			t.Errorf("%s%s = %v, want %v", c.name, fmtLabels(c.labels), v, c.want)
		}
	}
}
