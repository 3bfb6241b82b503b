package dataplane

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The IPv6 side of the data plane that does not depend on the tc filters:
// what PrepareHost decides and what a container's namespace looks like.

// TestIPv6ContainerNamespace: on a host with a global IPv6 address (auto
// mode), a container's eth0 gets exactly the host's IPv6 addresses (global
// and link-local, IFA_F_NODAD, none tentative), lo ::1, the host's IPv6
// default route via the router's link-local address, and its neighbour
// entry from the host's table; router advertisements, autoconfiguration
// and DAD are off; IPv6 sockets take ports from the container's block; the
// host end of the veth keeps IPv6 off.
func TestIPv6ContainerNamespace(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnvWith(t, IPv6Auto, sandbox.WithIPv6())
	if len(e.info.IPv6) != 1 || e.info.IPv6[0].String() != (&net.IPNet{IP: e.sb.HostIP6, Mask: net.CIDRMask(64, 128)}).String() {
		t.Fatalf("HostInfo.IPv6 = %v, want [%s/64]", e.info.IPv6, e.sb.HostIP6)
	}
	v6 := e.d.IPv6()
	if v6 == nil || !v6.Gateway().Equal(e.sb.RouterLL6) || !v6.LinkLocal.IP.IsLinkLocalUnicast() {
		t.Fatalf("host IPv6 facts %+v: want the default route via %v and a link-local address", v6, e.sb.RouterLL6)
	}
	// The drop sink is a host link without IPv6 (no link-local address,
	// no router solicitations into its drop program).
	hh, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	for _, name := range append([]string{tcfilter.SinkName}, sinkNames()...) {
		sink, err := hh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if sa, err := hh.AddrList(sink, netlink.FAMILY_V6); err != nil || len(sa) != 0 {
			t.Errorf("drop sink %s IPv6 addresses %v (%v), want none", name, sa, err)
		}
		if v, err := e.sb.Host.Sysctl("net/ipv4/conf/" + name + "/forwarding"); err != nil || v != "0" {
			t.Errorf("drop sink %s forwarding %q (%v), want 0", name, v, err)
		}
	}

	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)

	h, err := a.proc.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName(ContainerEth0)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(eth, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ad := range addrs {
		got = append(got, ad.IPNet.String())
		if ad.Flags&unix.IFA_F_NODAD == 0 || ad.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			t.Errorf("container eth0 %s flags %#x: want nodad and usable", ad.IPNet, ad.Flags)
		}
	}
	want := []string{e.info.IPv6[0].String(), v6.LinkLocal.String()}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("container eth0 IPv6 addresses %v, want the host's %v", got, want)
	}
	lo, _ := h.LinkByName("lo")
	loAddrs, _ := h.AddrList(lo, netlink.FAMILY_V6)
	if len(loAddrs) != 1 || !loAddrs[0].IP.Equal(net.IPv6loopback) {
		t.Errorf("container lo IPv6 addresses %v, want ::1", loAddrs)
	}
	routes, _ := h.RouteList(eth, netlink.FAMILY_V6)
	var def bool
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "::/0") && r.Gw.Equal(e.sb.RouterLL6) {
			def = true
		}
	}
	if !def {
		t.Errorf("container has no IPv6 default route via %v: %v", e.sb.RouterLL6, routes)
	}
	for k, v := range map[string]string{
		"net/ipv6/conf/all/disable_ipv6":          "0",
		"net/ipv6/conf/eth0/accept_ra":            "0",
		"net/ipv6/conf/eth0/autoconf":             "0",
		"net/ipv6/conf/eth0/accept_dad":           "0",
		"net/ipv6/conf/all/accept_dad":            "0",
		"net/ipv6/conf/eth0/router_solicitations": "0",
		"net/ipv6/conf/eth0/addr_gen_mode":        "1",
		"net/ipv6/neigh/eth0/app_solicit":         "3",
		"net/ipv6/neigh/eth0/mcast_solicit":       "0",
	} {
		if got, err := a.proc.Sysctl(k); err != nil || got != v {
			t.Errorf("container %s = %q (%v), want %s", k, got, err, v)
		}
	}

	// The router's entry comes from the host's table (the host resolved it
	// when IPv6 was turned on).
	cl, err := e.sb.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	ceth, _ := cl.LinkByName("eth0")
	cl.Close()
	routerMAC := ceth.Attrs().HardwareAddr.String()
	waitNeighbour(t, e.d, h, eth.Attrs().Index, e.sb.RouterLL6, routerMAC, "the router")

	// One port range for both families.
	err = a.proc.Do(func() error {
		for _, typ := range []int{unix.SOCK_STREAM, unix.SOCK_DGRAM} {
			fd, err := unix.Socket(unix.AF_INET6, typ|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: [16]byte(e.sb.HostIP6.To16())}); err != nil {
				return err
			}
			sa, err := unix.Getsockname(fd)
			if err != nil {
				return err
			}
			if p := sa.(*unix.SockaddrInet6).Port; p < 40960 || p > 41983 {
				return fmt.Errorf("IPv6 socket type %d got port %d outside the container's block 40960-41983", typ, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}

	// The host end of the veth: no IPv6 (no link-local address, no router
	// solicitation, no DAD); tc sees its frames all the same.
	veth := plane.VethName(a.c.ID)
	if v, err := e.sb.Host.Sysctl("net/ipv6/conf/" + veth + "/disable_ipv6"); err != nil || v != "1" {
		t.Errorf("host veth %s disable_ipv6 = %q (%v), want 1", veth, v, err)
	}
	hv, err := hh.LinkByName(veth)
	if err != nil {
		t.Fatal(err)
	}
	if as, _ := hh.AddrList(hv, netlink.FAMILY_V6); len(as) != 0 {
		t.Errorf("host veth has IPv6 addresses: %v", as)
	}
	// The container sent no neighbour or router solicitation (no DAD, no
	// router discovery, its neighbours come from the host).
	for _, c := range []string{"Icmp6OutNeighborSolicits", "Icmp6OutRouterSolicits", "Icmp6OutNeighborAdvertisements"} {
		if n := snmp6(t, a.proc, c); n != 0 {
			t.Errorf("container %s = %d, want 0", c, n)
		}
	}
	t.Logf("container Icmp6OutMLDv2Reports = %d", snmp6(t, a.proc, "Icmp6OutMLDv2Reports"))
	if st, err := e.d.Stats(context.Background(), a.c); err == nil {
		t.Logf("frames of A dropped on its veth after setup: %v", st.Dropped)
	}
}

// TestIPv6Off: with IPv6 disabled by configuration, a host with IPv6
// gives its containers none (IPv6 disabled in the namespace).
func TestIPv6Off(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnvWith(t, IPv6Off, sandbox.WithIPv6())
	if e.info.IPv6 != nil || e.d.IPv6() != nil {
		t.Fatalf("IPv6 off, yet HostInfo.IPv6 = %v", e.info.IPv6)
	}
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/eth0/disable_ipv6", "net/ipv6/conf/lo/disable_ipv6"} {
		if v, err := a.proc.Sysctl(k); err != nil || v != "1" {
			t.Errorf("container %s = %q (%v), want 1", k, v, err)
		}
	}
	h, err := a.proc.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if as, _ := h.AddrList(nil, netlink.FAMILY_V6); len(as) != 0 {
		t.Errorf("container has IPv6 addresses with IPv6 off: %v", as)
	}
	// Auto on a host without a global IPv6 address: off too.
	e4 := newEnv(t)
	if e4.info.IPv6 != nil || e4.d.IPv6() != nil {
		t.Errorf("host without IPv6: HostInfo.IPv6 = %v", e4.info.IPv6)
	}
}

// TestIPv6Required: IPv6 on by configuration and a host interface without
// a global IPv6 address: PrepareHost fails, naming the interface, and
// changes nothing (host lo keeps its MAC).
func TestIPv6Required(t *testing.T) {
	checkRootUnchanged(t)
	sb := sandbox.New(t)
	hh, err := sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	lo, _ := hh.LinkByName("lo")
	d, err := New(Config{HostNS: sb.Host.Path, IPv6: IPv6On, Logger: quietLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, err = d.PrepareHost(context.Background())
	if err == nil || !strings.Contains(err.Error(), "eth0 has no global IPv6 address") {
		t.Fatalf("PrepareHost with IPv6 required on an IPv4-only host: %v", err)
	}
	after, _ := hh.LinkByName("lo")
	if after.Attrs().HardwareAddr.String() != lo.Attrs().HardwareAddr.String() {
		t.Errorf("failed PrepareHost changed lo's MAC: %s -> %s", lo.Attrs().HardwareAddr, after.Attrs().HardwareAddr)
	}
}

func TestIPv6ModeString(t *testing.T) {
	for m, s := range map[IPv6Mode]string{IPv6Auto: "auto", IPv6On: "on", IPv6Off: "off"} {
		if m.String() != s {
			t.Errorf("%d.String() = %q, want %q", m, m.String(), s)
		}
	}
}

// TestIPv6NamespaceCarriesTraffic proves the container side of IPv6 end to
// end with stand-in filters: the container's host veth gets, instead of the
// data plane's filters (which drop IPv6 until they steer it), ones that
// send its IPv6 to eth0 (or to the host's lo for the host's address and
// ::1), and eth0 and lo ones that send TCP and UDP to the container's ports
// to the veth. Then the client reaches the container's server over IPv6,
// and the container the client's, by the container's addresses, MAC,
// routes and neighbour entries alone (the container sends no neighbour
// solicitation: the syncer gives it the client's entry), and the host
// reaches it over the host's address and ::1. The filters are the least
// the data plane's IPv6 filters must do; TestTwoContainersTrafficIPv6
// checks those.
func TestIPv6NamespaceCarriesTraffic(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnvWith(t, IPv6Auto, sandbox.WithIPv6())
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	serveIn(t, e.sb.Client, net.JoinHostPort(e.sb.ClientIP6.String(), "9000"), "client")
	veth := plane.VethName(a.c.ID)
	tc := func(args ...string) { e.sb.Host.Run(t, "tc", args...) }
	tc("qdisc", "del", "dev", veth, "ingress")
	tc("qdisc", "add", "dev", veth, "clsact")
	tc("filter", "add", "dev", veth, "ingress", "prio", "100", "protocol", "ipv6", "u32", "match", "u32", "0", "0",
		"action", "mirred", "egress", "redirect", "dev", e.sb.HostEth0)
	for _, proto := range []string{"6", "17"} {
		for _, dport := range [][2]string{{"31000", "0xffff"}, {"40960", "0xfc00"}} {
			tc("filter", "add", "dev", e.sb.HostEth0, "ingress", "prio", "100", "protocol", "ipv6", "u32",
				"match", "ip6", "protocol", proto, "0xff", "match", "ip6", "dport", dport[0], dport[1],
				"action", "mirred", "egress", "redirect", "dev", veth)
		}
	}
	before := clientSolicits(t, e)
	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, e.sb.Client, nw, net.JoinHostPort(e.sb.HostIP6.String(), "31000"), "A")
		mustEcho(t, a.proc, nw, net.JoinHostPort(e.sb.ClientIP6.String(), "9000"), "client")
	}
	if n := clientSolicits(t, e) - before; n > 2 {
		t.Errorf("the client received %d neighbour solicitations during the exchange, want the host's at most", n)
	}
	if st := e.d.NeighStats(); st.Pushed == 0 {
		t.Errorf("neighbour syncer stats %+v: the container got no entry from it", st)
	}

	// Host -> container over the host's address: host lo -> veth ->
	// container eth0, which accepts a packet whose source is its own
	// address (IPv6 has no accept_local to set); the reply, to its own
	// address, leaves through its lo -> eth0 -> host veth -> host lo.
	host6 := e.sb.HostIP6.String() + "/128"
	tc("filter", "add", "dev", veth, "ingress", "prio", "99", "protocol", "ipv6", "u32",
		"match", "ip6", "dst", host6, "action", "mirred", "ingress", "redirect", "dev", "lo")
	for _, proto := range []string{"6", "17"} {
		tc("filter", "add", "dev", "lo", "ingress", "prio", "100", "protocol", "ipv6", "u32",
			"match", "ip6", "protocol", proto, "0xff", "match", "ip6", "dst", host6, "match", "ip6", "dport", "31000", "0xffff",
			"action", "mirred", "egress", "redirect", "dev", veth)
		a.proc.Run(t, "tc", "filter", "add", "dev", "lo", "ingress", "prio", "100", "protocol", "ipv6", "u32",
			"match", "ip6", "protocol", proto, "0xff", "match", "ip6", "src", host6, "match", "ip6", "sport", "31000", "0xffff",
			"action", "mirred", "egress", "redirect", "dev", ContainerEth0)
	}
	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, e.sb.Host, nw, net.JoinHostPort(e.sb.HostIP6.String(), "31000"), "A")
	}

	// Host -> container over ::1: host lo -> veth -> container eth0 ->
	// its lo (a packet to ::1 is taken only on a loopback device), which
	// has ::1; the reply goes lo -> eth0 -> host veth -> host lo.
	tc("filter", "add", "dev", veth, "ingress", "prio", "98", "protocol", "ipv6", "u32",
		"match", "ip6", "dst", "::1/128", "action", "mirred", "ingress", "redirect", "dev", "lo")
	a.proc.Run(t, "tc", "filter", "add", "dev", ContainerEth0, "ingress", "prio", "100", "protocol", "ipv6", "u32",
		"match", "ip6", "dst", "::1/128", "action", "mirred", "ingress", "redirect", "dev", "lo")
	for _, proto := range []string{"6", "17"} {
		tc("filter", "add", "dev", "lo", "ingress", "prio", "100", "protocol", "ipv6", "u32",
			"match", "ip6", "protocol", proto, "0xff", "match", "ip6", "dst", "::1/128", "match", "ip6", "dport", "31000", "0xffff",
			"action", "mirred", "egress", "redirect", "dev", veth)
		a.proc.Run(t, "tc", "filter", "add", "dev", "lo", "ingress", "prio", "100", "protocol", "ipv6", "u32",
			"match", "ip6", "protocol", proto, "0xff", "match", "ip6", "src", "::1/128", "match", "ip6", "sport", "31000", "0xffff",
			"action", "mirred", "egress", "redirect", "dev", ContainerEth0)
	}
	for _, nw := range []string{"tcp", "udp"} {
		mustEcho(t, e.sb.Host, nw, "[::1]:31000", "A")
	}
}

