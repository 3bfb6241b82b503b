package containerns

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/sysctl"
)

// MTUs of a container (docs/fragments.md, "The lo path"). A veth checks
// a frame against the MTU of its receiving end (is_skb_forwardable on
// the peer), so:
//
//   - eth0, the container end of the veth, has EthMTU, the largest a
//     veth takes: the host's own datagrams, sent over lo (MTU 65,536)
//     unfragmented, reach the container whole.
//   - The host end keeps the host's MTU: the container cannot put a
//     frame larger than the wire's MTU on it (GSO packets aside, which
//     the kernel segments to the MSS the route gave), whatever it sets
//     inside.
//   - What the container sends keeps the host's MTU: IPv4 through an MTU
//     metric on the routes through eth0 (the connected one, replaced, and
//     the default one), IPv6 through eth0's net/ipv6/conf/eth0/mtu (which
//     routes without a metric go by). TCP's MSS follows from them.
//   - lo has the host's MTU, as before.
const EthMTU = 65535

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

// SetIPv6MTU writes mtu to net/ipv6/conf/<eth0>/mtu in namespace ns: the
// MTU of the container's IPv6 routes through eth0. The kernel resets it
// to the device's MTU when eth0 comes up or its MTU changes, so it is
// written after those (Configure, TurnOnIPv6, the follower). A namespace
// without IPv6 on eth0 is left alone.
func SetIPv6MTU(ns *nshandle.NS, eth0 string, mtu int) error {
	if mtu <= 0 {
		return nil
	}
	name := "net/ipv6/conf/" + eth0 + "/mtu"
	err := sysctl.In(ns, func(sd *sysctl.Dir) error {
		if !sd.HasIPv6() {
			return nil
		}
		if v, err := sd.Read(name); err == nil && v == strconv.Itoa(mtu) {
			return nil
		} else if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return sd.Write(name, strconv.Itoa(mtu))
	})
	if err != nil {
		return fmt.Errorf("container %s IPv6 MTU %d: %w", eth0, mtu, err)
	}
	return nil
}
