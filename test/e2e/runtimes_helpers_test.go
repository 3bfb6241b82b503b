package e2e

// Helpers of the real-runtime tests (podman_test.go, ctr_test.go): a busybox
// rootfs with a static isotraffic, the shipped example conflist pointed at
// the test's isolatord, and runtime state directories that are unmounted
// and removed even when a test fails.

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/netns/nspin"
)

// needTools skips the test, saying what is missing, unless every tool is
// on PATH (scripts/install-deps.sh installs them: make deps).
func needTools(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("real-runtime tests need root")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (make deps installs podman, containerd, runc, busybox-static, containernetworking-plugins): %v", tool, err)
		}
	}
}

var (
	staticOnce sync.Once
	staticBin  string
	staticErr  error
)

// staticIsotraffic builds isotraffic without cgo, so that it runs in a
// rootfs that has no C library.
func staticIsotraffic(t testing.TB) string {
	t.Helper()
	staticOnce.Do(func() {
		dir := filepath.Join(Binaries(t), "static")
		if staticErr = os.MkdirAll(dir, 0o755); staticErr != nil {
			return
		}
		staticBin = filepath.Join(dir, "isotraffic")
		cmd := exec.Command("go", "build", "-o", staticBin, "./test/cmd/isotraffic")
		cmd.Dir = repoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticErr = &buildError{err, out}
		}
	})
	if staticErr != nil {
		t.Fatal(staticErr)
	}
	return staticBin
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string {
	return "go build isotraffic: " + e.err.Error() + "\n" + string(e.out)
}

// buildRootfs makes a container root filesystem under dir: busybox (sh,
// sleep, ...) and /isotraffic. No registry, no image.
func buildRootfs(t testing.TB, dir string) string {
	t.Helper()
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "proc", "sys", "dev", "etc", "tmp", "run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, "/bin/busybox", filepath.Join(root, "bin", "busybox"))
	for _, applet := range []string{"sh", "sleep", "cat", "ls", "ip", "nc"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, staticIsotraffic(t), filepath.Join(root, "isotraffic"))
	os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\n"), 0o644)
	return root
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatalf("%v (busybox-static provides /bin/busybox)", err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// runtimeDir is a directory for a runtime's root and state. Unlike
// t.TempDir it is removed only after whatever the runtime left mounted
// under it is detached, and a failure to remove it is logged, not fatal.
func runtimeDir(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "isot-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unmountUnder(dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	ms, err := nspin.ReadMountInfo()
	if err != nil {
		return
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if p := ms[i].MountPoint; p == dir || strings.HasPrefix(p, dir+"/") {
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
		}
	}
}

// shippedConflist writes packaging/cni/10-isolator.conflist, unchanged
// except for the socket (the test's isolatord), into dir.
func shippedConflist(t *testing.T, dir, socket string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "packaging", "cni", "10-isolator.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.Replace(string(b), `"/run/isolatord/isolatord.sock"`, `"`+socket+`"`, 1)
	if conf == string(b) {
		t.Fatal("10-isolator.conflist has no default socket to replace")
	}
	p := filepath.Join(dir, "10-isolator.conflist")
	if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// runCmd runs a command with a deadline and returns its combined output.
func runCmd(timeout time.Duration, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	return out.String(), err
}
