package dataplane

import (
	"testing"
	"time"
)

// TestFragmentAtomic6: an IPv6 atomic fragment (a fragment header with
// offset 0 and M clear: a whole datagram) reaches the container owning its
// port and, to a port nobody owns, the host's socket; it is no train, so
// nothing is learned and nothing counted as left to the host.
func TestFragmentAtomic6(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	serveIn(t, e.sb.Host, "[::]:8000", "host")
	c := newFragClient(t, e)
	before := fragStats(t, e)
	for i, x := range []struct {
		port uint16
		want string
	}{{31000, "A"}, {8000, "host"}} {
		sport := uint16(20100 + i)
		pc := c.listen(e.sb.ClientIP6, sport)
		msg := "atomic-" + x.want
		fr := c.train(e.sb.ClientIP6, e.sb.HostIP6, sport, x.port, 0x7100+uint32(i), msg, 1500)
		if len(fr) != 1 || fr[0][14+6] != 44 {
			t.Fatalf("crafted %d frames, want one atomic fragment", len(fr))
		}
		c.send(fr...)
		if got := reply(pc, 3*time.Second); got != x.want+" "+msg+"\n" {
			t.Errorf("atomic fragment to port %d: reply %q, want %s's echo", x.port, got, x.want)
		}
	}
	after := fragStats(t, e)
	if after.Learned != before.Learned || after.Host6 != before.Host6 || after.Steered6 != before.Steered6 {
		t.Errorf("atomic fragments counted as a train: %+v, then %+v", before, after)
	}
}