// TestIPv6NeighboursAfterRestart: a container's IPv6 neighbour requests
// are served through the data plane (its datagram to the client makes it
// ask; the syncer gives it the client's entry, with no solicitation of its
// own on the wire), and again by a restarted data plane that adopted it.
func TestIPv6NeighboursAfterRestart(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnvWith(t, IPv6Auto, sandbox.WithIPv6())
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	cl, err := e.sb.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	ceth, _ := cl.LinkByName("eth0")
	cl.Close()
	clientMAC := ceth.Attrs().HardwareAddr.String()
	h, err := a.proc.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, _ := h.LinkByName(ContainerEth0)
	ask := func(d *DataPlane, when string) {
		t.Helper()
		h.NeighDel(&netlink.Neigh{LinkIndex: eth.Attrs().Index, Family: netlink.FAMILY_V6, IP: e.sb.ClientIP6})
		err := a.proc.Do(func() error {
			u, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: e.sb.ClientIP6, Port: 9})
			if err != nil {
				return err
			}
			defer u.Close()
			_, err = u.Write([]byte("x"))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		waitNeighbour(t, d, h, eth.Attrs().Index, e.sb.ClientIP6, clientMAC, when+": the client")
	}
	ask(e.d, "first run")
	if n := snmp6(t, a.proc, "Icmp6OutNeighborSolicits"); n != 0 {
		t.Errorf("the container sent %d neighbour solicitations", n)
	}

	ctx := context.Background()
	d2 := e.newDataPlane()
	info, err := d2.PrepareHost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.IPv6) != 1 || !info.IPv6[0].IP.Equal(e.sb.HostIP6) {
		t.Errorf("restarted data plane: HostInfo.IPv6 = %v", info.IPv6)
	}
	e.d.Close() // the old daemon is gone
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.Strays(ctx, []plane.Container{a.c}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 5*time.Second, "the adopted container's neighbour requests served", func() bool { return d2.neigh.Serves(a.c.ID) })
	ask(d2, "after restart")
	if n := snmp6(t, a.proc, "Icmp6OutNeighborSolicits"); n != 0 {
		t.Errorf("the container sent %d neighbour solicitations", n)
	}
}

