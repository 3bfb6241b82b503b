package nsstats

// Live flows of a namespace (Conns, PeerPorts): what the data plane asks
// before it moves a shared port's spread bucket away from a holder, so that
// flows the holder has sockets for keep reaching it.
//
// The sockets are listed with sock_diag from a NETLINK_INET_DIAG socket
// opened inside the namespace (on a locked thread, as Collect does), one
// SOCK_DIAG_BY_FAMILY dump per protocol (TCP, UDP) and family (AF_INET,
// AF_INET6: a dual-stack listener's IPv4 connections are AF_INET6 sockets
// with v4-mapped addresses). The kernel filters the dump itself: by state
// (idiag_states) and, when local ports are given, by an inet_diag bytecode
// program of INET_DIAG_BC_S_EQ tests (the "S" side of a socket is its
// local side), so the answer carries only the sockets asked for.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/isolatord/isolatord/nshandle"
	"golang.org/x/sys/unix"
)

// Conn is one live flow of a namespace: a TCP socket in any state but
// LISTEN, TIME_WAIT and CLOSE (SYN_SENT, SYN_RECV including request
// sockets of connections not yet accepted, ESTABLISHED, FIN_WAIT1/2,
// CLOSE_WAIT, LAST_ACK, CLOSING), or a connected UDP socket. Unconnected
// UDP sockets (the usual UDP server) have no remote side and are not flows.
type Conn struct {
	Proto  uint8          // unix.IPPROTO_TCP or unix.IPPROTO_UDP
	State  uint8          // the kernel's TCP state number (a connected UDP socket is ESTABLISHED, 1)
	Local  netip.AddrPort // v4-mapped IPv6 addresses are given as IPv4
	Remote netip.AddrPort
}

// TCP states (include/net/tcp_states.h).
const (
	tcpSynSent    = 2
	tcpSynRecv    = 3
	tcpFinWait1   = 4
	tcpFinWait2   = 5
	tcpCloseWait  = 8
	tcpLastAck    = 9
	tcpClosing    = 11
	tcpNewSynRecv = 12

	liveTCPStates = 1<<tcpEstablished | 1<<tcpSynSent | 1<<tcpSynRecv | 1<<tcpFinWait1 | 1<<tcpFinWait2 |
		1<<tcpCloseWait | 1<<tcpLastAck | 1<<tcpClosing | 1<<tcpNewSynRecv
	liveUDPStates = 1 << tcpEstablished // a connected UDP socket

	inetDiagReqBytecode = 1  // INET_DIAG_REQ_BYTECODE
	inetDiagBCJmp       = 1  // INET_DIAG_BC_JMP: always take "no"
	inetDiagBCSEq       = 11 // INET_DIAG_BC_S_EQ: local port == the next op's "no"
	sizeofBCOp          = 4  // struct inet_diag_bc_op: code, yes (u8), no (u16)

	// MaxConnPorts bounds the local ports of one Conns call: a bytecode
	// program's jumps are 16-bit (12 bytes per port).
	MaxConnPorts = 1024
)

