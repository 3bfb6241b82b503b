package isolator

import "github.com/isolatord/isolatord/isolator/plane"

// HostFollower is a DataPlane that follows the host's interface at run
// time: it calls fn with the host's facts after each change it applied
// to the containers (new address, gateway, MTU, MAC, IPv6 addresses).
type HostFollower interface {
	OnHostChange(fn func(plane.HostInfo))
}

// Host returns the host the data plane found at Start, or as it follows
// it since (HostFollower): what every container's eth0 carries (address,
// MAC, MTU, gateways). It takes no lock (as Status reads it).
func (s *Isolator) Host() plane.HostInfo {
	if h := s.host.Load(); h != nil {
		return *h
	}
	return plane.HostInfo{}
}

// followHost makes the host Host reports follow the data plane's changes
// (when it follows the host): what preparation found and changed
// (features, originals, link speed, shaping queue) stays.
func (s *Isolator) followHost() {
	f, ok := s.dp.(HostFollower)
	if !ok {
		return
	}
	f.OnHostChange(func(now plane.HostInfo) {
		h := s.Host()
		h.Eth0, h.Lo, h.IP, h.MAC, h.MTU, h.Gateway = now.Eth0, now.Lo, now.IP, now.MAC, now.MTU, now.Gateway
		h.IPv6, h.Gateway6 = now.IPv6, now.Gateway6
		s.host.Store(&h)
		s.log.Info("host changed; containers follow", "eth0", h.Eth0, "ip", h.IP.String(), "mtu", h.MTU, "gateway", h.Gateway)
	})
}
