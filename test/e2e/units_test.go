package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSystemdUnits: packaging/isolatord.service and isolatord.socket pass
// systemd-analyze verify (with ExecStart pointed at the built binary), the
// service takes its socket from the socket unit, and it is ordered before
// the runtimes that call it.
func TestSystemdUnits(t *testing.T) {
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (package systemd)")
	}
	dir := t.TempDir()
	svc, err := os.ReadFile(filepath.Join(repoRoot(), "packaging", "isolatord.service"))
	if err != nil {
		t.Fatal(err)
	}
	sock, err := os.ReadFile(filepath.Join(repoRoot(), "packaging", "isolatord.socket"))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(Binaries(t), "isolatord")
	local := strings.Replace(string(svc), "/usr/local/bin/isolatord", bin, 1)
	if err := os.WriteFile(filepath.Join(dir, "isolatord.service"), []byte(local), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "isolatord.socket"), sock, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tool, "verify", filepath.Join(dir, "isolatord.socket"), filepath.Join(dir, "isolatord.service")).CombinedOutput()
	// Units the machine lacks (containerd.service, ...) are fine in
	// Before=; anything about ours is not.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "isolatord") {
			t.Errorf("systemd-analyze verify: %s", line)
		}
	}
	if err != nil && t.Failed() {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, want := range []string{"containerd.service", "podman.service", "nomad.service", "docker.service"} {
		if !regexp.MustCompile(`(?m)^Before=.*\b` + regexp.QuoteMeta(want)).Match(svc) {
			t.Errorf("isolatord.service is not ordered Before=%s", want)
		}
	}
	if !regexp.MustCompile(`(?m)^Requires=isolatord\.socket`).Match(svc) {
		t.Error("isolatord.service does not require isolatord.socket")
	}
	if !regexp.MustCompile(`(?m)^ListenStream=/run/isolatord/isolatord\.sock$`).Match(sock) {
		t.Error("isolatord.socket does not listen on the default socket")
	}
}
