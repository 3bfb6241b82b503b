package containerns

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nshandle/nstest"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/netns/veth"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func mustCIDR(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return net.IPNet{IP: ip, Mask: n.Mask}
}

// hostIPv6 are the IPv6 facts of a host with two global addresses, a
// link-local one, a default route via the router's link-local address and
// a static route.
func hostIPv6() hostlink.IPv6 {
	static := mustCIDR("2001:db8:7::/48")
	return hostlink.IPv6{
		Global:    []net.IPNet{mustCIDR("2001:db8:6::1/64"), mustCIDR("2001:db8:6:1::1/64")},
		LinkLocal: mustCIDR("fe80::1/64"),
		Routes: []hostlink.Route6{
			{Gw: net.ParseIP("fe80::2"), Priority: 1024},
			{Dst: &static, Gw: net.ParseIP("fe80::2"), Priority: 100},
		},
	}
}

// readSysctl reads one sysctl inside ns.
func readSysctl(ns *nshandle.NS, name string) (v string, err error) {
	err = sysctl.In(ns, func(d *sysctl.Dir) (err error) {
		v, err = d.Read(name)
		return err
	})
	return strings.Join(strings.Fields(v), " "), err
}

// TestContainerIPv6Config: with IPv6 on, the container's eth0 carries the
// host's addresses (no DAD: none tentative, the IFA_F_NODAD flag) and no
// address of its own, lo has ::1, the routes are the host's, router
// advertisements and autoconfiguration are off; IPv6 sockets take their
// ephemeral ports from the container's ip_local_port_range.
//
// A runtime may hand over a namespace with IPv6 turned off: everywhere
// ("all"), or for new devices and lo only ("default", so eth0 too, and lo;
// "all" still 0).
func TestContainerIPv6Config(t *testing.T) {
	for name, off := range map[string][]string{
		"all":        {"net/ipv6/conf/all/disable_ipv6"},
		"default+lo": {"net/ipv6/conf/default/disable_ipv6", "net/ipv6/conf/lo/disable_ipv6"},
	} {
		t.Run("off-in-"+name, func(t *testing.T) { testContainerIPv6Config(t, off) })
	}
}

