package neighsync

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/test/sandbox"
)

// BenchmarkSyncer measures, while the Syncer serves 1 and then 1,000
// containers, Add and Remove of one more (its namespace made outside the
// timer), and what rtnetlink notifications anywhere on the machine cost: a
// neighbour entry (one notification) or an address (the address and its
// routes) added or deleted in a scratch namespace. The kernel walks every
// subscribed NETLINK_ROUTE socket of the machine for each notification
// (other processes' too: compare runs on a quiet machine), and for a
// neighbour notification from another namespace, the host namespace's
// namespace ids (the Syncer's socket listens to all of them). cpu-us/op is
// the process's CPU time per change.
func BenchmarkSyncer(b *testing.B) {
	if unix.Geteuid() != 0 {
		b.Skip("needs root (network namespaces)")
	}
	sb := sandbox.New(b)
	s, _, _ := hostSyncer(b, sb, netlink.FAMILY_V4)
	scratch, err := nshandle.New()
	if err != nil {
		b.Fatal(err)
	}
	defer scratch.Close()
	h, err := scratch.Netlink()
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d0"}, PeerName: "d1"}); err != nil {
		b.Fatal(err)
	}
	d, err := h.LinkByName("d0")
	if err == nil {
		err = h.LinkSetUp(d)
	}
	if err != nil {
		b.Fatal(err)
	}
	served := 0
	for _, n := range []int{1, 1000} {
		for ; served < n; served++ {
			if err := s.Add(fmt.Sprintf("c%d", served), withEth0(b), "eth0"); err != nil {
				b.Fatal(err)
			}
		}
		e := &netlink.Neigh{LinkIndex: d.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.IPv4(198, 18, 9, 9), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 9, 9}}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 18, 9, 1), Mask: net.CIDRMask(24, 32)}}
		for _, op := range []struct {
			name     string
			set, del func() error
		}{
			{"neighbour", func() error { return h.NeighSet(e) }, func() error { return h.NeighDel(e) }},
			{"address", func() error { return h.AddrAdd(d, a) }, func() error { return h.AddrDel(d, a) }},
		} {
			b.Run(fmt.Sprintf("containers=%d/notify_%s", n, op.name), func(b *testing.B) {
				_ = op.del() // left by an earlier run of this sub-benchmark
				cpu0 := processCPU(b)
				for i := range b.N {
					f := op.set
					if i%2 == 1 {
						f = op.del
					}
					if err := f(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
			})
		}
		b.Run(fmt.Sprintf("containers=%d/Add", n), func(b *testing.B) {
			var cpu time.Duration
			for i := range b.N {
				b.StopTimer()
				ns, id := withEth0(b), fmt.Sprintf("add%d", i)
				cpu0 := processCPU(b)
				b.StartTimer()
				if err := s.Add(id, ns, "eth0"); err != nil {
					b.Fatal(err)
				}
				s.Remove(id)
				cpu += processCPU(b) - cpu0
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/op")
		})
	}
}

// processCPU is the process's CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
