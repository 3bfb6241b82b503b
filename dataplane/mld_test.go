package dataplane

import (
	"context"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/wait"
)

// TestIPv6FreshContainerDrops: the multicast listener reports a fresh
// container's kernel sends on its own when its eth0 comes up (for the
// solicited-node groups of its addresses) are dropped on its veth as
// mld, every one of them, and nothing it sends on its own counts as an
// attack (ipv6_ext, source_ip or any other reason).
func TestIPv6FreshContainerDrops(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	ctx := context.Background()
	sent := func() int64 {
		var n int64
		for _, c := range []string{"Icmp6OutMLDv2Reports", "Icmp6OutGroupMembResponses", "Icmp6OutGroupMembReductions"} {
			n += snmp6(t, a.proc, c)
		}
		return n
	}
	var st plane.LinkStats
	wait.For(t, 10*time.Second, "every MLD message A sent counted as mld", func() bool {
		var err error
		if st, err = e.d.Stats(ctx, a.c); err != nil {
			t.Fatal(err)
		}
		n := sent()
		return n > 0 && st.Dropped[tcfilter.DropMLD] == uint64(n)
	})
	for r, n := range st.Dropped {
		if r != tcfilter.DropMLD && n != 0 {
			t.Errorf("a fresh container with IPv6 shows %d %s drops (all: %v)", n, r, st.Dropped)
		}
	}
	mustEcho(t, e.sb.Host, "udp", host6Addr(e, 31000), "A")
}
