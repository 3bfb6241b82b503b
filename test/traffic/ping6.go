package traffic

import (
	"fmt"
	"net"
)

// pingFamily is what PingStats needs of an address family.
type pingFamily struct {
	network, any string // raw socket
	dst          net.IP
	reply        byte // echo reply type
	request      func(id, seq uint16) []byte
}

// pingFamilyOf picks ICMP for an IPv4 destination, ICMPv6 for an IPv6 one.
func pingFamilyOf(dst net.IP) (pingFamily, error) {
	if d4 := dst.To4(); d4 != nil {
		return pingFamily{network: "ip4:icmp", any: "0.0.0.0", dst: d4, reply: 0, request: echoRequest}, nil
	}
	if len(dst) == net.IPv6len {
		return pingFamily{network: "ip6:ipv6-icmp", any: "::", dst: dst, reply: 129, request: EchoRequest6}, nil
	}
	return pingFamily{}, fmt.Errorf("ping: %v is not an IP address", dst)
}

// EchoRequest6 builds an ICMPv6 echo request (type 128) with the same
// 16-byte payload as the IPv4 one. Its checksum is left zero: the kernel
// fills it in for raw ICMPv6 sockets (RFC 3542 §3.1).
func EchoRequest6(id, seq uint16) []byte { return echoMessage(128, id, seq) }
