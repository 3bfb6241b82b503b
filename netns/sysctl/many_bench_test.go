package sysctl

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nshandle/nstest"
)

// BenchmarkReadMany reads ip_local_port_range once in each of 10, then
// 1,000 namespaces (as a rebuild does), each of which has looked up
// net/ipv4 through /proc before (as code reading by full paths does): by
// the full path, and through a Dir. It reports the wall and CPU time per
// namespace (us/ns, cpu-us/ns): the full path's grow with the number of
// namespaces, a Dir's should not.
func BenchmarkReadMany(b *testing.B) {
	nstest.NeedRoot(b)
	const key = "/proc/sys/net/ipv4/ip_local_port_range"
	var nss []*nshandle.NS
	defer func() {
		for _, ns := range nss {
			ns.Close()
		}
	}()
	cpu := func() time.Duration {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ts.Nano())
	}
	readers := []struct {
		name string
		read func(ns *nshandle.NS) error
	}{
		{"fullpath", func(ns *nshandle.NS) error {
			return ns.Do(func() error { _, err := os.ReadFile(key); return err })
		}},
		{"dir", func(ns *nshandle.NS) error {
			return In(ns, func(d *Dir) error { _, err := d.Read("net/ipv4/ip_local_port_range"); return err })
		}},
	}
	for _, n := range []int{10, 1000} {
		for len(nss) < n {
			ns, err := nshandle.New()
			if err != nil {
				b.Fatal(err)
			}
			nss = append(nss, ns)
			if err := readers[0].read(ns); err != nil {
				b.Fatal(err)
			}
		}
		for _, r := range readers {
			b.Run(fmt.Sprintf("namespaces=%d/%s", n, r.name), func(b *testing.B) {
				t0, c0 := time.Now(), cpu()
				for b.Loop() {
					for _, ns := range nss {
						if err := r.read(ns); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(time.Since(t0).Microseconds())/float64(b.N*n), "us/ns")
				b.ReportMetric(float64((cpu()-c0).Microseconds())/float64(b.N*n), "cpu-us/ns")
			})
		}
	}
}
