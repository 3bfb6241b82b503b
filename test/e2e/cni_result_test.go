package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/containerns"
	"github.com/isolatord/isolatord/test/sandbox"
)

// TestCNIResultIsTheNamespaces: the eth0 an ADD reports (which the plugin
// takes from isolatord's Attach reply, without entering the namespace) is
// the one the container's namespace holds: its MAC and MTU, its addresses
// with their prefixes in the order the kernel lists them, and the
// gateways of its default routes; with IPv4 only, and with IPv6 from a
// host carrying two global IPv6 addresses.
func TestCNIResultIsTheNamespaces(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("ipv6=%v", v6), func(t *testing.T) {
			var opts []sandbox.Option
			if v6 {
				opts = append(opts, sandbox.WithIPv6())
			}
			sb := sandbox.New(t, opts...)
			if v6 {
				second := append(net.IP(nil), sb.HostIP6...)
				second[15] ^= 0x77
				h, err := sb.Host.Netlink()
				must(t, err)
				defer h.Close()
				eth0, err := h.LinkByName(sb.HostEth0)
				must(t, err)
				addr := &netlink.Addr{IPNet: &net.IPNet{IP: second, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
				must(t, h.AddrAdd(eth0, addr))
			}
			d := StartDaemon(t, sb, DaemonOptions{})
			nw := newCNINet(t, Binaries(t), d.Socket, "isolator", "1.1.0", "")
			web := startServer(t, sb, "web", 31001)
			rt := cniRuntime(sb.Name+"-web", web.NetNS, cniPortMappings(31001))
			res, err := nw.CNI.AddNetworkList(cniCtx(t), nw.List, rt)
			if err != nil {
				t.Fatalf("ADD: %v\n%s", err, d.Log())
			}
			r, err := types100.NewResultFromResult(res)
			must(t, err)
			got := resultEth0(t, r, web.NetNS)
			want := namespaceEth0(t, web.NetNS)
			if got != want {
				t.Errorf("ADD reports eth0 as\n%s\nthe namespace holds\n%s", got, want)
			}
			if n := strings.Count(want, "2001:db8:"); v6 && n != 2 {
				t.Errorf("the container's eth0 has %d global IPv6 addresses, want the host's 2:\n%s", n, want)
			}
			if err := nw.CNI.DelNetworkList(cniCtx(t), nw.List, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		})
	}
}

// resultEth0 describes the interface in sandbox netnsPath of an ADD
// result: "mac M mtu N", then each address with its prefix and gateway,
// then each default route's gateway.
func resultEth0(t *testing.T, r *types100.Result, netnsPath string) string {
	t.Helper()
	idx := -1
	for i, ifc := range r.Interfaces {
		if ifc.Name == "eth0" && ifc.Sandbox == netnsPath {
			idx = i
		}
	}
	if idx < 0 {
		t.Fatalf("no eth0 in %s in the result %+v", netnsPath, r)
	}
	s := fmt.Sprintf("mac %s mtu %d", r.Interfaces[idx].Mac, r.Interfaces[idx].Mtu)
	for _, ip := range r.IPs {
		if ip.Interface != nil && *ip.Interface == idx {
			s += fmt.Sprintf("\naddress %s gateway %v", ip.Address.String(), ip.Gateway)
		}
	}
	for _, rt := range r.Routes {
		if ones, _ := rt.Dst.Mask.Size(); ones == 0 {
			s += fmt.Sprintf("\ndefault via %s", rt.GW)
		}
	}
	return s
}

// namespaceEth0 describes eth0 in the namespace at netnsPath as
// resultEth0 describes a result's: read there over netlink, global
// addresses of each family (IPv4 first) with the gateway of that family's
// default route.
func namespaceEth0(t *testing.T, netnsPath string) string {
	t.Helper()
	h, err := sandbox.NS{Path: netnsPath}.Netlink()
	must(t, err)
	defer h.Close()
	link, err := h.LinkByName("eth0")
	must(t, err)
	gw := map[int]net.IP{}
	var defaults []string
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := h.RouteList(link, fam)
		must(t, err)
		for _, rt := range routes {
			if (rt.Dst == nil || rt.Dst.IP.IsUnspecified()) && rt.Gw != nil && gw[fam] == nil {
				gw[fam] = rt.Gw
				defaults = append(defaults, "default via "+rt.Gw.String())
			}
		}
	}
	// eth0 has containerns.EthMTU; the MTU the container sends with is
	// the one of its routes (every one through eth0 carries the host's).
	mtu := link.Attrs().MTU
	if mtu == containerns.EthMTU {
		mtu = 0
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			routes, err := h.RouteList(link, fam)
			must(t, err)
			for _, rt := range routes {
				if rt.Type == unix.RTN_UNICAST && mtu == 0 {
					mtu = rt.MTU
				} else if rt.Type == unix.RTN_UNICAST && rt.MTU != mtu {
					t.Errorf("eth0 in %s: route %v MTU %d, another one %d", netnsPath, rt.Dst, rt.MTU, mtu)
				}
			}
		}
	}
	s := fmt.Sprintf("mac %s mtu %d", link.Attrs().HardwareAddr, mtu)
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		addrs, err := h.AddrList(link, fam)
		must(t, err)
		for _, a := range addrs {
			if fam == netlink.FAMILY_V6 && !a.IP.IsGlobalUnicast() {
				continue
			}
			s += fmt.Sprintf("\naddress %s gateway %v", a.IPNet.String(), gw[fam])
		}
	}
	for _, d := range defaults {
		s += "\n" + d
	}
	return s
}
