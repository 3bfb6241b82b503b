package main

import (
	"os"
	"testing"
)

// TestMain lets the test binary act as the separate reader, as isobench
// does (readprobe.go): the control phase starts os.Executable() with
// readProbeCmd.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == readProbeCmd {
		os.Exit(readProbeMain(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
