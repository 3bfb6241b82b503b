package isolator

import (
	"testing"
	"time"
)

func TestOtherPin(t *testing.T) {
	own := Record{Mount: "/nonexistent-dir/c1", PinOwned: true}
	theirs := Record{Mount: "/nonexistent-dir/c1", PinOwned: false}
	for _, c := range []struct {
		points []string
		r      Record
		want   bool
	}{
		{nil, own, false},
		{[]string{"/nonexistent-dir/c1"}, own, false},
		{[]string{"/nonexistent-dir/c1", "/run/netns/cni-1234"}, own, true},
		{[]string{"/nonexistent-dir/c1"}, theirs, true}, // a pin isolatord does not own is the runtime's
		{[]string{"/elsewhere/c1"}, own, true},
	} {
		if got := otherPin(c.points, c.r); got != c.want {
			t.Errorf("otherPin(%v, owned=%v) = %v, want %v", c.points, c.r.PinOwned, got, c.want)
		}
	}
}

func TestOrphanPeriod(t *testing.T) {
	for grace, want := range map[time.Duration]time.Duration{
		30 * time.Second:       7500 * time.Millisecond,
		time.Second:            250 * time.Millisecond,
		100 * time.Millisecond: 250 * time.Millisecond,
		10 * time.Minute:       10 * time.Second,
	} {
		if got := orphanPeriod(grace); got != want {
			t.Errorf("orphanPeriod(%v) = %v, want %v", grace, got, want)
		}
	}
}

// BenchmarkOrphanScan is the cost of one look for orphans on this machine:
// the /proc scan (processes, or every thread for the check before acting),
// whatever the number of containers.
func BenchmarkOrphanScan(b *testing.B) {
	for _, threads := range []bool{false, true} {
		name := "processes"
		if threads {
			name = "threads"
		}
		b.Run(name, func(b *testing.B) {
			n := 0
			for i := 0; i < b.N; i++ {
				n = 0
				if err := nsInProcesses("/proc", threads, func(uint64) { n++ }); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n), "entries")
		})
	}
}
