package nsstats

// Sockets holding local ports (BoundHere): what isolatord asks before it
// gives a host port to a container, to name the host process that already
// holds it.
//
// One SOCK_DIAG_BY_FAMILY dump per protocol and family, filtered by the
// kernel on the local port (portFilter), in every state: for TCP that takes
// in LISTEN, connections (TIME_WAIT ones too: they also make a bind fail),
// and sockets that are bound but neither listening nor connected (the
// kernel reports those, since Linux 6.7, only when asked for
// TCP_BOUND_INACTIVE, and gives them that state); for UDP, bound sockets
// (TCP_CLOSE) and connected ones (ESTABLISHED). The owner is the socket's
// inode (inet_diag_msg.idiag_inode, 0 for TIME_WAIT and request sockets);
// ProcessOf maps it to a process through /proc/PID/fd.

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/nlbatch/nlattr"
)

// BoundHere lists the TCP and UDP sockets of the calling thread's network
// namespace whose local port is one of ports (at most MaxConnPorts), in any
// state. The calling goroutine must be locked to its thread.
func BoundHere(ports ...uint16) ([]Bound, error) {
	if len(ports) == 0 || len(ports) > MaxConnPorts {
		return nil, fmt.Errorf("nsstats: %d local ports: give 1 to %d", len(ports), MaxConnPorts)
	}
	return dumpSockets(portFilter(ports), anyState, anyState, parseBound)
}

// parseBound reads one inet_diag_msg (and its INET_DIAG_SKV6ONLY attribute).
func parseBound(m []byte, proto uint8) (Bound, error) {
	c, err := parseConn(m, proto)
	if err != nil {
		return Bound{}, err
	}
	ne := binary.NativeEndian
	b := Bound{Proto: proto, State: c.State, Local: c.Local, IPv6: m[0] == unix.AF_INET6,
		UID: ne.Uint32(m[offsetDiagUID:]), Inode: ne.Uint32(m[offsetDiagInode:])}
	if v := nlattr.Get(m[sizeofInetDiagMsg:], inetDiagSKV6Only); len(v) > 0 {
		b.V6Only = v[0] != 0
	}
	return b, nil
}
