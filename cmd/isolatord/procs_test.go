package main

import (
	"log/slog"
	"runtime"
	"testing"
)

// spareProcs leaves more Ps than the writers can hold, and leaves a
// GOMAXPROCS the environment sets alone.
func TestSpareProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	log := slog.New(slog.DiscardHandler)

	t.Setenv("GOMAXPROCS", "3")
	runtime.GOMAXPROCS(3)
	spareProcs(log)
	if got := runtime.GOMAXPROCS(0); got != 3 {
		t.Errorf("GOMAXPROCS=3 in the environment: spareProcs made it %d", got)
	}

	t.Setenv("GOMAXPROCS", "")
	spareProcs(log)
	if got, want := runtime.GOMAXPROCS(0), cpus+defaultWrites(); got != want || got <= defaultWrites() {
		t.Errorf("GOMAXPROCS %d, want %d (cpus %d + writes %d)", got, want, cpus, defaultWrites())
	}
	if w := defaultWrites(); w != max(4, 2*cpus) {
		t.Errorf("writes %d after spareProcs, want %d: the bound follows the CPUs, not GOMAXPROCS", w, max(4, 2*cpus))
	}
}
