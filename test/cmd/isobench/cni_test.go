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

func TestCNIBeforeTable(t *testing.T) {
	c := &ControlScale{
		CNIAdd: &Latency{P50Ms: 12}, CNIDel: &Latency{P50Ms: 6}, CNIExec: &Latency{P50Ms: 3},
		CNIBefore: &CNIBefore{Rev: "abc1234", Add: &Latency{P50Ms: 11}, Del: &Latency{P50Ms: 5}, Exec: &Latency{P50Ms: 2},
			PluginBytesBefore: 4_200_000, PluginBytesAfter: 9_800_000},
	}
	var b strings.Builder
	c.writeCNIBefore(&b)
	for _, want := range []string{
		"| CNI, p50 / p99 | before (abc1234) | after |",
		"| Plugin exec to VERSION result | 2.00 / 0.00 ms | 3.00 / 0.00 ms |",
		"| CNI ADD (libcni exec) | 11.0 / 0.00 ms | 12.0 / 0.00 ms |",
		"| isolator-cni size | 4.2 MB | 9.8 MB |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "isolatorctl") {
		t.Errorf("table has isolatorctl rows without their figures:\n%s", b.String())
	}
	b.Reset()
	(&ControlScale{}).writeCNIBefore(&b)
	if b.Len() != 0 {
		t.Errorf("table without an earlier build: %q", b.String())
	}
}
