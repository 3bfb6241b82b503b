package main

import (
	"strings"
	"testing"

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
	"google.golang.org/protobuf/proto"
)

func TestLimitFlags(t *testing.T) {
	sock, fake := startFake(t)

	out := mustCtl(t, sock, "prepare", "c1", "--ports", "31000", "--egress-rate-limit", "10MB/s", "--egress-burst", "256KiB",
		"--ingress-rate-limit", "100Mbit", "--ingress-ceil", "200mbps")
	want := &isolatordv1.PrepareRequest{ContainerId: "c1", Ports: portRanges(t, "31000"),
		EgressLimit:  &isolatordv1.BandwidthLimit{Rate: 10_000_000, Burst: 256 << 10},
		IngressLimit: &isolatordv1.BandwidthLimit{Rate: 12_500_000, Ceil: 25_000_000}}
	if got := fake.lastRequest(); !proto.Equal(got, want) {
		t.Errorf("daemon got %v, want %v", got, want)
	}
	if got := tableValue(t, out, "Egress limit"); got != "10MB/s (80Mbit/s), burst 256KiB" {
		t.Errorf("Egress limit: %q", got)
	}
	if got := tableValue(t, out, "Ingress limit"); got != "12.5MB/s (100Mbit/s), ceil 25MB/s" {
		t.Errorf("Ingress limit: %q", got)
	}
	js := decodeJSON[containerJSON](t, mustCtl(t, sock, "get", "c1", "-o", "json"))
	if js.EgressLimit == nil || *js.EgressLimit != (limitJSON{Rate: 10_000_000, Burst: 256 << 10}) || js.IngressLimit.Ceil != 25_000_000 {
		t.Errorf("get -o json limits: %+v %+v", js.EgressLimit, js.IngressLimit)
	}

	// explicit none overrides the daemon's default; no flag sends nothing
	mustCtl(t, sock, "prepare", "c2", "--egress-rate-limit", "none")
	if got := fake.lastRequest().(*isolatordv1.PrepareRequest); got.GetEgressLimit() == nil || got.GetEgressLimit().GetRate() != 0 || got.GetIngressLimit() != nil {
		t.Errorf("--egress-rate-limit none sent %v", got)
	}
	out = mustCtl(t, sock, "get", "c2")
	if got := tableValue(t, out, "Egress limit"); got != "none" {
		t.Errorf("c2 egress limit %q", got)
	}

	// limits-only update keeps the ports
	mustCtl(t, sock, "isolate", "c1", "--pid", "7")
	mustCtl(t, sock, "update", "c1", "--egress-rate-limit", "4MB/s")
	wantU := &isolatordv1.UpdateRequest{ContainerId: "c1", KeepPorts: true, EgressLimit: &isolatordv1.BandwidthLimit{Rate: 4_000_000}}
	if got := fake.lastRequest(); !proto.Equal(got, wantU) {
		t.Errorf("daemon got %v, want %v", got, wantU)
	}
	js = decodeJSON[containerJSON](t, mustCtl(t, sock, "get", "c1", "-o", "json"))
	if len(js.Ports) != 1 || js.EgressLimit.Rate != 4_000_000 {
		t.Errorf("after a limits-only update: %+v", js)
	}
	// ports and a removal together
	mustCtl(t, sock, "update", "c1", "--ports", "31001", "--ingress-rate-limit", "0")
	wantU = &isolatordv1.UpdateRequest{ContainerId: "c1", Ports: portRanges(t, "31001"), IngressLimit: &isolatordv1.BandwidthLimit{}}
	if got := fake.lastRequest(); !proto.Equal(got, wantU) {
		t.Errorf("daemon got %v, want %v", got, wantU)
	}

	// usage shows the shaping
	out = mustCtl(t, sock, "usage", "c1")
	if !strings.Contains(out, "SHAPING") || !strings.Contains(out, "egress") || !strings.Contains(out, "4MB/s (32Mbit/s)") ||
		!strings.Contains(out, "3000B/2p") {
		t.Errorf("usage table:\n%s", out)
	}
	found := false
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "ingress" && f[1] == "none" {
			found = true
		}
	}
	if !found {
		t.Errorf("usage table lacks the ingress none row:\n%s", out)
	}
	u := decodeJSON[usageJSON](t, mustCtl(t, sock, "usage", "c1", "-o", "json"))
	if u.EgressShaping == nil || u.EgressShaping.Drops != 3 || u.EgressShaping.Overlimits != 17 || u.EgressShaping.Limit.Rate != 4_000_000 || u.IngressShaping != nil {
		t.Errorf("usage -o json shaping: %+v %+v", u.EgressShaping, u.IngressShaping)
	}

	// status
	out = mustCtl(t, sock, "status")
	for label, want := range map[string]string{
		"Link speed":        "10000 Mbit/s",
		"Bandwidth shaping": "HTB with a bfifo queue",
		"Default limits":    "egress 2MB/s (16Mbit/s); ingress none",
	} {
		if got := tableValue(t, out, label); got != want {
			t.Errorf("status %s: %q, want %q", label, got, want)
		}
	}
	st := decodeJSON[statusJSON](t, mustCtl(t, sock, "status", "-o", "json"))
	if st.DefaultEgressLimit == nil || st.DefaultEgressLimit.Rate != 2_000_000 || st.DefaultIngressLimit != nil || st.LinkSpeedMbps != 10000 {
		t.Errorf("status -o json: %+v", st)
	}
}

func TestLimitFlagErrors(t *testing.T) {
	sock, fake := startFake(t)
	mustCtl(t, sock, "prepare", "c1")
	before := fake.requestCount()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"prepare", "c2", "--egress-rate-limit", "fast"}, []string{"--egress-rate-limit", `"fast"`, "10MB/s"}},
		{[]string{"prepare", "c2", "--ingress-rate-limit", "-5MB/s"}, []string{"--ingress-rate-limit", "negative"}},
		{[]string{"prepare", "c2", "--egress-burst", "1MB"}, []string{"--egress-burst and --egress-ceil need --egress-rate-limit"}},
		{[]string{"prepare", "c2", "--egress-rate-limit", "none", "--egress-ceil", "1MB/s"}, []string{"other than none"}},
		{[]string{"prepare", "c2", "--egress-rate-limit", "1MB/s", "--egress-burst", "8Mbit"}, []string{"--egress-burst", "unknown unit"}},
		{[]string{"update", "c1"}, []string{"--ports", "--egress-rate-limit"}},
		{[]string{"update", "c1", "--egress-ceil", "5MB/s"}, []string{"need --egress-rate-limit"}},
	} {
		_, errOut, code := ctl(append([]string{"--socket", sock}, c.args...)...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d", c.args, code, exitUsage)
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr %q does not say %q", c.args, errOut, w)
			}
		}
	}
	if n := fake.requestCount(); n != before {
		t.Errorf("bad flags reached the daemon (%d requests)", n-before)
	}
	// help explains RATE
	out, _, _ := ctl("help", "update")
	if !strings.Contains(out, "--egress-rate-limit RATE") || !strings.Contains(out, "RATE is bytes per second") {
		t.Errorf("help update:\n%s", out)
	}
}
