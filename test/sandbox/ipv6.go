package sandbox

import (
	"fmt"
	"net"
	"time"

	"github.com/isolatord/isolatord/test/wait"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Option configures New and NewNamed.
type Option func(*Sandbox)

// RouterLinkLocal6 is the client's link-local address in a sandbox WithIPv6, the
// host's IPv6 default gateway.
const RouterLinkLocal6 = "fe80::2"

// Prefix6Len is the prefix length of the host–client link's IPv6 subnet.
const Prefix6Len = 64

// WithIPv6 gives the sandbox IPv6 besides IPv4, from the documentation
// prefix, with a /64 of its own:
//
//	client eth0 2001:db8:<unique>::2/64 and its link-local address
//	host   eth0 2001:db8:<unique>::1/64, default via the client's
//	            link-local address (a router's, as on a real host)
//
// Duplicate address detection is off on both ends (and the addresses are
// added with IFA_F_NODAD), so every address is usable at once.
func WithIPv6() Option { return func(s *Sandbox) { s.ipv6 = true } }

// setIPv6Addrs picks the sandbox's /64 from its random name bytes.
func (s *Sandbox) setIPv6Addrs(rnd [3]byte) {
	base := net.IP{0x20, 0x01, 0x0d, 0xb8, rnd[0], rnd[1], 0, rnd[2], 0, 0, 0, 0, 0, 0, 0, 0}
	s.HostIP6 = append(net.IP(nil), base...)
	s.HostIP6[15] = 1
	s.ClientIP6 = append(net.IP(nil), base...)
	s.ClientIP6[15] = 2
}

// IPv6Net is the sandbox's IPv6 subnet with the host's address.
func (s *Sandbox) IPv6Net() net.IPNet {
	return net.IPNet{IP: s.HostIP6, Mask: net.CIDRMask(Prefix6Len, 128)}
}

// noDAD turns duplicate address detection off on both eth0s before they
// come up (their link-local addresses are then usable at once).
func (s *Sandbox) noDAD() error {
	for _, n := range []NS{s.Host, s.Client} {
		err := n.Do(func() error {
			for _, k := range []string{"net/ipv6/conf/eth0/accept_dad", "net/ipv6/conf/all/accept_dad"} {
				if err := writeSysctl(k, "0"); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return nil
}

// configureIPv6 adds the IPv6 addresses and the host's default route via
// the client's link-local address (both links are up).
func (s *Sandbox) configureIPv6(hostNL, clientNL *netlink.Handle) error {
	add := func(h *netlink.Handle, ip net.IP) (netlink.Link, error) {
		l, err := h.LinkByName("eth0")
		if err != nil {
			return nil, err
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(Prefix6Len, 128)}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(l, a); err != nil {
			return nil, fmt.Errorf("eth0 add %s: %w", a.IPNet, err)
		}
		return l, nil
	}
	hl, err := add(hostNL, s.HostIP6)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	cl, err := add(clientNL, s.ClientIP6)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	// The router's link-local address: a fixed one, so it is there (and
	// not tentative) now, whatever the kernel generates meanwhile.
	s.RouterLL6 = net.ParseIP(RouterLinkLocal6)
	ll := &netlink.Addr{IPNet: &net.IPNet{IP: s.RouterLL6, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
	if err := clientNL.AddrAdd(cl, ll); err != nil {
		return fmt.Errorf("client eth0 add %s: %w", ll.IPNet, err)
	}
	if err := waitLinkLocal(hostNL, hl); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	r := &netlink.Route{
		LinkIndex: hl.Attrs().Index, Gw: s.RouterLL6,
		Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
	}
	if err := hostNL.RouteAdd(r); err != nil {
		return fmt.Errorf("host IPv6 default route via %s: %w", s.RouterLL6, err)
	}
	return nil
}

// waitLinkLocal waits (bounded) until link l has a usable link-local
// address, as a real host's interface has: the kernel makes it when the
// link comes up, and it is tentative until the (immediate, DAD being off)
// check is done.
func waitLinkLocal(h *netlink.Handle, l netlink.Link) error {
	var addrs []netlink.Addr
	var err error
	ok := wait.Until(5*time.Second, func() bool {
		if addrs, err = h.AddrList(l, netlink.FAMILY_V6); err != nil {
			return true
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
				return true
			}
		}
		return false
	})
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("eth0 has no usable link-local address after 5s: %v", addrs)
	}
	return nil
}
