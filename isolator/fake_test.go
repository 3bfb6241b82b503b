package isolator

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/isolatortest"
)

type fakeDP = isolatortest.DataPlane

// fakeNSDir holds files that unit tests use as distinct "network
// namespaces" (they cannot create real ones without root).
var fakeNSDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "isolator-fakens-")
	if err != nil {
		panic(err)
	}
	fakeNSDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// nsTarget returns an isolate target that is a distinct fake namespace.
func nsTarget(t testing.TB, name string) IsolateTarget {
	p := filepath.Join(fakeNSDir, name)
	if _, err := os.Stat(p); err != nil {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return IsolateTarget{NetNSPath: p}
}

func newFakeDP() *fakeDP {
	dp := isolatortest.New()
	dp.NSDir = fakeNSDir
	return dp
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testConfig(t testing.TB, dir string) Config {
	return Config{
		ManagedPorts:  ephemeral.MustParseSet("31000-31999"),
		EphemeralPool: ephemeral.MustParseSet("32768-33791"), // 4 blocks of 256
		BlockSize:     256,
		HostLocal:     ephemeral.Range{Begin: 61000, End: 61999},
		StateDir:      dir,
		Version:       "test",
		Logger:        quietLogger(),
	}
}

func newTestIsolator(t testing.TB, dir string, dp *fakeDP) *Isolator {
	t.Helper()
	s, err := New(testConfig(t, dir), dp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
