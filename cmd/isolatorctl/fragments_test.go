package main

import (
	"bytes"
	"strings"
	"testing"

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
)

func TestStatusFragments(t *testing.T) {
	for _, c := range []struct {
		f        *isolatordv1.FragmentSteering
		want     []string
		wantNone bool
	}{
		{nil, nil, true},
		{&isolatordv1.FragmentSteering{}, []string{"Fragments:", "not steered", "stay with the host"}, false},
		{&isolatordv1.FragmentSteering{Enabled: true, SteeredIpv4: 90, SteeredIpv6: 12, ToHostIpv4: 4, ToHostIpv6: 1,
			TableEvictions: 7, TableEntries: 30, TableSize: 8192},
			[]string{"Fragments steered:       102 (IPv4 90, IPv6 12)", "Fragments left to host:  5 (IPv4 4, IPv6 1)",
				"Fragment table:          30 datagrams, 7 evicted (size 8192 per family)"}, false},
	} {
		var b bytes.Buffer
		tw := newTable(&b)
		writeFragments(tw, c.f)
		tw.Flush()
		if c.wantNone && b.Len() != 0 {
			t.Errorf("status of a daemon without fragment steering says %q", b.String())
		}
		for _, w := range c.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("status table for %v:\n%s\ndoes not say %q", c.f, b.String(), w)
			}
		}
	}
}
