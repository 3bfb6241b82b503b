package isolator

import (
	"os"
	"path/filepath"
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
		if got := otherPin(c.points, c.r, map[string]string{}); got != c.want {
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

// TestOrphanedByPid: a container isolated by pid whose process is in its
// namespace is not an orphan; one whose process is gone, or is now in
// another namespace, is, when no other process or pin holds it.
func TestOrphanedByPid(t *testing.T) {
	proc := filepath.Join(fakeNSDir, "proc-"+t.Name())
	mk := func(pid string) {
		if err := os.MkdirAll(filepath.Join(proc, pid, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		// field 22 (start time) is 7
		stat := pid + " (sleep) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 7 0 0"
		if err := os.WriteFile(filepath.Join(proc, pid, "stat"), []byte(stat), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "ns", "net"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, pid := range []string{"100", "200", "300"} {
		mk(pid)
	}
	dp := newFakeDP()
	cfg := testConfig(t, t.TempDir())
	cfg.ProcRoot = proc
	s, err := New(cfg, dp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Start(bg); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"alive", "gone", "moved"} {
		if _, err := s.Prepare(bg, id, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Isolate(bg, id, IsolateTarget{Pid: 100 * (i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.orphaned(false); len(got) != 0 {
		t.Fatalf("orphans while every process is in its namespace: %v", got)
	}
	// pid 300 moves to a namespace of its own; pid 200 ends. The new file
	// is made before any old one is removed, then renamed over its old
	// one: a file removed first could give the new one its inode number
	// (300's own, or 200's), so the move or the end went unseen.
	moved := filepath.Join(proc, "300", "ns", "net")
	if err := os.WriteFile(moved+".new", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(moved+".new", moved); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(proc, "200")); err != nil {
		t.Fatal(err)
	}
	for _, threads := range []bool{false, true} {
		got := s.orphaned(threads)
		if _, ok := got["alive"]; ok || len(got) != 2 || got["gone"].ID != "gone" || got["moved"].ID != "moved" {
			t.Fatalf("orphaned(threads=%v) = %v, want gone and moved", threads, got)
		}
	}
}
