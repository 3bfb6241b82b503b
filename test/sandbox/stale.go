package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// RegistryDir records which process owns each live sandbox, so that a
// sandbox whose test process died without cleaning up (killed, `go test`
// timeout) is deleted by the next sandbox created on the machine. Only
// namespaces named in this registry whose owner is gone are ever removed.
const RegistryDir = "/run/isolatord-sandbox"

// lockRegistry serialises namespace-directory setup and stale sweeps among
// sandbox users (flock on RegistryDir/.lock). The returned func unlocks.
func lockRegistry() (func(), error) {
	if err := os.MkdirAll(RegistryDir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(RegistryDir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// ProcessStart returns the start time (clock ticks since boot, field 22 of
// /proc/<pid>/stat) of pid, which together with pid identifies a process.
func ProcessStart(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	// The command name (field 2) may contain spaces; fields after ')' are plain.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", errors.New("short stat")
	}
	return f[19], nil // field 22 overall; f[0] is field 3
}

// register records this process as the owner of sandbox name.
func register(name string) error {
	pid := os.Getpid()
	st, err := ProcessStart(pid)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(RegistryDir, name), []byte(fmt.Sprintf("%d %s\n", pid, st)), 0o644)
}

func unregister(name string) {
	os.Remove(filepath.Join(RegistryDir, name))
}

// sweepStale deletes the namespaces of registered sandboxes whose owner
// process no longer exists. Called with the registry locked.
func sweepStale() {
	ents, err := os.ReadDir(RegistryDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(RegistryDir, name))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		if st, err := ProcessStart(pid); err == nil && st == f[1] {
			continue // owner alive
		}
		for _, suffix := range []string{"-host", "-client"} {
			n := NS{Name: name + suffix, Path: filepath.Join(NetnsDir, name+suffix)}
			deleteNamedNS(n)
		}
		unregister(name)
	}
}
