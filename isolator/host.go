package isolator

import "github.com/isolatord/isolatord/isolator/plane"

// Host returns the host the data plane found at Start: what every
// container's eth0 carries (address, MAC, MTU, gateways). Start sets it
// once, before any call is served, so it is read without a lock (as
// Status reads it).
func (s *Isolator) Host() plane.HostInfo { return s.host }
