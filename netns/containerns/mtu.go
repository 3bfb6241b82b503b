package containerns

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/hostlink"
)

// MTUs of a container (docs/fragments.md, "The lo path"). A veth checks
// a frame against the MTU of its receiving end (is_skb_forwardable on
// the peer), so:
//
//   - eth0, the container end of the veth, has EthMTU, the largest a
//     veth takes: the host's own datagrams, sent over lo (MTU 65,536)
//     unfragmented, reach the container whole.
//   - The host end has the host's MTU, or with the wire guard EthMTU (so
//     the container's lo paths carry whole datagrams); then the guard at
//     host eth0's egress keeps frames larger than the wire's MTU, GSO
//     packets included, off the wire, whatever the container sets inside.
//   - What the container sends keeps the host's MTU: an MTU metric on
//     its routes through eth0, IPv4 (the connected one, replaced, and the
//     default one) and IPv6 (the prefix routes of its addresses, replaced,
//     and the host's routes). TCP's MSS follows from them. Not IPv6's
//     net/ipv6/conf/eth0/mtu: the kernel resets that to the device's MTU
//     at every carrier change (addrconf_notify, NETDEV_CHANGE), and with
//     it the metrics equal to it (rt6_mtu_change). Routes the kernel adds
//     itself (IPv4 broadcast, IPv6 ff00::/8) keep eth0's MTU: a
//     broadcast or multicast datagram over the host's MTU is dropped at
//     the host veth instead of being fragmented.
//   - lo has the host's MTU, or LoMTU (Config.LoMTU) when the host's
//     wire guard is on (package tcfilter/wirebpf): then the host end has
//     EthMTU too, so the container's datagrams to 127.0.0.1, ::1 and the
//     host's addresses cross the veth unfragmented to the host's lo, and
//     the guard drops whatever frame larger than the wire's MTU its
//     filters would send out through host eth0.
const EthMTU = 65535

// LoMTU is the container lo's MTU with the host's wire guard on: the
// host lo's.
const LoMTU = 65536

// syncRoutes4 gives eth's connected route (the kernel's one for want's
// address) and its default route want's MTU as a metric, or removes the
// default route (no gateway or no address).
func syncRoutes4(h *netlink.Handle, eth netlink.Link, want Host4) error {
	if err := connectedMTU4(h, eth.Attrs().Index, want.Addr, want.MTU); err != nil {
		return err
	}
	return syncDefault4(h, eth, want)
}

// connectedMTU4 replaces the connected route the kernel made for addr on
// link idx by the same route with an MTU metric (nothing for a /32,
// which has none, or no address).
func connectedMTU4(h *netlink.Handle, idx int, addr net.IPNet, mtu int) error {
	if addr.IP == nil || mtu <= 0 {
		return nil
	}
	ones, bits := addr.Mask.Size()
	if ones >= bits || bits != 32 {
		return nil
	}
	dst := &net.IPNet{IP: addr.IP.To4().Mask(addr.Mask), Mask: addr.Mask}
	r := &netlink.Route{LinkIndex: idx, Dst: dst, Src: addr.IP.To4(), Scope: netlink.SCOPE_LINK,
		Protocol: unix.RTPROT_KERNEL, MTU: mtu}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("container connected route %s MTU %d: %w", dst, mtu, err)
	}
	return nil
}

// ip6RoutePrioAddrconf is the metric of the prefix route the kernel
// adds with an IPv6 address (IP6_RT_PRIO_ADDRCONF).
const ip6RoutePrioAddrconf = 256

// prefixMTU6 replaces the prefix route the kernel made for each of eth0's
// IPv6 addresses (link idx) by the same route with an MTU metric. The
// kernel deletes it with the address all the same (cleanup_prefix_route
// finds it by prefix and device).
func prefixMTU6(h *netlink.Handle, idx int, v6 *hostlink.IPv6, mtu int) error {
	if mtu <= 0 {
		return nil
	}
	for _, a := range addrs6(v6) {
		ones, bits := a.Mask.Size()
		if ones >= bits || bits != 128 {
			continue
		}
		dst := &net.IPNet{IP: a.IP.Mask(a.Mask), Mask: a.Mask}
		r := &netlink.Route{LinkIndex: idx, Family: netlink.FAMILY_V6, Dst: dst, Protocol: unix.RTPROT_KERNEL,
			Priority: ip6RoutePrioAddrconf, MTU: mtu}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("container IPv6 prefix route %s MTU %d: %w", dst, mtu, err)
		}
	}
	return nil
}
