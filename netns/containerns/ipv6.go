package containerns

import (
	"errors"
	"fmt"
	"net"

	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IPv6 in a container (Config.IPv6 set): eth0 carries the host's
// IPv6 addresses (global ones and its link-local one) as it carries the
// host's IPv4 address and MAC, lo carries ::1, and the routes are the
// host's. Each setting is there for a reason:
//
//   - IPv6 on (all/disable_ipv6=0, which reaches every device: a runtime
//     may have turned it off).
//   - eth0 addr_gen_mode none: no link-local address of the container's
//     own (the shared MAC would make it the host's anyway, through DAD).
//   - eth0 accept_dad=0 and all/accept_dad=0, and every address added
//     with IFA_F_NODAD: the addresses are the host's, so duplicate address
//     detection would fail (or, worse, tell the link the host's address is
//     in use); they are usable at once.
//   - eth0 accept_ra=0, autoconf=0, router_solicitations=0: the container
//     neither asks for nor learns from router advertisements; its
//     addresses and routes come from the host.
//
// The port range (net/ipv4/ip_local_port_range) is the kernel's one range
// for both families: IPv6 sockets take their ephemeral ports from it too.
//
// Sysctls are written before any link goes up, so no address is ever
// generated, no DAD probe and no router solicitation sent.
func IPv6Sysctls(eth0 string) []sysctl.Setting {
	dev := "net/ipv6/conf/" + eth0 + "/"
	return []sysctl.Setting{
		// Writing "all" sets "default" and every existing device, whatever
		// they held (addrconf_disable_ipv6): eth0 and lo need no write.
		{Name: allDisableIPv6, Value: "0"},
		{Name: "net/ipv6/conf/all/accept_dad", Value: "0"},
		{Name: dev + "accept_dad", Value: "0"},
		{Name: dev + "accept_ra", Value: "0"},
		{Name: dev + "autoconf", Value: "0"},
		{Name: dev + "router_solicitations", Value: "0"},
	}
}

// sysctlsFor is Sysctls with IPv6 left on (and set up by IPv6Sysctls) when
// cfg.IPv6 is set.
func sysctlsFor(cfg Config) []sysctl.Setting {
	base := Sysctls(cfg.Ports)
	if cfg.IPv6 == nil {
		return base
	}
	out := make([]sysctl.Setting, 0, len(base)+6)
	for _, kv := range base {
		if kv.Name != allDisableIPv6 {
			out = append(out, kv)
		}
	}
	return append(out, IPv6Sysctls(cfg.Eth0)...)
}

// preIPv6Up does the IPv6 configuration of eth0 that must precede its
// coming up, once its address generation is off (Configure's request of
// eth0's settings): the host's addresses.
func preIPv6Up(h *netlink.Handle, eth, lo netlink.Link, v6 *hostlink.IPv6) error {
	if err := addAddrs6(h, eth, v6); err != nil {
		return err
	}
	// lo came up with IPv6 on, so the kernel gave it ::1; a namespace whose
	// lo was up before IPv6 was turned on gets it here.
	one := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv6loopback, Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
	if err := h.AddrAdd(lo, one); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("container %s address ::1: %w", lo.Attrs().Name, err)
	}
	return nil
}

// postIPv6Up adds the host's IPv6 routes once eth0 is up (a route via a
// gateway needs its device up), with mtu as their MTU metric, and gives
// the kernel's prefix routes of eth0's addresses that metric too
// (mtu.go; 0: no metric).
func postIPv6Up(h *netlink.Handle, eth int, v6 *hostlink.IPv6, mtu int) error {
	if err := prefixMTU6(h, eth, v6, mtu); err != nil {
		return err
	}
	for _, r := range v6.Routes {
		if r.Dst == nil && r.Gw == nil {
			continue
		}
		nr := &netlink.Route{LinkIndex: eth, Family: netlink.FAMILY_V6, Dst: r.Dst, Gw: r.Gw, Priority: r.Priority, MTU: mtu}
		if r.Dst == nil {
			nr.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		if err := h.RouteReplace(nr); err != nil {
			return fmt.Errorf("container IPv6 route %s via %s: %w", nr.Dst, r.Gw, err)
		}
	}
	return nil
}

// addrs6 are the addresses eth0 carries: the host's global ones and its
// link-local one.
func addrs6(v6 *hostlink.IPv6) []net.IPNet {
	addrs := append([]net.IPNet(nil), v6.Global...)
	if v6.LinkLocal.IP != nil {
		addrs = append(addrs, v6.LinkLocal)
	}
	return addrs
}

// addAddrs6 gives eth the host's IPv6 addresses (existing ones are fine).
func addAddrs6(h *netlink.Handle, eth netlink.Link, v6 *hostlink.IPv6) error {
	for _, a := range addrs6(v6) {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.IP, Mask: a.Mask}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(eth, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("container %s address %s: %w", eth.Attrs().Name, addr.IPNet, err)
		}
	}
	return nil
}
