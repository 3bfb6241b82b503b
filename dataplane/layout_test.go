package dataplane

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/wait"
)

// vethMirreds counts the distinct mirred actions of a veth's filters,
// those that redirect to a drop sink (the per-reason ones or SinkName) and
// the others, and the nodes that hold one; hostDrops counts the drop
// actions that are the host's (index 0x80000000|reason, none a veth's own).
func vethMirreds(t *testing.T, d *DataPlane, veth int) (drops, others, nodes, hostDrops int) {
	t.Helper()
	sinks := map[int]bool{}
	for _, name := range append([]string{tcfilter.SinkName}, sinkNames()...) {
		if l, err := d.h.LinkByName(name); err == nil {
			sinks[l.Attrs().Index] = true
		}
	}
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
				if sinks[m.Ifindex] {
					dr[m.Index] = true
				} else {
					ot[m.Index] = true
				}
			}
		}
	}
	for idx := range dr {
		if uint32(idx)&^0xf == hostDropBase {
			hostDrops++
		}
	}
	return len(dr), len(ot), nodes, hostDrops
}

// hostDropBase is the index of the host's drop action of the first reason.
const hostDropBase = 0x80000000

func sinkNames() []string {
	var out []string
	for _, r := range tcfilter.DropReasons {
		out = append(out, tcfilter.DropSinkName(r))
	}
	return out
}

// ipv4DropReasons is how many drop reasons the veth filters of a container
// without IPv6 use (all but DropIPv6Ext, DropNDP and DropMLD).
const ipv4DropReasons = 11

// mirredActions counts the mirred actions of the sandbox host namespace.
func mirredActions(t *testing.T, e *env) int {
	t.Helper()
	return strings.Count(e.sb.Host.Run(t, "tc", "actions", "ls", "action", "mirred"), "\tindex ")
}

// TestAdoptUpgradesVethLayout: a container set up under layout 4 (one
// drop action of its own per reason, to the one sink SinkName) is brought
// to the host's drop actions by a restarted data plane's Adopt, what its
// old actions counted carried into the count map; the old actions go,
// its traffic flows and a refused datagram is counted once.
func TestAdoptUpgradesVethLayout(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	base := mirredActions(t, e)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	veth := e.d.ctrs[a.c.ID].veth
	if dr, ot, _, host := vethMirreds(t, e.d, veth); dr < ipv4DropReasons || dr > len(tcfilter.DropReasons) || host != dr || ot > 2 {
		t.Fatalf("current layout: %d drop actions (%d the host's), %d others (want the host's, one per reason, and at most 2)", dr, host, ot)
	}
	// the redirect to its veth, the shared redirects to host eth0 and lo,
	// its ICMP fan-out mirror only without the echo programs; no drop
	// action
	most := 3
	if e.d.fanoutUsed() {
		most = 4
	}
	if n := mirredActions(t, e) - base; n > most {
		t.Errorf("one container added %d mirred actions to its host namespace, want at most %d", n, most)
	}

	// Back to layout 4: each drop node's action the veth's own for its
	// reason, to SinkName (a replace keeps the node's keys), and the
	// alias says so.
	fs, err := e.d.h.FilterList(linkRefIdx(veth), netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		u, ok := f.(*netlink.U32)
		if !ok || len(u.Actions) == 0 {
			continue
		}
		m, ok := u.Actions[0].(*netlink.MirredAction)
		if !ok || uint32(m.Index)&^0xf != hostDropBase {
			continue
		}
		m.Index = int(hostDropBase | uint32(veth)<<4 | uint32(m.Index)&0xf)
		m.Ifindex = e.d.sink.Index
		u.RedirIndex = 0 // set by the dump: it would add a second redirect
		if err := e.d.h.FilterReplace(u); err != nil {
			t.Fatalf("layout 4 node %x: %v", u.Handle, err)
		}
	}
	if dr, _, _, host := vethMirreds(t, e.d, veth); dr < ipv4DropReasons || host != 0 {
		t.Fatalf("layout 4 not built: %d drop actions, %d of them the host's", dr, host)
	}
	l, err := e.d.h.LinkByIndex(veth)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := parseAlias(l.Attrs().Alias)
	if !ok {
		t.Fatalf("alias %q not ours", l.Attrs().Alias)
	}
	m.Layout = 4
	if err := e.d.h.LinkSetAlias(l, metaAlias(m)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// counted by the old action only (the old sink does not count)
	st0, err := e.d.Stats(ctx, a.c)
	if err != nil {
		t.Fatal(err)
	}
	sendUnowned(t, a)
	portIdx := int(hostDropBase | uint32(veth)<<4 | uint32(slices.Index(tcfilter.DropReasons, tcfilter.DropPort)))
	wait.For(t, 5*time.Second, "the old port action counts the datagram", func() bool {
		fs, err := e.d.h.FilterList(linkRefIdx(veth), netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if u, ok := f.(*netlink.U32); ok {
				for _, a := range u.Actions {
					if s := a.Attrs().Statistics; a.Attrs().Index == portIdx && s != nil && s.Basic != nil && s.Basic.Packets == 1 {
						return true
					}
				}
			}
		}
		return false
	})

	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if dr, ot, _, host := vethMirreds(t, d2, veth); dr < ipv4DropReasons || dr > len(tcfilter.DropReasons) || host != dr || ot > 2 {
		t.Errorf("after Adopt: %d drop actions (%d the host's), %d others", dr, host, ot)
	}
	if !wait.Until(5*time.Second, func() bool { return mirredActions(t, e)-base <= 4 }) {
		t.Errorf("%d mirred actions for one container after the upgrade, want at most 4", mirredActions(t, e)-base)
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
	if got := before.Dropped[tcfilter.DropPort] - st0.Dropped[tcfilter.DropPort]; got != 1 {
		t.Errorf("the datagram the old action counted: %d after the upgrade, want 1 (%v)", got, before.Dropped)
	}
	sendUnowned(t, a)
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
