// Package nsstats reads the TCP and SNMP statistics of a network namespace
// from inside it, without forking anything: the figures Mesos' port_mapping
// isolator got by spawning `mesos-network-helper statistics` per Usage call.
//
// Collect runs inside the target namespace on a locked OS thread
// (nshandle.NS.Do, whose notes say why no other goroutine ever runs in the
// container's namespace). While inside, it reads:
//
//   - /proc/thread-self/net/sockstat and sockstat6 (the thread's namespace;
//     /proc/self/net would follow the main thread instead). See Stats for
//     what the "inuse" and "tw" figures count.
//   - /proc/thread-self/net/snmp, every counter of every group.
//   - The smoothed RTT (tcp_info.tcpi_rtt) of each ESTABLISHED TCP socket,
//     and the number of LISTEN sockets, through sock_diag: a NETLINK_INET_DIAG
//     socket opened inside the namespace (a netlink socket belongs to the
//     namespace of the thread that creates it) and one SOCK_DIAG_BY_FAMILY
//     dump per address family, asking the kernel to filter by state and to
//     attach INET_DIAG_INFO. Both AF_INET and AF_INET6 are dumped: a server
//     listening on a dual-stack socket (Go's net.Listen("tcp", ":80"), for
//     one) accepts IPv4 clients on AF_INET6 sockets with v4-mapped addresses,
//     which an AF_INET-only dump (Mesos') misses.
//
// Percentiles are nearest-rank over the non-zero RTTs. Nothing is cached.
// A Collect costs about 1.5 ms (BenchmarkCollect, 200
// sockets in the namespace), most of it the kernel walking its TCP hash
// tables in the two dumps: those tables are shared by every namespace
// (unless net.ipv4.tcp_child_ehash_entries gives one its own), so the cost
// follows the host's table size more than the container's socket count.
// A family whose sockstat "inuse" is zero has no socket its dump could
// report, so that dump is skipped: a namespace without TCP sockets costs
// a tenth of it, one with IPv4 sockets alone one dump.
//
// The same sock_diag dump also serves two other readers: flows (the live
// flows of a shared port's holders) and bound (the sockets holding given
// ports and their processes, which names a host port's holder).
//
// The kernel code (namespace switches, sock_diag) is in the _linux.go files;
// the types, the parsers of /proc/net text and of inet_diag messages, and the
// port filter program build anywhere. The parsers have table tests; the
// readers are tested in a sandbox namespace (root; they skip otherwise)
// against sockets the test opens.
package nsstats

import (
	"slices"
	"time"
)

// Stats are the statistics of one network namespace.
type Stats struct {
	// TCPActive is the kernel's "inuse" count for TCP in sockstat plus
	// "inuse" for TCP6 in sockstat6 (Mesos reported the IPv4 figure alone as
	// net_tcp_active_connections). "inuse" counts the TCP sockets hashed in
	// the namespace's lookup tables: LISTEN sockets, and connections in
	// SYN_SENT, ESTABLISHED, FIN_WAIT1/2, CLOSE_WAIT, LAST_ACK and CLOSING.
	// It does not count TIME_WAIT (see TCPTimeWait), half-open SYN_RECV
	// request sockets, or sockets that are only created or bound. Use
	// Connections for the connections alone.
	TCPActive uint64
	// TCPListening is the number of TCP sockets in LISTEN (IPv4 and IPv6),
	// from sock_diag.
	TCPListening uint64
	// TCPTimeWait is sockstat's "tw": TCP connections (IPv4 and IPv6) in
	// TIME_WAIT in the namespace.
	TCPTimeWait uint64
	// RTT summarizes the smoothed RTT of ESTABLISHED TCP sockets (IPv4 and
	// IPv6); nil when no such socket has an RTT sample.
	RTT *RTT
	// SNMP holds /proc/net/snmp: group ("Ip", "Icmp", "IcmpMsg", "Tcp",
	// "Udp", "UdpLite") -> counter name (as the kernel spells it, e.g.
	// "ActiveOpens") -> value. Negative values are left out: the only one is
	// Tcp MaxConn, -1 meaning "no fixed limit".
	SNMP map[string]map[string]uint64
}

// Connections returns the TCP connections in any state but LISTEN and
// TIME_WAIT: TCPActive minus TCPListening (read a moment apart, so clamped
// at zero).
func (s Stats) Connections() uint64 {
	if s.TCPListening > s.TCPActive {
		return 0
	}
	return s.TCPActive - s.TCPListening
}

// RTT holds nearest-rank percentiles of smoothed TCP round-trip times
// (tcpi_rtt, microsecond resolution).
type RTT struct {
	P50, P90, P95, P99 time.Duration
	// Samples is the number of sockets the percentiles were computed over.
	Samples int
}

// percentiles returns nearest-rank percentiles of the non-zero values (in
// microseconds), or nil if there are none. It sorts rtts.
func percentiles(rtts []uint32) *RTT {
	rtts = slices.DeleteFunc(rtts, func(v uint32) bool { return v == 0 })
	if len(rtts) == 0 {
		return nil
	}
	slices.Sort(rtts)
	at := func(p int) time.Duration {
		// Nearest rank: the smallest value such that at least p% of the
		// values are <= it, i.e. index ceil(p*n/100)-1.
		rank := (p*len(rtts) + 99) / 100
		return time.Duration(rtts[rank-1]) * time.Microsecond
	}
	return &RTT{P50: at(50), P90: at(90), P95: at(95), P99: at(99), Samples: len(rtts)}
}
