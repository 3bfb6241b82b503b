package tcfilter

// The exit (B) of a limited container's egress shaper pair: A carries the
// HTB (package shaping), B's ingress forwards by destination without
// checking, since only the veth's redirects feed A. Why a veth pair and
// not an ifb: docs/datapath.md, "Bandwidth limits".

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// ShaperExit are the filters on the ingress of the exit end (B) of a
// container's egress shaper pair: they send what the shaper let through
// where the container's veth would have sent it. ICMP -> host eth0;
// destination host IP or 127.0.0.0/8 -> host lo; anything else -> host
// eth0 (ARP too: the veth sends a limited container's ARP through the
// shaper).
type ShaperExit struct {
	H      *netlink.Handle // host namespace
	Dev    int             // the shaper's exit end (B)
	Eth0   int             // host eth0
	Lo     int             // host lo
	HostIP net.IP
	// HostIP6 are the host's IPv6 addresses: with them, IPv6 is forwarded
	// the same way (shaperexit6.go).
	HostIP6 []net.IP
	Slot    uint16 // the container's slot (classid of the nodes)
	Obs     Observer
}

func (x ShaperExit) dev() dev { return dev{h: x.H, ifindex: x.Dev, label: "shaper", obs: x.Obs} }

func (x ShaperExit) nodes() []node {
	c := ClassID(x.Slot)
	return append(withKinds([]node{
		{prio: PrioARP, handle: nodeARPRoot, classid: c, sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: x.Eth0},
		{prio: PrioIP, handle: 1, classid: c, sel: sel(nl.TC_U32_TERMINAL, protoKey(ipprotoICMP)), act: actRedirect, target: x.Eth0, kind: KindICMP},
		{prio: PrioIP, handle: 2, classid: c, sel: sel(nl.TC_U32_TERMINAL, dstKey(x.HostIP)), act: actRedirect, target: x.Lo},
		{prio: PrioIP, handle: 3, classid: c, sel: sel(nl.TC_U32_TERMINAL, dstLoopbackKey()), act: actRedirect, target: x.Lo},
		{prio: PrioIP, handle: 4, classid: c, sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: x.Eth0},
	}), x.nodes6()...)
}

// Install adds the clsact qdisc and the exit filters (it can be re-run).
func (x ShaperExit) Install() error {
	if err := checkSlot(x.Slot); err != nil {
		return err
	}
	if x.HostIP.To4() == nil {
		return fmt.Errorf("shaper exit: host IP %v is not IPv4", x.HostIP)
	}
	if err := checkAddrs6("shaper exit", x.HostIP6); err != nil {
		return err
	}
	if x.Dev <= 0 || x.Eth0 <= 0 || x.Lo <= 0 {
		return fmt.Errorf("shaper exit: ifindexes dev=%d eth0=%d lo=%d must be positive", x.Dev, x.Eth0, x.Lo)
	}
	if err := EnsureClsact(x.H, x.Dev); err != nil {
		return err
	}
	d := x.dev()
	fs, err := d.list()
	if err != nil {
		return err
	}
	return syncFixed(nil, d, x.nodes(), fs)
}
