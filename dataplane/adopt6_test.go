package dataplane

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestAdoptNewHostIPv6: the host's IPv6 address changes while the daemon
// is down; the restarted data plane adopts the container and leaves it
// consistent: its eth0 carries the new address and not the old one, TCP
// and UDP over the new address work every way (outside, host process
// over its address and ::1, the container to both), and a datagram the
// container sends from the old address (put back by a hostile tenant) is
// dropped as source_ip.
func TestAdoptNewHostIPv6(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnvWith(t, IPv6On, sandbox.WithIPv6())
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	serveIn(t, e.sb.Client, "[::]:9000", "client")
	serveIn(t, e.sb.Host, "[::]:7000", "host")
	old, client6 := e.sb.HostIP6, e.sb.ClientIP6
	at := func(ip net.IP, p int) string { return net.JoinHostPort(ip.String(), fmt.Sprint(p)) }
	mustEcho(t, a.proc, "udp", at(client6, 9000), "client")

	// The host's address changes (same /64) while the daemon is down.
	e.d.Close()
	fresh := append(net.IP(nil), old...)
	fresh[15] = 0x33
	hh, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	heth, err := hh.LinkByName(e.sb.HostEth0)
	if err != nil {
		t.Fatal(err)
	}
	mask := net.CIDRMask(sandbox.Prefix6Len, 128)
	if err := hh.AddrAdd(heth, &netlink.Addr{IPNet: &net.IPNet{IP: fresh, Mask: mask}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	if err := hh.AddrDel(heth, &netlink.Addr{IPNet: &net.IPNet{IP: old, Mask: mask}}); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	d2 := e.newDataPlane()
	info, err := d2.PrepareHost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.IPv6) != 1 || !info.IPv6[0].IP.Equal(fresh) {
		t.Fatalf("restarted data plane: HostInfo.IPv6 = %v, want %v", info.IPv6, fresh)
	}
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.Strays(ctx, []plane.Container{a.c}); err != nil {
		t.Fatal(err)
	}

	ch, err := a.proc.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ceth, err := ch.LinkByName(ContainerEth0)
	if err != nil {
		t.Fatal(err)
	}
	as, err := ch.AddrList(ceth, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var hasFresh bool
	for _, x := range as {
		if x.IP.Equal(old) {
			t.Errorf("the container's eth0 still carries the old address %v", old)
		}
		hasFresh = hasFresh || x.IP.Equal(fresh)
	}
	if !hasFresh {
		t.Errorf("the container's eth0 lacks the new address %v: %v", fresh, as)
	}

	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, e.sb.Client, nw, at(fresh, 31000), "A")
		mustEcho(t, e.sb.Host, nw, at(fresh, 31000), "A")
		mustEcho(t, a.proc, nw, at(client6, 9000), "client")
		mustEcho(t, a.proc, nw, at(fresh, 7000), "host")
		mustEcho(t, a.proc, nw, at(net.IPv6loopback, 7000), "host")
	}
	if miss, err := d2.Check(ctx, a.c); err != nil || len(miss) != 0 {
		t.Errorf("Check after Adopt: %v %v", miss, err)
	}

	// A hostile tenant puts the old address back and sends from it.
	if err := ch.AddrAdd(ceth, &netlink.Addr{IPNet: &net.IPNet{IP: old, Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	st0, err := d2.Stats(ctx, a.c)
	if err != nil {
		t.Fatal(err)
	}
	src := traffic.WithSource(net.JoinHostPort(old.String(), "31001"))
	if _, err := echo(a.proc, "udp", at(client6, 9000), src); err == nil {
		t.Error("a datagram from the old host address got out of the container")
	}
	st1, err := d2.Stats(ctx, a.c)
	if err != nil {
		t.Fatal(err)
	}
	if st1.Dropped[tcfilter.DropSource] <= st0.Dropped[tcfilter.DropSource] {
		t.Errorf("source_ip drops %d -> %d, want a rise (all: %v)", st0.Dropped[tcfilter.DropSource], st1.Dropped[tcfilter.DropSource], st1.Dropped)
	}
}
