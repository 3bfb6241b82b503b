package tcfilter

import (
	"maps"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/test/wait"
)

func TestActionIndexes(t *testing.T) {
	if redirectIndex(0) != 0 || redirectIndex(redirectIndexBase) != 0 || redirectIndex(7) != redirectIndexBase|7 {
		t.Errorf("redirectIndex: %x %x %x", redirectIndex(0), redirectIndex(redirectIndexBase), redirectIndex(7))
	}
	seen := map[uint32]bool{}
	for r := range DropReasons {
		idx := hostDropIndex(r)
		if seen[idx] || !isHostDropIndex(idx) {
			t.Errorf("reason %d: index %x twice or not recognised", r, idx)
		}
		seen[idx] = true
		if isHostDropIndex(redirectIndex(r + 1)) {
			t.Errorf("a redirect index %x taken for a drop index", redirectIndex(r+1))
		}
	}
	// a per-veth drop action of layout 4 (bank 0, veth 1, reason 0) is not the host's
	if isHostDropIndex(dropIndexBase|1<<4) || isHostDropIndex(dropIndexBase|uint32(len(DropReasons))) {
		t.Error("isHostDropIndex claims an index outside its scheme")
	}
}

// vethActions sorts the mirred actions of a veth's filters: the distinct
// indexes of those redirecting to a drop sink and of the others.
func vethActions(t *testing.T, c *ctr, w *wire) (drops, others map[uint32]int) {
	t.Helper()
	fs, err := c.vf.dev().list()
	if err != nil {
		t.Fatal(err)
	}
	drops, others = map[uint32]int{}, map[uint32]int{}
	for _, f := range fs {
		for _, a := range f.Actions {
			m, ok := a.(*netlink.MirredAction)
			if !ok {
				continue
			}
			if m.Ifindex == w.sink || w.sinks.isSink(m.Ifindex) {
				drops[uint32(m.Index)]++
			} else {
				others[uint32(m.Index)]++
			}
		}
	}
	return drops, others
}

// checkShared: a veth of the current layout uses the host's drop action
// of each reason its nodes use (no action of its own) and shares its
// redirects with the other veths (one action per target: host eth0 and
// host lo).
func checkShared(t *testing.T, w *wire, c *ctr) {
	t.Helper()
	drops, others := vethActions(t, c, w)
	reasons := map[string]bool{}
	for _, n := range c.vf.fixedNodes() {
		if n.reason != "" {
			reasons[n.reason] = true
		}
	}
	if len(drops) != len(reasons) {
		t.Errorf("%s: %d drop actions %v, want one per reason its nodes use (%d)", c.name, len(drops), drops, len(reasons))
	}
	for idx := range drops {
		if !isHostDropIndex(idx) {
			t.Errorf("%s: drop action %x is not one of the host's", c.name, idx)
		}
	}
	want := map[uint32]bool{redirectIndex(w.eth0): true, redirectIndex(w.lo): true}
	if len(others) != len(want) {
		t.Errorf("%s: redirect actions %v, want the shared ones of eth0 and lo", c.name, others)
	}
	for idx := range others {
		if !want[idx] {
			t.Errorf("%s: redirect action %x is not a shared one", c.name, idx)
		}
	}
}

// sendUnowned makes c send one UDP datagram from port 40000 (owned by no
// container) to the client.
func sendUnowned(t *testing.T, w *wire, c *ctr) {
	t.Helper()
	if err := c.c.Do(func() error {
		u, err := net.DialUDP("udp4", &net.UDPAddr{Port: 40000}, &net.UDPAddr{IP: w.s.ClientIP, Port: 9000})
		if err != nil {
			return err
		}
		defer u.Close()
		_, err = u.Write([]byte("hi"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// dropOne sends one UDP datagram from port 40000 (owned by no container)
// and waits until the veth's port drops grew, then checks they grew by
// exactly one and that the counts of others did not move.
func dropOne(t *testing.T, w *wire, c *ctr, others ...*ctr) {
	t.Helper()
	before, err := c.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}
	var otherBefore []map[string]uint64
	for _, o := range others {
		m, err := o.vf.Drops()
		if err != nil {
			t.Fatal(err)
		}
		otherBefore = append(otherBefore, m)
	}
	sendUnowned(t, w, c)
	var d uint64
	wait.Until(5*time.Second, func() bool {
		after, err := c.vf.Drops()
		if err != nil {
			t.Fatal(err)
		}
		d = after[DropPort] - before[DropPort]
		return d >= 1
	})
	if d != 1 {
		t.Fatalf("%s: one datagram from an unowned port counted %d times", c.name, d)
	}
	for i, o := range others {
		if m, err := o.vf.Drops(); err != nil || !maps.Equal(m, otherBefore[i]) {
			t.Errorf("%s's drop from an unowned port moved %s's counts: %v -> %v (%v)", c.name, o.name, otherBefore[i], m, err)
		}
	}
}

// TestVethActionsShared: the veth filters create no mirred action of
// their own, two containers share the host's drop actions and the
// redirect actions, traffic flows and a drop is counted once, for the
// container that sent it only.
func TestVethActionsShared(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	b := w.plumb(t, "cb", 2, rg(33792, 34047))
	checkShared(t, w, a)
	checkShared(t, w, b)
	da, _ := vethActions(t, a, w)
	db, _ := vethActions(t, b, w)
	if !maps.Equal(da, db) {
		t.Errorf("drop actions of two veths differ: %v and %v", da, db)
	}
	serve(t, w.s.Client.Do, "client", 9000)
	client := net.JoinHostPort(w.s.ClientIP.String(), "9000")
	for _, c := range []*ctr{a, b} {
		if got, err := echo(c.c.Do, "udp", client); err != nil || got != "client" {
			t.Fatalf("%s, owned port: %q %v", c.name, got, err)
		}
	}
	dropOne(t, w, a, b)
	dropOne(t, w, b, a)
}

// TestInstallSharesOldActions: Install (a restarted daemon's Adopt) brings
// a veth of an older layout, where every node had a mirred action of its own, to
// shared actions without a packet going unmatched, and the container's
// traffic and drop counts stay right.
func TestInstallSharesOldActions(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	serve(t, w.s.Client.Do, "client", 9000)
	// every node's action its own (a replace keeps the node's keys)
	fs, err := a.vf.dev().list()
	if err != nil {
		t.Fatal(err)
	}
	actions := 0
	for _, f := range fs {
		if len(f.Actions) == 0 {
			continue
		}
		for _, x := range f.Actions {
			x.Attrs().Index = 0
		}
		f.RedirIndex = 0 // set by the dump: it would add a second redirect
		if err := w.h.FilterReplace(f); err != nil {
			t.Fatalf("unshare %s: %v", FormatHandle(f.Handle), err)
		}
		actions++
	}
	drops, others := vethActions(t, a, w)
	if len(drops)+len(others) != actions {
		t.Fatalf("old layout not built: %d nodes with actions, %d actions", actions, len(drops)+len(others))
	}
	dropOne(t, w, a)
	if err := a.vf.Install(a.ranges); err != nil {
		t.Fatal(err)
	}
	checkShared(t, w, a)
	client := net.JoinHostPort(w.s.ClientIP.String(), "9000")
	if got, err := echo(a.c.Do, "udp", client); err != nil || got != "client" {
		t.Fatalf("owned port after the upgrade: %q %v", got, err)
	}
	dropOne(t, w, a)
}
