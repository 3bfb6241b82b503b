package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

var (
	host6   = net.ParseIP("2001:db8::1")
	client6 = net.ParseIP("2001:db8::2")
)

func addAddr6(t testing.TB, ns sandbox.NS, ifname string, ip net.IP) {
	t.Helper()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatalf("add %v: %v", ip, err)
	}
	waitLocal6(t, h, ip)
}

// waitLocal6 waits until ip is a local address of h's namespace: even
// without DAD, the kernel makes a new address usable (its local route)
// in deferred work, which a busy machine runs seconds later.
func waitLocal6(t testing.TB, h *netlink.Handle, ip net.IP) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rs, err := h.RouteGet(ip)
		if err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v not a local address after 10s (%v %v)", ip, rs, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newEnv6 is newEnv on a sandbox whose host and client have IPv6
// addresses, with a data plane whose filters match the host's.
func newEnv6(t *testing.T) *env {
	t.Helper()
	sb := sandbox.New(t)
	addAddr6(t, sb.Host, sb.HostEth0, host6)
	addAddr6(t, sb.Client, "eth0", client6)
	e := &env{t: t, sb: sb, ops: new(atomic.Int64), errs: new(atomic.Int64)}
	e.d = e.newDataPlane() // host preparation shares the host's IPv6 addresses
	var err error
	if e.info, err = e.d.PrepareHost(context.Background()); err != nil {
		t.Fatalf("PrepareHost: %v", err)
	}
	return e
}

// ipv6Inside gives a plumbed container what the namespace side gives it:
// IPv6 on, the host address on eth0 without DAD, and the client as
// neighbour.
func ipv6Inside(t *testing.T, p *sandbox.Container, clientMAC net.HardwareAddr) {
	t.Helper()
	if err := p.Do(func() error {
		for _, kv := range [][2]string{
			{"net/ipv6/conf/eth0/addr_gen_mode", "1"},
			{"net/ipv6/conf/eth0/accept_ra", "0"},
			{"net/ipv6/conf/all/disable_ipv6", "0"},
			{"net/ipv6/conf/eth0/disable_ipv6", "0"},
			{"net/ipv6/conf/lo/disable_ipv6", "0"},
		} {
			if err := os.WriteFile("/proc/sys/"+kv[0], []byte(kv[1]), 0o644); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	h, err := p.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	// The namespace side gave it the address already (the data plane
	// shares the sandbox host's IPv6).
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: host6, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil && !errors.Is(err, unix.EEXIST) {
		t.Fatal(err)
	}
	waitLocal6(t, h, host6)
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V6,
		State: netlink.NUD_PERMANENT, IP: client6, HardwareAddr: clientMAC}); err != nil {
		t.Fatal(err)
	}
}

// TestIPv6Filters: with host IPv6 addresses, Setup gives a container
// IPv6 filters on every device: the outside reaches its ports over IPv6,
// it reaches the outside and the host, an unowned source port is dropped
// and counted in Stats; a restarted data plane adopts it with traffic
// flowing; with other addresses the adopted veth's filters are
// re-installed; Teardown leaves no IPv6 node of the container.
func TestIPv6Filters(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv6(t)
	ch, err := e.sb.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := ch.LinkByName("eth0")
	ch.Close()
	if err != nil {
		t.Fatal(err)
	}
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31001)
	ipv6Inside(t, a.proc, cl.Attrs().HardwareAddr)
	serveIn(t, a.proc, "[::]:31000", "A")
	serveIn(t, e.sb.Client, "[::]:9000", "client")
	serveIn(t, e.sb.Host, "[::]:7000", "host")
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

	// A restarted data plane with the same addresses adopts A as it is.
	before := e.hostState()
	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if after := e.hostState(); after != before {
		t.Errorf("restart + Adopt changed the host:\n%s", lineDiff(before, after))
	}
	paths(t)

	// One with another address list re-installs the veth's filters.
	// (in another /64, so that the host's wildcard UDP server keeps
	// answering the client from host6, the longer match; not deprecated,
	// or the host would not share it)
	other := net.ParseIP("2001:db8:1::77")
	e.sb.Host.Run(t, "ip", "-6", "addr", "add", other.String()+"/64", "dev", e.sb.HostEth0, "nodad")
	d3 := e.newDataPlane()
	if _, err := d3.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d3.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if show := e.tcShow(VethName(a.c.ID)); !strings.Contains(show, "00000077/ffffffff at 20") {
		t.Errorf("the adopted veth does not match the new address:\n%s", show)
	}
	paths(t)
	e.d = d3
	if _, err := d3.Teardown(ctx, a.c); err != nil {
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
