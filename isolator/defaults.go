package isolator

import "github.com/isolatord/isolatord/isolator/plane/rate"

// DefaultLimits are the bandwidth limits a container gets when Prepare
// gives none.
func (s *Isolator) DefaultLimits() (egress, ingress rate.Limit) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.cfg.Egress, s.cfg.Ingress
}

// SetDefaultEgress changes the default egress limit of containers prepared
// from now on (those prepared keep theirs). A limit the host cannot enforce
// (no HTB, above the link speed) is refused and the old one kept.
func (s *Isolator) SetDefaultEgress(l rate.Limit) error {
	return s.setDefault("default egress limit", &s.cfg.Egress, l)
}

// SetDefaultIngress is SetDefaultEgress for the ingress limit.
func (s *Isolator) SetDefaultIngress(l rate.Limit) error {
	return s.setDefault("default ingress limit", &s.cfg.Ingress, l)
}

func (s *Isolator) setDefault(name string, dst *rate.Limit, l rate.Limit) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if err := checkLimit(name, l, s.Host()); err != nil {
		return err
	}
	*dst = l
	return nil
}
