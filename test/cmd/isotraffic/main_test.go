package main_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/traffic"
)

// freePort returns a port free on 127.0.0.1 for both TCP and UDP right now.
func freePort(t *testing.T) string {
	t.Helper()
	for i := 0; i < 20; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err == nil {
			u.Close()
			return addr
		}
	}
	t.Fatal("no free port")
	return ""
}

// startServe runs `isotraffic serve` and waits for its "ready" line.
func startServe(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- true
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("serve exited without printing ready")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not print ready")
	}
	return cmd
}

func run(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, args...).Output()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out)), code
}

func TestServeEchoAndBench(t *testing.T) {
	bin := traffic.BinaryPath(t)
	addr := freePort(t)
	srv := startServe(t, bin, "--tcp", addr, "--udp", addr, "--name", "web")

	for _, network := range []string{"tcp", "udp"} {
		out, code := run(t, bin, "echo", "--net", network, "--addr", addr, "--msg", "hi there", "--timeout", "2s")
		if code != 0 || out != "web hi there" {
			t.Errorf("echo %s: %q exit %d", network, out, code)
		}
	}
	for _, test := range []string{"rr", "crr", "bulk"} {
		out, code := run(t, bin, test, "--addr", addr, "--dur", "100ms")
		var res struct {
			Test string
			Rate float64
			Unit string
		}
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Test != test || res.Rate <= 0 || res.Unit == "" {
			t.Errorf("%s: %q exit %d", test, out, code)
		}
	}
	if out, code := run(t, bin, "rr", "--net", "udp", "--addr", addr, "--dur", "100ms"); code != 0 || !strings.Contains(out, `"net":"udp"`) {
		t.Errorf("udp rr: %q exit %d", out, code)
	}

	// SIGTERM ends serve cleanly; afterwards echo fails with exit 1.
	srv.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve after SIGTERM: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve ignored SIGTERM")
	}
	if out, code := run(t, bin, "echo", "--net", "tcp", "--addr", addr, "--timeout", "1s"); code != 1 {
		t.Errorf("echo to a stopped server: %q exit %d, want 1", out, code)
	}
}

func TestReuseportServers(t *testing.T) {
	bin := traffic.BinaryPath(t)
	addr := freePort(t)
	startServe(t, bin, "--tcp", addr, "--name", "a", "--reuseport")
	startServe(t, bin, "--tcp", addr, "--name", "b", "--reuseport")
	seen := map[string]bool{}
	for i := 0; i < 64 && len(seen) < 2; i++ {
		out, code := run(t, bin, "echo", "--addr", addr, "--msg", "x")
		if code != 0 {
			t.Fatalf("echo exit %d", code)
		}
		seen[traffic.ReplyName(out)] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("connections reached only %v", seen)
	}
}

func TestEchoFromSource(t *testing.T) {
	bin := traffic.BinaryPath(t)
	addr := freePort(t)
	startServe(t, bin, "--tcp", addr, "--name", "s")
	if out, code := run(t, bin, "echo", "--addr", addr, "--src", "127.0.0.9:0"); code != 0 || out != "s hello" {
		t.Errorf("echo --src: %q exit %d", out, code)
	}
	if _, code := run(t, bin, "echo", "--addr", addr, "--src", "198.18.77.77:0", "--timeout", "1s"); code != 1 {
		t.Errorf("echo from an address we do not have: exit %d, want 1", code)
	}
}

func TestPing(t *testing.T) {
	if testing.Short() {
		t.Skip("needs root (raw ICMP socket): not a unit test (-short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: raw ICMP socket")
	}
	bin := traffic.BinaryPath(t)
	out, code := run(t, bin, "ping", "--dst", "127.0.0.1", "--count", "2")
	var res traffic.PingResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || !res.ExactlyOnce() || res.Sent != 2 {
		t.Errorf("ping: %q exit %d", out, code)
	}
}

func TestUsageErrors(t *testing.T) {
	bin := traffic.BinaryPath(t)
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"echo", "--bogus"},
		{"serve", "extra-arg", "--tcp", ":0"},
	} {
		if _, code := run(t, bin, args...); code != 2 {
			t.Errorf("isotraffic %v: exit %d, want 2", args, code)
		}
	}
	for _, args := range [][]string{
		{"echo"},                   // no --addr
		{"serve"},                  // nothing to serve
		{"ping", "--dst", "no-ip"}, // not an address
		{"rr", "--addr", "x", "--dur", "0s"},
	} {
		if _, code := run(t, bin, args...); code != 1 {
			t.Errorf("isotraffic %v: exit %d, want 1", args, code)
		}
	}
}
