package isolator

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

// nopDP is a data plane whose Setup and Teardown do nothing (the fake's
// bookkeeping of ports grows with the containers present).
type nopDP struct{ *fakeDP }

func (nopDP) Setup(ctx context.Context, c plane.Container) (plane.Plumbing, error) {
	return plane.Plumbing{Veth: plane.VethName(c.ID), Mount: "/fake/netns/" + c.ID, PinOwned: true}, nil
}

func (nopDP) Teardown(ctx context.Context, c plane.Container) (plane.TeardownReport, error) {
	return plane.TeardownReport{}, nil
}

// BenchmarkSetupTeardown is the lifecycle's own cost of one container's
// Prepare, Isolate and Cleanup, with present containers already isolated:
// bookkeeping and the state on disk (fsynced), the data plane doing
// nothing.
func BenchmarkSetupTeardown(b *testing.B) {
	for _, present := range []int{0, 800} {
		b.Run(fmt.Sprintf("present=%d", present), func(b *testing.B) {
			dp := nopDP{newFakeDP()}
			cfg := testConfig(b, b.TempDir())
			cfg.EphemeralPool = ephemeral.MustParseSet("32768-60927") // 882 blocks of 32
			cfg.BlockSize = 32
			s, err := New(cfg, dp)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if _, err := s.Start(bg); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < present; i++ {
				id := fmt.Sprintf("p%04d", i)
				if _, err := s.Prepare(bg, id, nil); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Isolate(bg, id, nsTarget(b, id)); err != nil {
					b.Fatal(err)
				}
			}
			target := nsTarget(b, "x")
			cpu0 := cpuTime(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := s.Prepare(bg, "x", ports("31000")); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Isolate(bg, "x", target); err != nil {
					b.Fatal(err)
				}
				if err := s.Cleanup(bg, "x"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuTime is the CPU time (user and system) the process used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