// waitNeighbour waits until the container (handle h, eth0 index idx) has
// a permanent entry ip -> mac (what names it), which only the data plane's
// neighbour syncer writes.
func waitNeighbour(t *testing.T, d *DataPlane, h *netlink.Handle, idx int, ip net.IP, mac, what string) {
	t.Helper()
	var ns []netlink.Neigh
	ok := wait.Until(5*time.Second, func() bool {
		ns, _ = h.NeighList(idx, netlink.FAMILY_V6)
		return slices.ContainsFunc(ns, func(n netlink.Neigh) bool {
			return n.IP.Equal(ip) && n.HardwareAddr.String() == mac && n.State == netlink.NUD_PERMANENT
		})
	})
	if !ok {
		t.Fatalf("%s: no permanent entry %v -> %s in the container: %v (stats %+v)", what, ip, mac, ns, d.NeighStats())
	}
}

// TestShareIPv6Trims: a host with more global addresses than the filters
// match shares the first ones only, with containers and filters alike.
func TestShareIPv6Trims(t *testing.T) {
	d := &DataPlane{log: quietLogger(t)}
	v6 := &hostlink.IPv6{LinkLocal: net.IPNet{IP: net.ParseIP("fe80::1"), Mask: net.CIDRMask(64, 128)}}
	for i := range tcfilter.MaxHostAddrs6 + 4 {
		v6.Global = append(v6.Global, net.IPNet{IP: net.ParseIP(fmt.Sprintf("2001:db8:%x::1", i+1)), Mask: net.CIDRMask(64, 128)})
	}
	addrs := d.shareIPv6(v6)
	if len(addrs) != tcfilter.MaxHostAddrs6 || len(v6.Global) != tcfilter.MaxHostAddrs6 || v6.LinkLocal.IP != nil {
		t.Fatalf("shared %d addresses, containers get %d global and link-local %v; want %d, %d and none",
			len(addrs), len(v6.Global), v6.LinkLocal.IP, tcfilter.MaxHostAddrs6, tcfilter.MaxHostAddrs6)
	}
	for i, a := range addrs {
		if !a.Equal(v6.Global[i].IP) {
			t.Errorf("filters match %v, containers get %v", a, v6.Global[i].IP)
		}
	}
	few := &hostlink.IPv6{Global: v6.Global[:2], LinkLocal: net.IPNet{IP: net.ParseIP("fe80::1"), Mask: net.CIDRMask(64, 128)}}
	if got := d.shareIPv6(few); len(got) != 3 || len(few.Global) != 2 || few.LinkLocal.IP == nil {
		t.Errorf("two addresses and a link-local one: filters match %v, containers get %v %v", got, few.Global, few.LinkLocal)
	}
}
