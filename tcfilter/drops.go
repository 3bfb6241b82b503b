package tcfilter

// Drop reasons and the per-container drop counts read from the sinks'
// count map (the sinks themselves: dropsinks.go; docs/datapath.md,
// "Drops").

import "github.com/vishvananda/netlink"

// Drop reasons: why a container's frame was dropped on its host veth.
const (
	DropMAC       = "mac"        // Ethernet source is not the host MAC
	DropIPHeader  = "ip_header"  // IPv4 header with options (IHL > 5), or not version 4; a frame larger than host eth0 takes (DropWire)
	DropSource    = "source_ip"  // IPv4 source is not the host IP (127.0.0.0/8 only to 127.0.0.0/8)
	DropPort      = "port"       // TCP/UDP source port the container does not own
	DropICMP      = "icmp"       // ICMP other than echo, or an error not about an own flow
	DropProtocol  = "protocol"   // IP protocol other than TCP, UDP and ICMP
	DropARP       = "arp"        // ARP other than a request in the host's name
	DropEthertype = "ethertype"  // neither IPv4, ARP nor IPv6 (LLDP, ...; IPv6 too without host IPv6 addresses), or too short to read
	DropVLAN      = "vlan"       // 802.1Q/802.1ad-tagged frame
	DropIPv6Ext   = "ipv6_ext"   // IPv6 with a hop-by-hop, routing or destination-options header, or a first fragment of anything but TCP, UDP and ICMPv6
	DropNDP       = "ndp"        // neighbour discovery other than solicitations and advertisements in the host's name
	DropMLD       = "mld"        // multicast listener reports and dones the container's kernel sends on its own (expected noise, not an attack)
	DropICMPState = "icmp_state" // ICMP/ICMPv6 error an end host does not send about its own flows (fragmentation needed, packet too big, time exceeded, redirect, parameter problem, ...): it would change how peers treat the shared address
	DropLoopback  = "loopback"   // TCP/UDP to 127.0.0.0/8 or ::1 for a port that is neither containers' nor opened with --host-loopback-ports (a host-only service)
	DropEcho      = "echo"       // echo request (IPv4 or IPv6) with an {identifier, peer} another container or the host owns, or over the container's quota of them (eth0's learn programs, echoown.go)
)

// DropReasons lists every reason, in a fixed order.
var DropReasons = []string{DropMAC, DropIPHeader, DropSource, DropPort, DropICMP, DropProtocol, DropARP, DropEthertype, DropVLAN, DropIPv6Ext, DropNDP, DropMLD, DropICMPState, DropLoopback, DropEcho}

// Drops reads how many frames the container's veth dropped, by reason
// (every reason present), from the sinks' count map (no netlink);
// ErrNoDropCounts without cls_bpf.
func (v VethFilters) Drops() (map[string]uint64, error) {
	if v.Sinks == nil {
		return zeroCounts(), ErrNoDropCounts
	}
	return v.Sinks.Counts(v.Veth)
}

// nodeKey names a node of a device: priority and handle, the node id
// alone for root nodes (the kernel numbers root tables itself).
type nodeKey struct {
	prio   uint16
	handle uint32
}

func keyOf(f *netlink.U32) nodeKey {
	htid, _, nid := SplitU32Handle(f.Handle)
	if htid >= 0x800 {
		return nodeKey{f.Priority, nid}
	}
	return nodeKey{f.Priority, f.Handle}
}
