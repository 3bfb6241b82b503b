package traffic

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// TB is the part of testing.TB that BinaryPath needs (so this package does
// not import testing into the isotraffic binary).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// BinaryEnv names an environment variable that, when set, is used as the path
// of a prebuilt isotraffic binary instead of building one.
const BinaryEnv = "ISOTRAFFIC_BIN"

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// BinaryPath returns the path of an isotraffic binary (test/cmd/isotraffic),
// building it with `go build` once per test process. The binary goes to
// $TMPDIR/isolatord-isotraffic-<hash of this checkout>/isotraffic, replaced
// atomically, so concurrent test processes and stale copies are harmless.
func BinaryPath(t TB) string {
	t.Helper()
	binOnce.Do(func() { binPath, binErr = buildBinary() })
	if binErr != nil {
		t.Fatalf("isotraffic binary: %v", binErr)
	}
	return binPath
}

func buildBinary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w", BinaryEnv, err)
		}
		return p, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		// go test puts the toolchain's bin on PATH; this is for odd setups.
		goBin = "/usr/local/go/bin/go"
	}
	// The module root is two directories above this file (test/traffic/).
	_, file, _, ok := runtime.Caller(0)
	var modRoot string
	if ok {
		if d := filepath.Join(filepath.Dir(file), "..", ".."); fileExists(filepath.Join(d, "go.mod")) {
			modRoot = filepath.Clean(d)
		}
	}
	pkg := "github.com/isolatord/isolatord/test/cmd/isotraffic"
	sum := sha256.Sum256([]byte(modRoot + "|" + pkg))
	dir := filepath.Join(os.TempDir(), "isolatord-isotraffic-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "isotraffic.*.tmp")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command(goBin, "build", "-o", tmp.Name(), pkg)
	cmd.Dir = modRoot // empty: the test's working directory, inside the module
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	final := filepath.Join(dir, "isotraffic")
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", err
	}
	return final, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
