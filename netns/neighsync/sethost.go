package neighsync

import (
	"fmt"
	"net"
	"net/netip"
)

// SetHost follows a change of the host's IPv4 address or gateway on eth0
// at run time: onLink becomes the subnet the host resolves for
// containers, and gateway (nil: none) the gateway every container gets;
// a new gateway is given to every container served now (the host's entry,
// or resolved by the host first). Entries containers already have stay
// (the host's table still has them, or they age out there and go).
func (s *Syncer) SetHost(onLink net.IPNet, gateway net.IP) error {
	if onLink.IP.To4() == nil || onLink.Mask == nil {
		return fmt.Errorf("neighbour sync: host address %v is not an IPv4 prefix", onLink)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	n := onLink
	s.onLink = &n
	g, ok := key(gateway)
	if !ok || !g.Is4() {
		s.gateway = netip.Addr{}
		return nil
	}
	if g == s.gateway {
		return nil
	}
	s.gateway = g
	mac := s.known[g]
	for _, m := range s.ctrs {
		switch {
		case mac != nil:
			s.push(m, g, mac)
		case s.resolvable(g):
			s.wait(m, g)
		}
	}
	return nil
}
