package dataplane

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// vethMirreds counts the distinct mirred actions of a veth's filters,
// those that redirect to the drop sink and the others, and the nodes that
// hold one.
func vethMirreds(t *testing.T, d *DataPlane, veth int) (drops, others, nodes int) {
	t.Helper()
	fs, err := d.h.FilterList(linkRefIdx(veth), netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		t.Fatal(err)
	}
	dr, ot := map[int]bool{}, map[int]bool{}
	for _, f := range fs {
		u, ok := f.(*netlink.U32)
		if !ok {
			continue
		}
		for _, a := range u.Actions {
			if m, ok := a.(*netlink.MirredAction); ok {
				nodes++
				if m.Ifindex == d.sink.Index {
					dr[m.Index] = true
				} else {
					ot[m.Index] = true
				}
			}
		}
	}
	return len(dr), len(ot), nodes
}

// ipv4DropReasons is how many drop reasons the veth filters of a container
// without IPv6 use (all but DropIPv6Ext, DropNDP and DropMLD).
const ipv4DropReasons = 9

// TestAdoptUpgradesVethLayout: a container set up under an older veth
// layout (every filter node with a mirred action of its own) is
// brought to shared actions by a restarted data plane's Adopt: one drop
// action per reason, the redirects shared; its traffic flows and a refused
// datagram is counted once.
func TestAdoptUpgradesVethLayout(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	veth := e.d.ctrs[a.c.ID].veth
	if dr, ot, _ := vethMirreds(t, e.d, veth); dr < ipv4DropReasons || dr > len(DropReasons) || ot > 2 {
		t.Fatalf("current layout: %d drop actions, %d others (want one per reason and at most 2)", dr, ot)
	}

	// Back to an older layout: every node's action its own (a replace keeps the
	// node's keys), and the alias says so.
	fs, err := e.d.h.FilterList(linkRefIdx(veth), netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		u, ok := f.(*netlink.U32)
		if !ok || len(u.Actions) == 0 {
			continue
		}
		for _, a := range u.Actions {
			a.Attrs().Index = 0
		}
		u.RedirIndex = 0 // set by the dump: it would add a second redirect
		if err := e.d.h.FilterReplace(u); err != nil {
			t.Fatalf("unshare %x: %v", u.Handle, err)
		}
	}
	if dr, ot, nodes := vethMirreds(t, e.d, veth); dr+ot != nodes || nodes < 20 {
		t.Fatalf("old layout not built: %d+%d actions for %d nodes", dr, ot, nodes)
	}
	l, err := e.d.h.LinkByIndex(veth)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := parseAlias(l.Attrs().Alias)
	if !ok {
		t.Fatalf("alias %q not ours", l.Attrs().Alias)
	}
	m.Layout = tcfilter.VethLayout - 1
	if err := e.d.h.LinkSetAlias(l, metaAlias(m)); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if dr, ot, _ := vethMirreds(t, d2, veth); dr < ipv4DropReasons || dr > len(DropReasons) || ot > 2 {
		t.Errorf("after Adopt: %d drop actions, %d others (want one per reason and at most 2)", dr, ot)
	}
	if l, err = d2.h.LinkByIndex(veth); err != nil {
		t.Fatal(err)
	}
	if m, _ := parseAlias(l.Attrs().Alias); m.Layout != tcfilter.VethLayout {
		t.Errorf("alias layout %d after Adopt, want %d", m.Layout, tcfilter.VethLayout)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")

	before, err := d2.Stats(ctx, a.c)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.proc.Do(func() error {
		u, err := net.DialUDP("udp4", &net.UDPAddr{Port: 45000}, &net.UDPAddr{IP: sandbox.ClientIP, Port: 9})
		if err != nil {
			return err
		}
		defer u.Close()
		_, err = u.Write([]byte("not my port"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var n uint64
	var dropped map[string]uint64
	wait.Until(5*time.Second, func() bool {
		s, err := d2.Stats(ctx, a.c)
		if err != nil {
			t.Fatal(err)
		}
		dropped = s.Dropped
		n = s.Dropped[tcfilter.DropPort] - before.Dropped[tcfilter.DropPort]
		return n >= 1
	})
	if n != 1 {
		t.Fatalf("one datagram from an unowned port counted %d times (%v)", n, dropped)
	}
}
