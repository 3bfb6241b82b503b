package tcfilter

// IPv6's priority, tables, node ids and match keys (offsets from the
// network header: next header at 6, source at 8, destination at 24).

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// PrioIP6 is the u32 classifier for IPv6 (ETH_P_IPV6) on every device
// that has one: host eth0 and lo (the host demux) and the container's host
// veth (before PrioVethOther). Its nodes link into the IPv4 classifier's
// port tables (u32 tables belong to the whole hook, not to one priority),
// so one set of per-container nodes serves both families.
const PrioIP6 uint16 = 4

// Veth6Revision numbers the veth's IPv6 classifier's nodes apart from
// VethLayout: it goes into the tag of the host IPv6 addresses a veth's
// filters were installed with (its alias), so a restart re-installs the
// IPv6 classifier of a veth tagged by another revision. Bump it whenever
// the IPv6 classifier's nodes change.
const Veth6Revision = 1

// Table ids of the IPv6 classifier (below 0x800, clear of the IPv4 ones).
const (
	TableICMP6 = 0x007 // host eth0, divisor 1: ICMPv6 to a host address by type

	TableVeth6Host = 0x01a // veth, divisor 1: host MAC, source = a host IPv6 address; by next header
	TableVeth6Loop = 0x01b // veth, divisor 1: ::1 to ::1
	TableVeth6ICMP = 0x01c // veth, divisor 1 (at the ICMPv6 header): allowed ICMPv6
)

// MaxHostAddrs6 bounds the host IPv6 addresses matched by the filters
// (each one costs a few nodes per device, and a key check per packet for
// the addresses before it).
const MaxHostAddrs6 = 16

// IPv6 header offsets (from the network header) and next-header values.
const (
	ip6HeaderLen = 40
	ip6Src       = 8
	ip6Dst       = 24

	ipprotoICMPv6 = unix.IPPROTO_ICMPV6
)

// Extension headers a packet may carry before its transport header: such
// packets (fragments included) are never demultiplexed by port.
var ip6ExtHeaders = []uint8{unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_FRAGMENT, unix.IPPROTO_DSTOPTS}

// ICMPv6 types.
const (
	icmp6EchoRequest = 128
	icmp6EchoReply   = 129
	icmp6RS          = 133
	icmp6RA          = 134
	icmp6NS          = 135
	icmp6NA          = 136
	icmp6Redirect    = 137
)

func version6Key() nl.TcU32Key       { return key(0, 0xf0000000, 0x60000000) }
func nextHdrKey(p uint8) nl.TcU32Key { return key(4, 0x0000ff00, uint32(p)<<8) }

// addr6Keys match the 16-byte address at off.
func addr6Keys(off int32, ip net.IP) []nl.TcU32Key {
	a := ip.To16()
	ks := make([]nl.TcU32Key, 4)
	for i := range ks {
		w := uint32(a[4*i])<<24 | uint32(a[4*i+1])<<16 | uint32(a[4*i+2])<<8 | uint32(a[4*i+3])
		ks[i] = key(off+int32(4*i), 0xffffffff, w)
	}
	return ks
}

// icmp6TypeKey matches the ICMPv6 type and code 0 (at the ICMPv6 header).
func icmp6TypeKey(t uint8) nl.TcU32Key { return key(0, 0xffff0000, uint32(t)<<24) }

// icmp6ErrorKey matches ICMPv6 error types 0..7 (destination unreachable
// 1, packet too big 2, time exceeded 3, parameter problem 4; 0 and 5..7
// are unassigned), any code.
func icmp6ErrorKey() nl.TcU32Key { return key(0, 0xf8000000, 0) }

// eat40 makes s move the current offset past the fixed IPv6 header.
func eat40(s *nl.TcU32Sel) *nl.TcU32Sel { return fixedOffsetEat(s, ip6HeaderLen) }

// checkAddrs6 validates host IPv6 addresses.
func checkAddrs6(what string, addrs []net.IP) error {
	if len(addrs) > MaxHostAddrs6 {
		return fmt.Errorf("%s: %d host IPv6 addresses, at most %d", what, len(addrs), MaxHostAddrs6)
	}
	for _, a := range addrs {
		if a.To16() == nil || a.To4() != nil || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() {
			return fmt.Errorf("%s: host IPv6 address %v is not a unicast IPv6 address", what, a)
		}
	}
	return nil
}
