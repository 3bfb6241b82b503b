package dataplane

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/tcfilter"
)

// The tc side of IPv6: every filter of the data plane (host demuxes,
// veths, containers, shaper exits) gets the host IPv6 addresses
// containers share, d.ip6 (nil: IPv6 off, no IPv6 filter anywhere): the
// global and link-local addresses of the host's IPv6 facts (ipv6.go),
// set by host preparation before the demuxes' Init.

// hostIP6 are the host IPv6 addresses the filters match.
func (d *DataPlane) hostIP6() []net.IP { return d.ip6 }

// demux6 is the IPv6 configuration of a host demux (nil: off); on eth0
// packets to a host address the demux does not look into are counted at
// the drop sink.
func (d *DataPlane) demux6(sink int) *tcfilter.IPv6Demux {
	if len(d.ip6) == 0 {
		return nil
	}
	return &tcfilter.IPv6Demux{Addrs: d.ip6, Sink: sink}
}

// ip6Tag names the IPv6 addresses the veth filters were installed with,
// and the revision of their IPv6 classifier (in the veth's alias): a
// restart re-installs the filters of a veth whose tag differs ("" without
// IPv6).
func (d *DataPlane) ip6Tag() string {
	if len(d.ip6) == 0 {
		return ""
	}
	h := sha256.New()
	h.Write([]byte{tcfilter.Veth6Revision})
	for _, a := range d.ip6 {
		h.Write(a.To16())
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// containerFilters are the filters inside a container's namespace (ch a
// handle opened there).
func (d *DataPlane) containerFilters(ch *netlink.Handle, lo, eth0 int) tcfilter.ContainerFilters {
	return tcfilter.ContainerFilters{H: ch, Lo: lo, Eth0: eth0, HostIP: d.hostIP(), HostIP6: d.hostIP6(), Obs: d.cfg.Observer}
}

// containerFiltersIn are the filters of the container whose namespace ch
// is a netlink handle in, its eth0 and lo looked up by name.
func (d *DataPlane) containerFiltersIn(ch *netlink.Handle) (tcfilter.ContainerFilters, error) {
	eth, err := ch.LinkByName(ContainerEth0)
	if err != nil {
		return tcfilter.ContainerFilters{}, fmt.Errorf("%s: %w", ContainerEth0, err)
	}
	lo, err := ch.LinkByName("lo")
	if err != nil {
		return tcfilter.ContainerFilters{}, fmt.Errorf("lo: %w", err)
	}
	return d.containerFilters(ch, lo.Attrs().Index, eth.Attrs().Index), nil
}

// shaperExit are the filters of a container's egress shaper exit xi.
func (d *DataPlane) shaperExit(xi int, slot uint16) tcfilter.ShaperExit {
	return tcfilter.ShaperExit{H: d.h, Dev: xi, Eth0: d.links.Eth0Index, Lo: d.links.LoIndex,
		HostIP: d.hostIP(), HostIP6: d.hostIP6(), Slot: slot, Obs: d.cfg.Observer}
}

// IPv6ToHost is how many IPv6 packets for the host's addresses the eth0
// demux left to the host without looking at their ports (extension
// headers, fragments, other next headers); 0 without IPv6.
func (d *DataPlane) IPv6ToHost() (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || !d.prepared || len(d.ip6) == 0 {
		return 0, nil
	}
	return d.eth0.IPv6ToHost()
}

// filterAddrs6 are the addresses the filters match, from the host's
// global IPv6 addresses and its link-local one (containers carry both:
// neighbour discovery goes from the link-local address): global ones
// first, duplicates and non-unicast ones left out, at most
// tcfilter.MaxHostAddrs6 (the rest are not shared; dropped reports how
// many). Host preparation sets d.ip6 to it when containers get IPv6.
// Deprecated and temporary addresses are already left out (hostlink).
func filterAddrs6(global []net.IPNet, linkLocal net.IP) (addrs []net.IP, dropped int) {
	seen := map[string]bool{}
	for _, ip := range append(ipsOf(global), linkLocal) {
		if ip.To16() == nil || ip.To4() != nil || ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || seen[ip.String()] {
			continue
		}
		seen[ip.String()] = true
		if len(addrs) == tcfilter.MaxHostAddrs6 {
			dropped++
			continue
		}
		addrs = append(addrs, ip.To16())
	}
	return addrs, dropped
}

func ipsOf(ns []net.IPNet) []net.IP {
	out := make([]net.IP, 0, len(ns)+1)
	for _, n := range ns {
		out = append(out, n.IP)
	}
	return out
}
