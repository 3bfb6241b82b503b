package neighsync

import (
	"errors"
	"net"
	"net/netip"

	"github.com/isolatord/isolatord/netns/sysctl"
)

// IPv6 neighbours (NDP) are served like IPv4 ones once EnableIPv6 was
// called: a container's kernel does not multicast neighbour solicitations
// (net/ipv6/neigh/eth0 mcast_solicit=0) but asks user space
// (app_solicit=3, the same RTM_GETNEIGH hook: ndisc_solicit calls
// neigh_app_ns as arp_solicit does); the Syncer answers from the host's
// table or makes the host resolve (NTF_USE on the host's eth0: the host
// sends its own solicitation from its own address). Containers get, at
// Add, the host's IPv6 entries and the IPv6 gateway (the router's
// link-local address).

// ipv6Side is what the Syncer knows of the host's IPv6.
type ipv6Side struct {
	prefixes []netip.Prefix // on-link prefixes of the host's global addresses
	own      map[netip.Addr]bool
	gateway  netip.Addr // the IPv6 default route's gateway (zero: none)
}

// ContainerSysctls6 are the IPv6 neighbour settings of a container's eth0
// named eth0: ask user space (3 times), never the wire.
func ContainerSysctls6(eth0 string) []sysctl.Setting {
	return []sysctl.Setting{
		{Name: "net/ipv6/neigh/" + eth0 + "/app_solicit", Value: "3"},
		{Name: "net/ipv6/neigh/" + eth0 + "/mcast_solicit", Value: "0"},
	}
}

// EnableIPv6 makes the Syncer serve IPv6 neighbours too. global are the
// host's global addresses with their prefixes (their on-link prefixes are
// the only global addresses the host resolves for containers), linkLocal
// the host's link-local address (never resolved: it is the host's own),
// gateway the router's address (nil: none). Call it before the first Add:
// containers added before it get no IPv6 settings.
func (s *Syncer) EnableIPv6(global []net.IPNet, linkLocal net.IP, gateway net.IP) error {
	v := &ipv6Side{own: map[netip.Addr]bool{}}
	for _, n := range global {
		a, ok := key(n.IP)
		ones, bits := n.Mask.Size()
		if !ok || !a.Is6() || bits != 128 {
			return errors.New("neighbour sync: host IPv6 address " + n.String() + " is not an IPv6 prefix")
		}
		v.own[a] = true
		v.prefixes = append(v.prefixes, netip.PrefixFrom(a, ones).Masked())
	}
	if a, ok := key(linkLocal); ok && a.Is6() {
		v.own[a] = true
	}
	if g, ok := key(gateway); ok && g.Is6() {
		v.gateway = g
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("neighbour sync: closed")
	}
	s.v6 = v
	if v.gateway.IsValid() && s.known[v.gateway] == nil && s.resolvable(v.gateway) {
		s.kick(v.gateway)
	}
	return nil
}

// servesIPv6 reports whether IPv6 neighbours are served.
func (s *Syncer) servesIPv6() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.v6 != nil
}

// serves reports whether ip's family is served (with s.mu held).
func (s *Syncer) serves(ip netip.Addr) bool { return ip.Is4() || s.v6 != nil }

// gateways are the gateways every container gets (with s.mu held).
func (s *Syncer) gateways() []netip.Addr {
	var out []netip.Addr
	if s.gateway.IsValid() {
		out = append(out, s.gateway)
	}
	if s.v6 != nil && s.v6.gateway.IsValid() {
		out = append(out, s.v6.gateway)
	}
	return out
}

// resolvable6 reports whether the host may resolve IPv6 address ip for a
// container: a unicast neighbour on the link (a link-local address, or one
// in the on-link prefix of a host address, not its subnet-router anycast
// address) that is not the host's own.
func (s *Syncer) resolvable6(ip netip.Addr) bool {
	if s.v6 == nil || !ip.Is6() || ip.IsMulticast() || ip.IsUnspecified() || ip.IsLoopback() || s.v6.own[ip] {
		return false
	}
	if ip.IsLinkLocalUnicast() {
		return true
	}
	for _, p := range s.v6.prefixes {
		if p.Contains(ip) && ip != p.Addr() {
			return true
		}
	}
	return false
}
