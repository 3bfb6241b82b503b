package tcfilter

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/tcfilter/nlbatch"
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
	var ds []*HostDemux
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x := NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil)
		if err := x.Init(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, x)
	}
	b.StopTimer()
	for _, x := range ds {
		x.ReleaseEcho() // each took over the echo programs: its sweepers stop
	}
}

// BenchmarkInstall times installing one container's veth filters (on a
// new veth, as Setup does) and its container filters (on a new pair of
// devices standing for its lo and eth0), with IPv6, through a batch
// socket and one request at a time through the handle, alternately in one
// process. It reports µs/op and the process's CPU time per install
// (cpu-µs/op: the kernel does the requests' work on the sending thread).
func BenchmarkInstall(b *testing.B) {
	host6 := []net.IP{net.ParseIP("2001:db8:5::1"), net.ParseIP("fe80::1")}
	rs := []ephemeral.Range{rg(32768, 33791), rg(8080, 8080)}
	// the loopback ports of README's example configuration: --ports,
	// --ephemeral-ports and the host's ip_local_port_range (18 ranges)
	loop := ephemeral.Split(ephemeral.MustParseSet("31000-31999,32768-49151,50000-60999"))
	for _, what := range []string{"veth", "container"} {
		for _, batched := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/batch=%v", what, batched), func(b *testing.B) {
				e := newKernelEnv(b, 0)
				var c *nlbatch.Conn
				if batched {
					c = e.openConn(b)
				}
				var cpu time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bench0"}, PeerName: "bench0p"}
					if err := e.h.LinkAdd(v); err != nil {
						b.Fatal(err)
					}
					a, p := e.index(b, "bench0"), e.index(b, "bench0p")
					c0 := processCPU(b)
					b.StartTimer()
					var err error
					if what == "veth" {
						err = VethFilters{H: e.h, C: c, Veth: a, Eth0: e.eth0, Lo: e.lo, Sinks: e.sinks, VLAN: true, HostIP: e.s.HostIP,
							HostIP6: host6, MAC: e.s.HostMAC, Slot: 42, New: true, LoopPorts: loop}.Install(rs)
					} else {
						err = ContainerFilters{H: e.h, C: c, Lo: a, Eth0: p, HostIP: e.s.HostIP, HostIP6: host6}.Install(rs)
					}
					b.StopTimer()
					cpu += processCPU(b) - c0
					if err != nil {
						b.Fatal(err)
					}
					if err := e.h.LinkDel(v); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}
