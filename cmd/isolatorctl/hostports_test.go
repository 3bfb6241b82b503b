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
	js := decodeJSON[statusJSON](t, jsonString(t, statusResult{&isolatordv1.StatusResponse{HostPorts: h}}))
	if hp := js.HostPorts; !hp.Enabled || hp.Reserved != 3 || len(hp.Conflicts) != 1 || hp.Conflicts[0].Port != 31001 || !strings.Contains(hp.Conflicts[0].Holder, "nginx") {
		t.Errorf("json: %+v", hp)
	}
	none := decodeJSON[map[string]any](t, jsonString(t, statusResult{&isolatordv1.StatusResponse{HostPorts: &isolatordv1.HostPortReservations{}}}))
	if hp, _ := none["host_ports"].(map[string]any); hp == nil || hp["conflicts"] == nil || hp["enabled"] != false {
		t.Errorf("json of nothing: %v (conflicts must be [] not null)", none["host_ports"])
	}
}
