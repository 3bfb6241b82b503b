package isolator

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/isolatortest"
)

type fakeDP = isolatortest.DataPlane

func newFakeDP() *fakeDP { return isolatortest.New() }

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
