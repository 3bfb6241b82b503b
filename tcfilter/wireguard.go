package tcfilter

import (
	"slices"

	"github.com/cilium/ebpf"
)

// DropWire is the reason host eth0's wire guard (package wirebpf) counts a
// container's frame under when it is larger than eth0 takes: a malformed
// frame, like an IP header the veth refuses.
const DropWire = DropIPHeader

// WireCounts returns a descriptor of the count map of s and the code of
// DropWire, for wirebpf.Load (nil: no count map; the caller closes it).
func (s *DropSinks) WireCounts() (*ebpf.Map, uint32, error) {
	r := uint32(slices.Index(DropReasons, DropWire))
	if !s.BPF() {
		return nil, r, nil
	}
	m, err := s.counts.Clone()
	return m, r, err
}
