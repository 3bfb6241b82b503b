package main

import (
	"bytes"
	"testing"
)

// TestVersionFlag: --version prints the version and makes no call (the
// socket named does not exist).
func TestVersionFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--socket", "/nonexistent/isolatord.sock", "--version"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if got, want := out.String(), "isolatorctl "+version+"\n"; got != want {
		t.Errorf("--version printed %q, want %q", got, want)
	}
}
