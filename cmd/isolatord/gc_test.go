package main

import (
	"log/slog"
	"runtime/debug"
	"testing"
)

// tuneGC sets gcPercent, and leaves a GOGC the environment sets alone.
func TestTuneGC(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	log := slog.New(slog.DiscardHandler)

	t.Setenv("GOGC", "100")
	tuneGC(log)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=100 in the environment: tuneGC made it %d", got)
	}

	t.Setenv("GOGC", "")
	tuneGC(log)
	if got := debug.SetGCPercent(100); got != gcPercent {
		t.Errorf("GOGC %d, want %d", got, gcPercent)
	}
}
