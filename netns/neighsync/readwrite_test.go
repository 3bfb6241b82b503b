package neighsync

import (
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// TestLargeTableReadHoldsUpNoWrite: while a tenant's large table is read
// (a resync after an overflow; a root tenant may hold any number of
// permanent entries, and a dump walks them all), an entry written into it
// with the Syncer's lock held (its request served, a host MAC change) does
// not wait for the read to end: the reader would hold the lock, and every
// other container would wait, for as long as the tenant's dump takes.
func TestLargeTableReadHoldsUpNoWrite(t *testing.T) {
	sb := sandbox.New(t)
	s, _, _ := hostSyncer(t, sb, netlink.FAMILY_V4)
	addr := net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}
	tenant, ht := servedContainer(t, sb, s, "tenant", addr)
	fl := tenantLinks(t, tenant, ht)
	const entries = 30_000
	for i := range entries {
		if err := ht.NeighSet(&netlink.Neigh{LinkIndex: fl.entries, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	m := s.ctrs["tenant"]
	s.mu.Unlock()

	for attempt := 0; ; attempt++ {
		t0 := time.Now()
		done := make(chan time.Duration, 1)
		go func() {
			s.resyncMember(m)
			done <- time.Since(t0)
		}()
		if !wait.Until(5*time.Second, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return m.reading > 0
		}) {
			t.Fatal("the read did not start")
		}
		s.mu.Lock()
		w0 := time.Now()
		s.push(m, mustKey(sb.ClientIP), net.HardwareAddr{2, 0, 0, 0, 0, 2})
		write := time.Since(w0)
		s.mu.Unlock()
		read := <-done
		t.Logf("read of %d entries: %v; a write meanwhile: %v", entries, read, write)
		if read < 5*time.Millisecond {
			if attempt < 3 {
				continue // too fast to tell (the write may have come after it)
			}
			t.Skipf("a read of %d entries takes %v: too fast to tell", entries, read)
		}
		if write > read/2 {
			t.Fatalf("a write into the tenant took %v with the lock held, waiting for the read of its table (%v)", write, read)
		}
		return
	}
}
