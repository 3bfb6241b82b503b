package dataplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// retiredLinks lists the sandbox host's links waiting for deletion.
func (e *env) retiredLinks() []string {
	e.t.Helper()
	var out []string
	for _, a := range e.hostLinkAttrs() {
		if isRetired(a) {
			out = append(out, a.Name)
		}
	}
	return out
}

// waitNoRetired waits (bounded) until no retired link is left.
func (e *env) waitNoRetired(d *DataPlane) {
	e.t.Helper()
	if !wait.Until(10*time.Second, func() bool { d.WaitRetired(); return len(e.retiredLinks()) == 0 }) {
		e.t.Fatalf("retired links not deleted after 10s: %v", e.retiredLinks())
	}
}

// notAnsweredBy fails if a TCP or UDP echo to addr from ns is answered by
// the server named old.
func notAnsweredBy(t *testing.T, ns doer, addr, old string) {
	t.Helper()
	for _, nw := range []string{"tcp", "udp"} {
		got, err := echo(ns, nw, addr, traffic.WithTimeout(300*time.Millisecond))
		if err == nil && got == old {
			t.Errorf("%s %s still answered by %s after its teardown", nw, addr, old)
		}
	}
}

// TestTeardownRetires: Teardown returns with the container unreachable and
// its veth name free (the pair is deleted in the background); the released
// port serves a container set up on it at once; a new setup into the same
// namespace (whose eth0 still exists until the deletion) succeeds; every
// retired link is deleted in the end.
func TestTeardownRetires(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.start("A", 1, "40960-41023", "31000", "", 31000, 31001)
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")

	rep, err := e.d.Teardown(ctx, a.c)
	if err != nil || len(rep.Missing) != 0 {
		t.Fatalf("Teardown: %v %v", rep, err)
	}
	if e.hasLink(plane.VethName(a.c.ID)) {
		t.Errorf("veth %s still carries its name after the teardown", plane.VethName(a.c.ID))
	}
	// Released: A's process still listens on 31000, but nothing reaches it.
	notAnsweredBy(t, e.sb.Client, hostAddr(31000), "A")
	notAnsweredBy(t, e.sb.Host, hostAddr(31000), "A")
	notAnsweredBy(t, e.sb.Host, loAddr(31000), "A")
	// And A sends nothing any more with its ports.
	serveIn(t, e.sb.Client, clientAddr(9000), "client")
	if got, err := echo(a.proc, "tcp", clientAddr(9000), traffic.WithTimeout(300*time.Millisecond)); err == nil {
		t.Errorf("the torn-down container still reaches the client (answered by %q)", got)
	}

	// The same port (and slot) at once for another container.
	b := e.start("B", 1, "40960-41023", "31000", "", 31000)
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "B")
	mustEcho(t, e.sb.Client, "udp", hostAddr(31000), "B")

	// A new container in A's namespace, then another at once after its
	// teardown: the retired pair's eth0 is then likely still there.
	c := e.spec("A2", a.proc, 2, "41024-41087", "31001", "")
	e.setup(c)
	if _, err := e.d.Teardown(ctx, c); err != nil {
		t.Fatal(err)
	}
	c = e.spec("A3", a.proc, 2, "41024-41087", "31001", "")
	e.setup(c)
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31001), "A")
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "B")

	for _, x := range []plane.Container{b.c, c} {
		if _, err := e.d.Teardown(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	e.waitNoRetired(e.d)
	for _, n := range e.hostLinks() {
		if strings.HasPrefix(n, plane.VethPrefix) && isVethName(n) {
			t.Errorf("veth %s left after every teardown", n)
		}
	}
}

// TestChurnNoPortInTwoContainers: containers on the same three ports are set
// up and torn down in turn without waiting for any deletion; after every
// step each port is answered by its current owner only (or by no container
// when it has none), over TCP and UDP, from outside and from the host.
func TestChurnNoPortInTwoContainers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ports := []uint16{31100, 31101, 31102}
	// Two processes per port take turns; each serves all three ports, so a
	// stale path to a non-owner would be answered.
	procs := map[string]ctr{}
	for _, name := range []string{"P0", "P1"} {
		p := e.spawn(name, ports, false)
		procs[name] = ctr{proc: p}
	}
	owner := map[uint16]string{}
	live := map[uint16]plane.Container{}
	check := func(step string) {
		t.Helper()
		for _, port := range ports {
			for _, from := range []doer{e.sb.Client, e.sb.Host} {
				for _, nw := range []string{"tcp", "udp"} {
					// Short when nothing should answer; long enough for a
					// loaded machine when something should.
					want, wait := owner[port], 500*time.Millisecond
					if want != "" {
						wait = 3 * time.Second
					}
					got, err := echo(from, nw, hostAddr(int(port)), traffic.WithTimeout(wait))
					if want != "" && (err != nil || got != want) {
						t.Fatalf("%s: %s port %d answered by %q (%v), want %s", step, nw, port, got, err, want)
					} else if want == "" && err == nil {
						t.Fatalf("%s: %s port %d answered by %q, but no container owns it", step, nw, port, got)
					}
				}
			}
		}
	}
	slot := uint16(1)
	for i := 0; i < 6; i++ {
		port := ports[i%len(ports)]
		// Tear the port's container down (if any), check, then give the
		// port to the other process at once and check again. A process
		// holds at most one container at a time: its namespace has one eth0.
		if c, ok := live[port]; ok {
			if _, err := e.d.Teardown(ctx, c); err != nil {
				t.Fatal(err)
			}
			delete(live, port)
			owner[port] = ""
			check(fmt.Sprintf("step %d after teardown of %s", i, c.ID))
		}
		var name string
		for _, n := range []string{"P0", "P1"} {
			busy := false
			for p, o := range owner {
				if o == n && live[p].ID != "" {
					busy = true
				}
			}
			if !busy {
				name = n
				break
			}
		}
		if name == "" {
			continue
		}
		eph := fmt.Sprintf("%d-%d", 40960+64*int(slot), 40960+64*int(slot)+63)
		c := e.spec(name, procs[name].proc, slot, eph, fmt.Sprint(port), "")
		slot++
		e.setup(c)
		live[port], owner[port] = c, name
		check(fmt.Sprintf("step %d after setup of %s on %d", i, name, port))
	}
	for _, c := range live {
		if _, err := e.d.Teardown(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	e.waitNoRetired(e.d)
}

// TestRetiredSweptAtStart: links a killed daemon retired and did not delete
// yet (a veth with its name and alias, an egress shaper end) are deleted by the next one at PrepareHost; a
// link of the deletion group that the data plane cannot attribute (a
// foreign name, or our veth name without our alias) is left alone.
func TestRetiredSweptAtStart(t *testing.T) {
	e := newEnv(t)
	h, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// Veth pairs (no dummy links in this kernel): one end in the group,
	// its peer not.
	peers := 0
	add := func(name, alias string) {
		t.Helper()
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		attrs.Group = RetiredGroup
		peers++
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: fmt.Sprintf("tpeer%d", peers)}); err != nil {
			t.Fatalf("add %s: %v", name, err)
		}
		if alias != "" {
			if err := h.LinkSetAlias(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}, alias); err != nil {
				t.Fatalf("alias %s: %v", name, err)
			}
		}
	}
	ours := func(id string) (string, string) { return plane.VethName(id), metaAlias(plane.Meta{ID: id}) }
	add(ours("swept-1"))
	entry, _ := ShaperNames("swept-2")
	add(entry, "")
	d := e.newDataPlane()
	if _, err := d.PrepareHost(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.waitNoRetired(d)
	d.Close()

	// Now with foreign links in the group: ours go, they stay.
	add(ours("swept-3"))
	add("notours0", "")
	add(plane.VethName("swept-4"), "")
	d = e.newDataPlane()
	if _, err := d.PrepareHost(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait.Until(10*time.Second, func() bool { d.WaitRetired(); return len(e.retiredLinks()) <= 2 })
	if left := e.retiredLinks(); !slices.Equal(left, []string{"notours0", plane.VethName("swept-4")}) && !slices.Equal(left, []string{plane.VethName("swept-4"), "notours0"}) {
		t.Errorf("retired links after the sweep: %v; want only the two not ours", left)
	}
	// And teardowns no longer rely on the group: a container's veth is
	// deleted, the foreign link still stays.
	p := e.spawn("S", []uint16{31200}, false)
	c := e.spec("S", p, 1, "40960-41023", "", "")
	if _, err := d.Setup(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	e.cleanupMount(c.ID)
	if _, err := d.Teardown(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if e.hasLink(plane.VethName(c.ID)) || len(e.retiredLinks()) != 2 {
		t.Errorf("after teardown with a foreign link in the group: links %v", e.hostLinks())
	}
}

// TestSameIDRightAfterTeardown: a container set up again under the same ID
// right after its teardown (its veth and egress shaper names are still
// held by the retired links, its eth0 by the retired pair) works: the
// setup waits for the pending deletion. Stats and Check never see the
// retired links as the container's.
func TestSameIDRightAfterTeardown(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if !e.info.Features[plane.FeatureHTB] {
		t.Skip("no HTB: no egress shaper pair to retire")
	}
	p := e.spawn("A", []uint16{31300}, false)
	c := e.spec("A", p, 1, "40960-41023", "31300", "")
	c.Egress = rate.Limit{Rate: 50_000_000}
	e.setup(c)
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31300), "A")
	for round := range 3 {
		if _, err := e.d.Teardown(ctx, c); err != nil {
			t.Fatal(err)
		}
		if _, err := e.d.Stats(ctx, c); err == nil {
			t.Errorf("round %d: Stats of a torn-down container found a veth", round)
		}
		if missing, err := e.d.Check(ctx, c); err != nil || !slices.Contains(missing, "veth "+plane.VethName(c.ID)) {
			t.Errorf("round %d: Check after teardown: missing %v, %v; want the veth missing", round, missing, err)
		}
		if _, err := e.d.Setup(ctx, c); err != nil {
			t.Fatalf("round %d: Setup of the same ID right after its teardown: %v", round, err)
		}
		mustEcho(t, e.sb.Client, "tcp", hostAddr(31300), "A")
		mustEcho(t, e.sb.Client, "udp", hostAddr(31300), "A")
		if _, err := e.d.Stats(ctx, c); err != nil {
			t.Errorf("round %d: Stats: %v", round, err)
		}
		entry, exit := ShaperNames(c.ID)
		for _, n := range []string{plane.VethName(c.ID), entry, exit} {
			if !e.hasLink(n) {
				t.Errorf("round %d: no live link %s", round, n)
			}
		}
	}
	if _, err := e.d.Teardown(ctx, c); err != nil {
		t.Fatal(err)
	}
	e.waitNoRetired(e.d)
}
