package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestListenUnixModesUnderUmask: with the unit's UMask=0077 the socket's
// directory is still 0750 and the socket 0660 (explicit chmods), so the
// group the operator gives the socket can reach it.
func TestListenUnixModesUnderUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "run", "isolatord")
	lis, err := listenUnix(filepath.Join(dir, "isolatord.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	for path, want := range map[string]os.FileMode{dir: 0o750, filepath.Join(dir, "isolatord.sock"): 0o660} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got != want {
			t.Errorf("%s: mode %o under umask 0077, want %o", path, got, want)
		}
	}
}

// TestVersionFlag: isolatord --version prints the version and exits 0
// without touching anything (the package's test runs the installed one).
func TestVersionFlag(t *testing.T) {
	if os.Getenv("ISOLATORD_VERSION_CHILD") == "1" {
		os.Exit(run([]string{"--version"}, os.Stderr))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestVersionFlag$")
	cmd.Env = append(os.Environ(), "ISOLATORD_VERSION_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("isolatord --version: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != "isolatord "+version {
		t.Errorf("isolatord --version printed %q, want %q", got, "isolatord "+version)
	}
}

// TestPackagedConfigFile: packaging/isolatord.conf (the package's
// /etc/isolatord/isolatord.conf) is a valid --config file that sets only
// settings that change at run time.
func TestPackagedConfigFile(t *testing.T) {
	o, err := parseFlags([]string{"--config", filepath.Join("..", "..", "packaging", "isolatord.conf")}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	c, fixed, err := applyConfigFile(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(fixed) > 0 {
		t.Errorf("packaging/isolatord.conf sets flags that do not change at run time: %v", fixed)
	}
	if c.logLevel != "info" {
		t.Errorf("log-level %q, want info", c.logLevel)
	}
}
