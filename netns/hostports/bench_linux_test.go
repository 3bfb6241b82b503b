package hostports

import (
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/test/sandbox"
)

// BenchmarkReserveRelease: what a container's Prepare and Cleanup add for
// its static ports, from outside the host namespace (a thread switch per
// call, as in the sandboxes; a daemon in the host namespace skips it).
func BenchmarkReserveRelease(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(map[int]string{1: "1port", 16: "16ports"}[n], func(b *testing.B) {
			sb := sandbox.New(b)
			p, err := New(sb.Host.Path)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ports := ephemeral.NewSet(ephemeral.Range{Begin: 31000, End: uint16(31000 + n - 1)})
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := p.Reserve(ports); err != nil {
					b.Fatal(err)
				}
				p.Release(ports)
			}
		})
	}
}

// BenchmarkHolder: naming the holder of a refused port (sock_diag dump and
// a walk of /proc/*/fd): the cost of a refusal.
func BenchmarkHolder(b *testing.B) {
	sb := sandbox.New(b)
	p, err := New(sb.Host.Path)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ln := sb.StartHostProcess(b, "", "sleep", "infinity") // a process to find among others
	_ = ln
	other, err := New(sb.Host.Path)
	if err != nil {
		b.Fatal(err)
	}
	defer other.Close()
	if err := other.Reserve(ephemeral.MustParseSet("31500")); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.Holder(31500); err == nil {
			b.Fatal("no holder found")
		}
	}
}
