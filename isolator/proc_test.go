package isolator

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestProcStart: the start time of a process is field 22 of its stat file,
// read past a command name holding spaces and parentheses; a gone process
// is not found, and a stat file longer than the first read is read whole.
func TestProcStart(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep:", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat")
	if err != nil {
		t.Skip("no procfs:", err)
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	want, _ := strconv.ParseUint(fields[19], 10, 64)
	if got, err := procStart("/proc", cmd.Process.Pid); err != nil || got != want {
		t.Fatalf("procStart: %d, %v; want %d", got, err, want)
	}

	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "7"), 0o755); err != nil {
		t.Fatal(err)
	}
	long := "7 (a ) b" + strings.Repeat("x", 900) + ") S" + strings.Repeat(" 1", 18) + " 4242 1 2\n"
	if err := os.WriteFile(filepath.Join(root, "7", "stat"), []byte(long), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := procStart(root, 7); err != nil || got != 4242 {
		t.Fatalf("procStart of a long stat: %d, %v; want 4242", got, err)
	}
	if _, err := procStart(root, 8); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("procStart of a gone process: %v, want not found", err)
	}
}