// Conns lists the live flows (see Conn) of the network namespace at
// netnsPath whose local port is one of ports, or all of them when no port
// is given, IPv4 and IPv6, TCP then UDP. It never changes the namespace of
// the calling goroutine's thread.
func Conns(netnsPath string, ports ...uint16) ([]Conn, error) {
	if len(ports) > MaxConnPorts {
		return nil, fmt.Errorf("nsstats: %d local ports: at most %d per call", len(ports), MaxConnPorts)
	}
	var out []Conn
	err := doIn(netnsPath, func() error {
		var err error
		out, err = connsHere(ports)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PeerPorts returns the distinct remote ports, sorted, of the live flows
// (TCP and connected UDP, see Conn) whose local port is localPort in the
// namespace at netnsPath: for a server port, the source ports its clients
// connect from.
func PeerPorts(netnsPath string, localPort uint16) ([]uint16, error) {
	cs, err := Conns(netnsPath, localPort)
	if err != nil {
		return nil, err
	}
	var out []uint16
	for _, c := range cs {
		out = append(out, c.Remote.Port())
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// doIn runs fn on a fresh goroutine locked to its OS thread inside the
// namespace at netnsPath. If switching back fails the thread stays locked,
// so the runtime destroys it with the goroutine.
func doIn(netnsPath string, fn func() error) error {
	ns, err := nshandle.Open(netnsPath)
	if err != nil {
		return fmt.Errorf("nsstats: %w", err)
	}
	defer ns.Close()
	if err := ns.Do(fn); err != nil {
		return fmt.Errorf("nsstats: %s: %w", netnsPath, err)
	}
	return nil
}

// connsHere dumps the live flows of the calling thread's namespace. The
// thread must be locked.
func connsHere(ports []uint16) ([]Conn, error) {
	fd, err := openDiag()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	bc := portFilter(ports)
	var out []Conn
	seq := uint32(0)
	for _, p := range []struct {
		proto  uint8
		states uint32
	}{{unix.IPPROTO_TCP, liveTCPStates}, {unix.IPPROTO_UDP, liveUDPStates}} {
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			seq++
			err := dumpConns(fd, seq, family, p.proto, p.states, bc, func(c Conn) { out = append(out, c) })
			if err != nil {
				if family == unix.AF_INET6 && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EAFNOSUPPORT) || errors.Is(err, unix.EOPNOTSUPP)) {
					continue
				}
				return nil, fmt.Errorf("sock_diag %s %s dump: %w", protoName(p.proto), familyName(family), err)
			}
		}
	}
	return out, nil
}

func protoName(p uint8) string {
	if p == unix.IPPROTO_UDP {
		return "UDP"
	}
	return "TCP"
}

func familyName(f uint8) string {
	if f == unix.AF_INET6 {
		return "AF_INET6"
	}
	return "AF_INET"
}

// portFilter is an inet_diag bytecode program accepting sockets whose local
// port is one of ports (nil: no program, every socket). The kernel runs a
// program as jumps: an op's "yes" (u8) or "no" (u16) offset is taken, and
// the socket is accepted when a jump lands exactly on the end, rejected when
// it jumps past it. Its audit follows the "yes" chain from the start, which
// must end exactly on the end, and every "no" target must lie on that chain.
// So each port is a 12-byte block on the chain:
//
//	{S_EQ, yes 8, no 12} {0, 0, port}   match: go on to the JMP; else: next block
//	{JMP, yes 4, no to the end}         reached only on a match: accept
//
// and the last block's "no" jumps past the end (reject).
func portFilter(ports []uint16) []byte {
	if len(ports) == 0 {
		return nil
	}
	const block = 3 * sizeofBCOp
	ne := binary.NativeEndian
	n := len(ports) * block
	b := make([]byte, n)
	for i, p := range ports {
		at := i * block
		no := block
		if i == len(ports)-1 {
			no = block + sizeofBCOp // past the end
		}
		b[at], b[at+1] = inetDiagBCSEq, 2*sizeofBCOp
		ne.PutUint16(b[at+2:], uint16(no))
		ne.PutUint16(b[at+sizeofBCOp+2:], p)
		j := at + 2*sizeofBCOp
		b[j], b[j+1] = inetDiagBCJmp, sizeofBCOp
		ne.PutUint16(b[j+2:], uint16(n-j)) // to the end
	}
	return b
}

// dumpConns sends one inet_diag_req_v2 dump request (family, protocol,
// state mask, optional bytecode) and calls fn with each socket's flow.
func dumpConns(fd int, seq uint32, family, proto uint8, states uint32, bc []byte, fn func(Conn)) error {
	return diagDump(fd, seq, family, proto, 0, states, bc, func(m []byte) error {
		c, err := parseConn(m, proto)
		if err != nil {
			return err
		}
		fn(c)
		return nil
	})
}

// parseConn reads the flow of one inet_diag_msg: family and state, then
// the socket id (local port, remote port, both big endian; local and
// remote address, 16 bytes each).
func parseConn(b []byte, proto uint8) (Conn, error) {
	if len(b) < sizeofInetDiagMsg {
		return Conn{}, fmt.Errorf("short inet_diag_msg (%d bytes)", len(b))
	}
	addr := func(a []byte) netip.Addr {
		if b[0] == unix.AF_INET {
			return netip.AddrFrom4([4]byte(a[:4]))
		}
		return netip.AddrFrom16([16]byte(a[:16])).Unmap()
	}
	return Conn{
		Proto:  proto,
		State:  b[offsetDiagState],
		Local:  netip.AddrPortFrom(addr(b[8:24]), binary.BigEndian.Uint16(b[4:6])),
		Remote: netip.AddrPortFrom(addr(b[24:40]), binary.BigEndian.Uint16(b[6:8])),
	}, nil
}
