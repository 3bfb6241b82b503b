package tcfilter

import (
	"fmt"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
)

// BenchmarkAddDelRanges times AddRanges and DelRanges of one container on a
// host eth0 demux that already routes the ports of `present` containers (a
// 32-port block and a static port each, as in TestHostDemuxThousand). The
// per-operation figures are reported as add-µs and del-µs; they should not
// grow with the number of containers, because a change never dumps or
// walks the filter table.
//
//   - 1024ports: 4 nodes in H1.
//   - 1port: one node in an H2 table that exists already.
//   - 1port-newH2: one node in a bucket of its own, so the add links an H2
//     table (re-using the one the previous delete left for deferred
//     deletion, or creating it) and the delete unlinks it.
func BenchmarkAddDelRanges(b *testing.B) {
	shapes := []struct {
		name string
		r    ephemeral.Range
	}{
		{"1024ports", rg(3072, 4095)},
		{"1port", rg(1999, 1999)},       // bucket 7, shared with ports 2001..2047
		{"1port-newH2", rg(1500, 1500)}, // bucket 5: no other small range
	}
	for _, present := range []int{1, 1000} {
		for _, sh := range shapes {
			b.Run(fmt.Sprintf("present=%d/%s", present, sh.name), func(b *testing.B) {
				e := newKernelEnv(b, 2)
				d := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil)
				if err := d.Init(); err != nil {
					b.Fatal(err)
				}
				for i := 1; i <= present; i++ {
					lo := uint16(32768 + (i-1)*32)
					rs := []ephemeral.Range{rg(lo, lo+31), rg(uint16(2000+i), uint16(2000+i))}
					if err := d.AddRanges(uint16(i), e.targets[i%2], rs); err != nil {
						b.Fatal(err)
					}
				}
				rs := []ephemeral.Range{sh.r}
				var add, del time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					if err := d.AddRanges(4000, e.targets[0], rs); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					if _, err := d.DelRanges(4000, rs); err != nil {
						b.Fatal(err)
					}
					add += t1.Sub(t0)
					del += time.Since(t1)
				}
				b.ReportMetric(float64(add.Microseconds())/float64(b.N), "add-µs")
				b.ReportMetric(float64(del.Microseconds())/float64(b.N), "del-µs")
			})
		}
	}
}

// BenchmarkFanout times adding and removing one container's ARP and ICMP
// mirror nodes with 1 and 1000 other containers present.
func BenchmarkFanout(b *testing.B) {
	for _, present := range []int{1, 1000} {
		b.Run(fmt.Sprintf("present=%d", present), func(b *testing.B) {
			e := newKernelEnv(b, 1)
			d := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil)
			for i := 1; i <= present; i++ {
				if err := d.AddFanout(uint16(i), e.targets[0]); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := d.AddFanout(4000, e.targets[0]); err != nil {
					b.Fatal(err)
				}
				if _, err := d.DelFanout(4000); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkInit times Init on a device that is already set up (what a
// restarted daemon does), with 1000 containers' ranges present.
func BenchmarkInit(b *testing.B) {
	e := newKernelEnv(b, 1)
	d := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil)
	for i := 1; i <= 1000; i++ {
		lo := uint16(32768 + (i-1)*32)
		if err := d.AddRanges(uint16(i), e.targets[0], []ephemeral.Range{rg(lo, lo+31), rg(uint16(2000+i), uint16(2000+i))}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil).Init(); err != nil {
			b.Fatal(err)
		}
	}
}
