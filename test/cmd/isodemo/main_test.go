package main

import (
	"bytes"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestDemo runs the whole demo against freshly built binaries and checks
// that it passes, shows every step and ends with a PASS verdict.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole demo (a few seconds plus a build); skipped with -short")
	}
	sandbox.RequireRoot(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "github.com/isolatord/isolatord/cmd/isolatord", "github.com/isolatord/isolatord/cmd/isolatorctl")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var out bytes.Buffer
	code := run([]string{"--bin", bin, "--isotraffic", traffic.BinaryPath(t), "--color", "never"}, &out)
	if code != 0 {
		t.Fatalf("demo exited %d:\n%s", code, out.String())
	}
	for i := 1; i <= 11; i++ {
		if !strings.Contains(out.String(), "== Step "+strconv.Itoa(i)+"/11: ") {
			t.Errorf("step %d missing from the output", i)
		}
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "VERDICT: PASS - every step worked") {
		t.Errorf("last line %q, want a PASS verdict", last)
	}
	for _, want := range []string{"beta  |", "gamma |", "LISTEN", "isolatord_", "failed: 0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestHistogram(t *testing.T) {
	got := histogram([]string{"beta", "gamma"}, map[string]int{"beta": 15, "gamma": 5}, 10)
	want := "beta  |##########| 15 ( 75%)\ngamma |####      |  5 ( 25%)\n"
	if got != want {
		t.Errorf("histogram:\n%s\nwant:\n%s", got, want)
	}
}

func TestWrap(t *testing.T) {
	got := wrap("one two three four", 9)
	if strings.Join(got, "|") != "one two|three|four" {
		t.Errorf("wrap: %q", got)
	}
}

func TestNewLinesAndTables(t *testing.T) {
	before := []string{"a", "b", "b"}
	after := []string{"b", "x: fh 200: ht divisor 64 ", "a", "b", "b", "x: fh 200::1 key ht 200 bkt 0 flowid 1:3"}
	extra := newLines(before, after, 10)
	rules, tables := splitTables(extra)
	if len(extra) != 3 || len(rules) != 2 || len(tables) != 1 || rules[0] != "b" {
		t.Errorf("extra %q, rules %q, tables %q", extra, rules, tables)
	}
}
