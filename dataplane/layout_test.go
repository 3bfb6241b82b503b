package dataplane

import (
	"context"
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

// TestAdoptReinstallsOtherLayout: a container's veth drops through the
// host's drop actions (one per reason, none of its own); a veth whose
// alias records another layout is re-installed by a restarted data
// plane's Adopt and its alias updated, its traffic flows and a refused
// datagram is counted once.
func TestAdoptReinstallsOtherLayout(t *testing.T) {
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

	l, err := e.d.h.LinkByIndex(veth)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := parseAlias(l.Attrs().Alias)
	if !ok {
		t.Fatalf("alias %q not ours", l.Attrs().Alias)
	}
	m.Layout = tcfilter.VethLayout + 1
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
	if dr, ot, _, host := vethMirreds(t, d2, veth); dr < ipv4DropReasons || dr > len(tcfilter.DropReasons) || host != dr || ot > 2 {
		t.Errorf("after Adopt: %d drop actions (%d the host's), %d others", dr, host, ot)
	}
	if n := mirredActions(t, e) - base; n > most {
		t.Errorf("%d mirred actions for one container after the re-install, want at most %d", n, most)
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
