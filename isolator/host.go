package isolator

import "github.com/isolatord/isolatord/isolator/plane"

// Host returns the host the data plane found at Start: what every
// container's eth0 carries (address, MAC, MTU, gateways).
func (s *Isolator) Host() plane.HostInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.host
}
