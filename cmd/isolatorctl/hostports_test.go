package main

import (
	"bytes"
	"strings"
	"testing"

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
)

func TestStatusHostPorts(t *testing.T) {
	h := &isolatordv1.HostPortReservations{Enabled: true, Reserved: 3, Conflicts: []*isolatordv1.HostPortConflict{
		{Port: 31001, Holder: "port 31001 is held on the host by nginx (pid 7): TCP listening on 0.0.0.0:31001"}}}
	for _, c := range []struct {
		h    *isolatordv1.HostPortReservations
		want []string
	}{
		{nil, []string{"Host port reservations:  off"}},
		{&isolatordv1.HostPortReservations{Enabled: true, Reserved: 1}, []string{"Host port reservations:  1 port held", "Host port conflicts:     none"}},
		{h, []string{"Host port reservations:  3 ports held", "Host port conflicts:     1 (host processes", "31001:", "nginx (pid 7)"}},
	} {
		var b bytes.Buffer
		tw := newTable(&b)
		writeHostPorts(tw, c.h)
		tw.Flush()
		for _, w := range c.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("status table for %v:\n%s\ndoes not say %q", c.h, b.String(), w)
			}
		}
	}
	js := toHostPortsJSON(h)
	if !js.Enabled || js.Reserved != 3 || len(js.Conflicts) != 1 || js.Conflicts[0].Port != 31001 || !strings.Contains(js.Conflicts[0].Holder, "nginx") {
		t.Errorf("json: %+v", js)
	}
	if js := toHostPortsJSON(nil); js.Conflicts == nil || js.Enabled {
		t.Errorf("json of nothing: %+v (conflicts must be [] not null)", js)
	}
}
