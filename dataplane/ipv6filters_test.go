package dataplane

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestIPv6Filters: with IPv6 on, Setup gives a container IPv6 filters on
// every device: the outside reaches its ports over IPv6, it reaches the
// outside and the host (its address and ::1), an unowned source port is
// dropped and counted in Stats; a restarted data plane adopts it as it
// is; one with IPv6 off re-installs its veth filters without IPv6 (the
// alias's tag differs), one with IPv6 on again puts them back; Teardown
// leaves no node of the container.
func TestIPv6Filters(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnvWith(t, IPv6On, sandbox.WithIPv6())
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	serveIn(t, e.sb.Client, "[::]:9000", "client")
	serveIn(t, e.sb.Host, "[::]:7000", "host")
	host6, client6 := e.sb.HostIP6, e.sb.ClientIP6
	at := func(ip net.IP, p int) string { return net.JoinHostPort(ip.String(), fmt.Sprint(p)) }
	paths := func(t *testing.T) {
		t.Helper()
		for _, network := range []string{"tcp", "udp"} {
			mustEcho(t, e.sb.Client, network, at(host6, 31000), "A")
			mustEcho(t, e.sb.Client, network, at(host6, 7000), "host")
			mustEcho(t, e.sb.Host, network, at(host6, 31000), "A")
			mustEcho(t, a.proc, network, at(client6, 9000), "client")
			mustEcho(t, a.proc, network, at(host6, 7000), "host")
			mustEcho(t, a.proc, network, at(net.IPv6loopback, 7000), "host")
		}
	}
	paths(t)
	ctx := context.Background()
	st0, err := e.d.Stats(ctx, a.c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := echo(a.proc, "udp", at(client6, 9000), traffic.WithSource("[::]:50000")); err == nil {
		t.Error("a datagram from an unowned source port got out")
	}
	st1, err := e.d.Stats(ctx, a.c)
	if err != nil {
		t.Fatal(err)
	}
	if st1.Dropped[tcfilter.DropPort] <= st0.Dropped[tcfilter.DropPort] {
		t.Errorf("port drops %d -> %d, want a rise", st0.Dropped[tcfilter.DropPort], st1.Dropped[tcfilter.DropPort])
	}

	// A restarted data plane adopts A as it is.
	before := e.hostState()
	restart := func(mode IPv6Mode) *DataPlane {
		t.Helper()
		e.ipv6 = mode
		d := e.newDataPlane()
		if _, err := d.PrepareHost(ctx); err != nil {
			t.Fatal(err)
		}
		if err := d.Adopt(ctx, a.c); err != nil {
			t.Fatal(err)
		}
		return d
	}
	restart(IPv6On)
	if after := e.hostState(); after != before {
		t.Errorf("restart + Adopt changed the host:\n%s", lineDiff(before, after))
	}
	paths(t)

	// IPv6 off: the veth's filters are re-installed without IPv6.
	restart(IPv6Off)
	if show := e.tcShow(plane.VethName(a.c.ID)); strings.Contains(show, "protocol ipv6") {
		t.Errorf("IPv6 nodes left on the veth with IPv6 off:\n%s", show)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
	if _, err := echo(a.proc, "udp", at(client6, 9000)); err == nil {
		t.Error("IPv6 from the container got out with IPv6 off")
	}
	// On again: back.
	d := restart(IPv6On)
	if show := e.tcShow(plane.VethName(a.c.ID)); !strings.Contains(show, "protocol ipv6") {
		t.Errorf("no IPv6 nodes on the veth with IPv6 on again:\n%s", show)
	}
	paths(t)
	if _, err := d.Teardown(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if show := e.hostFilters(); strings.Contains(show, "flowid 1:1 ") {
		t.Errorf("container nodes left after Teardown:\n%s", show)
	}
}

func TestFilterAddrs6(t *testing.T) {
	g := func(s string) net.IPNet { return net.IPNet{IP: net.ParseIP(s), Mask: net.CIDRMask(64, 128)} }
	got, dropped := filterAddrs6([]net.IPNet{g("2001:db8::1"), g("2001:db8::1"), g("198.18.0.1"), g("2001:db8:1::5")}, net.ParseIP("fe80::1"))
	want := []string{"2001:db8::1", "2001:db8:1::5", "fe80::1"}
	if len(got) != len(want) || dropped != 0 {
		t.Fatalf("filterAddrs6 = %v (%d dropped), want %v", got, dropped, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("address %d = %v, want %s", i, got[i], want[i])
		}
	}
	if got, _ := filterAddrs6(nil, nil); len(got) != 0 {
		t.Errorf("no addresses: %v", got)
	}
	var many []net.IPNet
	for i := 0; i < tcfilter.MaxHostAddrs6+3; i++ {
		many = append(many, g(fmt.Sprintf("2001:db8::%x", i+1)))
	}
	if got, dropped := filterAddrs6(many, net.ParseIP("fe80::1")); len(got) != tcfilter.MaxHostAddrs6 || dropped != 4 {
		t.Errorf("%d addresses kept, %d dropped; want %d and 4", len(got), dropped, tcfilter.MaxHostAddrs6)
	}
}