func testContainerIPv6Config(t *testing.T, off []string) {
	v6 := hostIPv6()
	host, ctr := nstest.Scratch(t), nstest.Scratch(t)
	hh, ch := nstest.Netlink(t, host), nstest.Netlink(t, ctr)
	err := sysctl.In(ctr, func(d *sysctl.Dir) error {
		for _, k := range off {
			if err := d.Write(k, "1"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := veth.Create(hh, ctr, veth.Spec{Name: "isotest6", PeerName: "eth0", MAC: testMAC, MTU: 1400}); err != nil {
		t.Fatal(err)
	}
	if v, _ := readSysctl(ctr, "net/ipv6/conf/eth0/disable_ipv6"); v != "1" {
		t.Fatalf("eth0 created with disable_ipv6 %q, want the handed-over 1", v)
	}
	ports := ephemeral.Range{Begin: 40960, End: 40975}
	cfg := Config{
		Eth0: "eth0", Addr: net.IPNet{IP: net.IPv4(198, 18, 0, 1), Mask: net.CIDRMask(24, 32)},
		MAC: testMAC, MTU: 1400, Gateway: net.ParseIP("198.18.0.2"), Ports: ports, IPv6: &v6,
	}
	cl, err := Configure(ctr, ch, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"net/ipv6/conf/all/disable_ipv6":          "0",
		"net/ipv6/conf/eth0/disable_ipv6":         "0",
		"net/ipv6/conf/lo/disable_ipv6":           "0",
		"net/ipv6/conf/all/accept_dad":            "0",
		"net/ipv6/conf/eth0/accept_dad":           "0",
		"net/ipv6/conf/eth0/accept_ra":            "0",
		"net/ipv6/conf/eth0/autoconf":             "0",
		"net/ipv6/conf/eth0/router_solicitations": "0",
		"net/ipv6/conf/eth0/addr_gen_mode":        "1",
		"net/ipv4/ip_local_port_range":            "40960 40975",
		// eth0's IPv4 settings go in the same request as its address
		// generation mode.
		"net/ipv4/conf/eth0/accept_local": "1",
		"net/ipv4/conf/eth0/arp_ignore":   "8",
		"net/ipv4/conf/lo/accept_local":   "1",
		"net/ipv4/conf/lo/route_localnet": "1",
	}
	for k, v := range want {
		got, err := readSysctl(ctr, k)
		if err != nil || got != v {
			t.Errorf("container %s = %q (%v), want %q", k, got, err, v)
		}
	}

	eth := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: cl.Eth0}}
	addrs, err := ch.AddrList(eth, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		got = append(got, a.IPNet.String())
		if a.Flags&unix.IFA_F_NODAD == 0 || a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			t.Errorf("container eth0 %s flags %#x: want nodad, not tentative", a.IPNet, a.Flags)
		}
	}
	slices.Sort(got)
	wantAddrs := []string{"2001:db8:6:1::1/64", "2001:db8:6::1/64", v6.LinkLocal.String()}
	slices.Sort(wantAddrs)
	if !slices.Equal(got, wantAddrs) {
		t.Errorf("container eth0 IPv6 addresses %v, want exactly the host's %v", got, wantAddrs)
	}
	lo := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: cl.Lo}}
	loAddrs, _ := ch.AddrList(lo, netlink.FAMILY_V6)
	if len(loAddrs) != 1 || !loAddrs[0].IP.Equal(net.IPv6loopback) {
		t.Errorf("container lo IPv6 addresses %v, want ::1", loAddrs)
	}
	routes, err := ch.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_MAIN, LinkIndex: cl.Eth0},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
	if err != nil {
		t.Fatal(err)
	}
	var rs []string
	for _, r := range routes {
		if r.Type == unix.RTN_UNICAST && r.MTU != 1400 {
			t.Errorf("container IPv6 route %v via %v: MTU metric %d, want the host's 1400 (eth0 has EthMTU)", r.Dst, r.Gw, r.MTU)
		}
		if r.Type == unix.RTN_UNICAST && r.Gw != nil {
			rs = append(rs, fmt.Sprintf("%v via %v metric %d", r.Dst, r.Gw, r.Priority))
		}
	}
	slices.Sort(rs)
	if w := []string{"2001:db8:7::/48 via fe80::2 metric 100", "::/0 via fe80::2 metric 1024"}; !slices.Equal(rs, w) {
		t.Errorf("container routes via the router %v, want %v", rs, w)
	}

	// One ip_local_port_range for both families: an IPv6 socket bound to
	// port 0 and an IPv6 connection get ports from the container's block.
	err = ctr.Do(func() error {
		for _, typ := range []int{unix.SOCK_STREAM, unix.SOCK_DGRAM} {
			for i := 0; i < 8; i++ {
				fd, err := unix.Socket(unix.AF_INET6, typ|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					return err
				}
				defer unix.Close(fd)
				if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: [16]byte(v6.Global[0].IP.To16())}); err != nil {
					return fmt.Errorf("bind [%s]:0: %w", v6.Global[0].IP, err)
				}
				sa, err := unix.Getsockname(fd)
				if err != nil {
					return err
				}
				p := sa.(*unix.SockaddrInet6).Port
				if p < int(ports.Begin) || p > int(ports.End) {
					return fmt.Errorf("IPv6 socket (type %d) got port %d outside ip_local_port_range %s", typ, p, ports)
				}
			}
		}
		// A UDP "connection" to the router picks its port at connect.
		c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: net.ParseIP("2001:db8:7::9"), Port: 9})
		if err != nil {
			return err
		}
		defer c.Close()
		if p := c.LocalAddr().(*net.UDPAddr).Port; p < int(ports.Begin) || p > int(ports.End) {
			return fmt.Errorf("IPv6 UDP connect got port %d outside %s", p, ports)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}

	// Nothing of the container's own appeared meanwhile (no autoconf, no
	// link-local from its MAC): still exactly the host's.
	addrs, _ = ch.AddrList(eth, netlink.FAMILY_V6)
	if len(addrs) != len(wantAddrs) {
		t.Errorf("container eth0 gained addresses: %v", addrs)
	}
}

// TestContainerIPv6Off: without IPv6 the namespace keeps it disabled (the
// IPv4-only configuration is unchanged).
func TestContainerIPv6Off(t *testing.T) {
	host, ctr := nstest.Scratch(t), nstest.Scratch(t)
	hh, ch := nstest.Netlink(t, host), nstest.Netlink(t, ctr)
	if _, err := veth.Create(hh, ctr, veth.Spec{Name: "isotest6", PeerName: "eth0", MAC: testMAC, MTU: 1400}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Eth0: "eth0", Addr: net.IPNet{IP: net.IPv4(198, 18, 0, 1), Mask: net.CIDRMask(24, 32)},
		MAC: testMAC, MTU: 1400, Ports: ephemeral.Range{Begin: 40960, End: 40975},
	}
	if _, err := Configure(ctr, ch, cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/eth0/disable_ipv6", "net/ipv6/conf/lo/disable_ipv6"} {
		if v, err := readSysctl(ctr, k); err != nil || v != "1" {
			t.Errorf("%s = %q (%v), want 1", k, v, err)
		}
	}
	addrs, _ := ch.AddrList(nil, netlink.FAMILY_V6)
	if len(addrs) != 0 {
		t.Errorf("IPv6 addresses with IPv6 off: %v", addrs)
	}
	if s := strings.Join(sysctlNames(sysctlsFor(cfg)), ","); !strings.Contains(s, "disable_ipv6") {
		t.Errorf("sysctls without IPv6: %s", s)
	}
}

func sysctlNames(kvs []sysctl.Setting) []string {
	var out []string
	for _, kv := range kvs {
		out = append(out, kv.Name)
	}
	return out
}
