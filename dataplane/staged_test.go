package dataplane

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dockerMoves does to the staged peer what Docker 20.10's SetKey does:
// move it into the namespace at nsPath, down, rename it eth0, give it the
// MAC and address, up.
func dockerMoves(t *testing.T, e *env, peer, nsPath string, addr net.IPNet, mac net.HardwareAddr) {
	t.Helper()
	hh, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	l, err := hh.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := hh.LinkSetNsFd(l, int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	ch, err := sandbox.NS{Path: nsPath}.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if l, err = ch.LinkByName(peer); err != nil {
		t.Fatal(err)
	}
	steps := []func() error{
		func() error { return ch.LinkSetDown(l) },
		func() error { return ch.LinkSetName(l, ContainerEth0) },
		func() error { return ch.LinkSetHardwareAddr(l, mac) },
		func() error { return ch.AddrAdd(l, &netlink.Addr{IPNet: &addr}) },
		func() error { return ch.LinkSetUp(l) },
	}
	for i, s := range steps {
		if err := s(); err != nil {
			t.Fatalf("docker's step %d: %v", i, err)
		}
	}
}

// TestStagedVethAdoptedBySetup: a pair staged in the host namespace, its
// peer moved in and configured the way Docker does it, carries nothing
// until Setup adopted it (the host end is down, the container's eth0 has
// no carrier); AwaitStaged returns once the runtime is done with it; Setup
// adopts it and the container gets its port range and its traffic.
func TestStagedVethAdoptedBySetup(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p := e.spawn("stg", []uint16{31001}, false)
	c := e.spec("stg", p, 1, "40960-41983", "31001", "")

	peer, err := e.d.Stage(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.d.Unstage(c.ID) })
	if peer != StagedPeerName(c.ID) || !e.hasLink(peer) || !e.hasLink(plane.VethName(c.ID)) {
		t.Fatalf("Stage: peer %q; host links %v", peer, e.hostLinks())
	}
	if again, err := e.d.Stage(ctx, c.ID); err != nil || again != peer {
		t.Fatalf("Stage again: %q, %v", again, err)
	}

	// AwaitStaged waits for the runtime: not done before it moved the peer.
	awaited := make(chan error, 1)
	go func() {
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		awaited <- e.d.AwaitStaged(actx, c.ID, p.NetNS)
	}()
	select {
	case err := <-awaited:
		t.Fatalf("AwaitStaged returned before the peer moved: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	dockerMoves(t, e, peer, p.NetNS, e.info.IP, e.info.MAC)
	if err := <-awaited; err != nil {
		t.Fatalf("AwaitStaged: %v", err)
	}

	// Until Setup: the host end is down, the container's eth0 without carrier.
	for _, a := range e.hostLinkAttrs() {
		if a.Name == plane.VethName(c.ID) && a.Flags&net.FlagUp != 0 {
			t.Fatalf("host end %s is up before Setup", a.Name)
		}
	}
	ch, err := sandbox.NS{Path: p.NetNS}.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	l, err := ch.LinkByName(ContainerEth0)
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().RawFlags&unix.IFF_LOWER_UP != 0 {
		t.Fatalf("the container's eth0 has a carrier before Setup")
	}
	if _, err := echo(e.sb.Client, "tcp", fmt.Sprintf("%s:31001", e.sb.HostIP)); err == nil {
		t.Fatal("port 31001 answers before Setup")
	}

	pl := e.setup(c)
	if pl.Veth != plane.VethName(c.ID) || pl.VethIndex != l.Attrs().ParentIndex {
		t.Fatalf("Setup did not adopt the staged pair: %+v (staged host end %d)", pl, l.Attrs().ParentIndex)
	}
	if had, err := e.d.Unstage(c.ID); had || err != nil {
		t.Fatalf("Unstage after Setup: %v, %v (the pair is Setup's now)", had, err)
	}
	v, err := p.Sysctl("net.ipv4.ip_local_port_range")
	if err != nil || strings.Join(strings.Fields(v), " ") != "40960 41983" {
		t.Fatalf("ip_local_port_range = %q, %v", v, err)
	}
	mustEcho(t, e.sb.Client, "tcp", fmt.Sprintf("%s:31001", e.sb.HostIP), "stg")
	mustEcho(t, e.sb.Client, "udp", fmt.Sprintf("%s:31001", e.sb.HostIP), "stg")
}

// TestUnstageRemovesThePair: a pair no Setup adopted is deleted by Unstage.
func TestUnstageRemovesThePair(t *testing.T) {
	e := newEnv(t)
	id := e.uniqueID("uns")
	peer, err := e.d.Stage(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if had, err := e.d.Unstage(id); !had || err != nil {
		t.Fatalf("Unstage: %v, %v", had, err)
	}
	if e.hasLink(peer) || e.hasLink(plane.VethName(id)) {
		t.Fatalf("links left: %v", e.hostLinks())
	}
	if had, err := e.d.Unstage(id); had || err != nil {
		t.Fatalf("second Unstage: %v, %v", had, err)
	}
}

// TestUnstageAfterRestart: a pair staged by an earlier daemon (its host end
// has no alias) is deleted by Unstage of its ID; a plumbed container's veth
// is never taken for one.
func TestUnstageAfterRestart(t *testing.T) {
	e := newEnv(t)
	id := e.uniqueID("old")
	peer, err := e.d.Stage(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	d2 := e.newDataPlane() // a restarted daemon knows nothing staged
	if had, err := d2.Unstage(id); !had || err != nil {
		t.Fatalf("Unstage by a restarted data plane: %v, %v", had, err)
	}
	if e.hasLink(peer) || e.hasLink(plane.VethName(id)) {
		t.Fatalf("links left: %v", e.hostLinks())
	}
	c := e.start("kept", 2, "40960-41983", "31001", "", 31001)
	if had, err := e.d.Unstage(c.c.ID); had || err != nil || !e.hasLink(plane.VethName(c.c.ID)) {
		t.Fatalf("Unstage of a plumbed container: %v, %v; links %v", had, err, e.hostLinks())
	}
}

// TestStagedPeerCannotBeForged: the runtime has moved the staged peer into
// the container, where the tenant renames it (eth1) and makes its own eth0,
// up with the host's address: a veth whose peer it gives the staged host
// end's ifindex. The staged host end's peer is in the container's
// namespace, so only the ifindex check tells the two apart: AwaitStaged
// and Setup refuse.
func TestStagedPeerCannotBeForged(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p := e.spawn("forge", []uint16{31001}, false)
	c := e.spec("forge", p, 1, "40960-41983", "31001", "")
	peer, err := e.d.Stage(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.d.Unstage(c.ID) })
	idx := e.d.stagedIndex(c.ID)

	// The runtime moves the staged peer in; the tenant renames it.
	hh, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	moved, err := hh.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	nsf, err := os.Open(p.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer nsf.Close()
	if err := hh.LinkSetNsFd(moved, int(nsf.Fd())); err != nil {
		t.Fatal(err)
	}
	ch, err := sandbox.NS{Path: p.NetNS}.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if moved, err = ch.LinkByName(peer); err != nil {
		t.Fatal(err)
	}
	if err := ch.LinkSetName(moved, "eth1"); err != nil {
		t.Fatal(err)
	}

	// The tenant forges eth0: its peer has the staged host end's ifindex.
	fake := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fakepeer", Index: idx}, PeerName: ContainerEth0}
	if err := ch.LinkAdd(fake); err != nil {
		t.Fatalf("forging eth0: %v", err)
	}
	forged, err := ch.LinkByName(ContainerEth0)
	if err != nil || forged.Attrs().ParentIndex != idx {
		t.Fatalf("forged eth0: %v, %v", forged, err)
	}
	addr := e.info.IP
	if err := ch.AddrAdd(forged, &netlink.Addr{IPNet: &addr}); err != nil {
		t.Fatal(err)
	}
	if err := ch.LinkSetUp(forged); err != nil {
		t.Fatal(err)
	}

	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := e.d.AwaitStaged(actx, c.ID, p.NetNS); err == nil || !strings.Contains(err.Error(), "not the staged veth's peer") {
		t.Fatalf("AwaitStaged with a forged eth0: %v", err)
	}
	if pl, err := e.d.Setup(ctx, c); err == nil {
		e.cleanupMount(c.ID)
		e.d.Teardown(ctx, c)
		t.Fatalf("Setup adopted the staged pair for a forged eth0: %+v", pl)
	}
	if !e.hasLink(plane.VethName(c.ID)) {
		t.Fatal("the refused Setup deleted the staged pair")
	}
}
