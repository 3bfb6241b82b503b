package tcfilter

// The shaper exit's IPv6 nodes.

import (
	"net"

	"github.com/vishvananda/netlink/nl"
)

// nodes6 are the shaper exit's IPv6 nodes (none without host IPv6
// addresses), the twins of the IPv4 ones: ICMPv6 -> host eth0;
// destination a host address or ::1 -> host lo; anything else -> host
// eth0. The veth decided what may pass; this only forwards.
func (x ShaperExit) nodes6() []node {
	if len(x.HostIP6) == 0 {
		return nil
	}
	c := ClassID(x.Slot)
	ns := []node{{prio: PrioIP6, handle: 1, classid: c, sel: sel(nl.TC_U32_TERMINAL, nextHdrKey(ipprotoICMPv6)),
		act: actRedirect, target: x.Eth0, kind: KindICMP}}
	for i, a := range append(append([]net.IP(nil), x.HostIP6...), net.IPv6loopback) {
		ns = append(ns, node{prio: PrioIP6, handle: uint32(2 + i), classid: c,
			sel: sel(nl.TC_U32_TERMINAL, addr6Keys(ip6Dst, a)...), act: actRedirect, target: x.Lo})
	}
	return withKinds(append(ns, node{prio: PrioIP6, handle: 0x40, classid: c, sel: sel(nl.TC_U32_TERMINAL),
		act: actRedirect, target: x.Eth0}))
}
