package main

import (
	"io"
	"strings"
	"testing"
)

func TestCNIBreakdown(t *testing.T) {
	c := &ControlScale{
		CNIAdd: &Latency{P50Ms: 12}, CNIAddRPC: &Latency{P50Ms: 7.5},
		CNIDel: &Latency{P50Ms: 6}, CNIDelRPC: &Latency{P50Ms: 2},
		CNIExec: &Latency{P50Ms: 3}, CtlList: &Latency{P50Ms: 4, P99Ms: 9},
	}
	got := c.cniBreakdown()
	for _, want := range []string{
		"plugin exec to VERSION result 3.00 ms",
		"ADD 12.0 = daemon Attach 7.50 + plugin 4.50 ms",
		"DEL 6.00 = daemon Cleanup 2.00 + plugin 4.00 ms",
		"isolatorctl list 4.00 / 9.00 ms",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("breakdown %q lacks %q", got, want)
		}
	}
	if got := (&ControlScale{CNIAdd: &Latency{P50Ms: 12}}).cniBreakdown(); got != "n/a" {
		t.Errorf("breakdown without the direct calls = %q, want n/a", got)
	}
}

func TestOnlyCNI(t *testing.T) {
	o, err := parseFlags([]string{"--only", "cni"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for phase, want := range map[string]bool{"prepare": true, "cni": true, "control": false, "daemons": false} {
		if got := o.runs(phase); got != want {
			t.Errorf("--only cni runs %s: %v, want %v", phase, got, want)
		}
	}
	if (Config{Only: []string{"cni"}}).ranBase() {
		t.Error("--only cni counts the base phases as run")
	}
}
