package nsstats

// Live flows of a namespace (Conn, listed by Conns in flows_linux.go).

import (
	"encoding/binary"
	"fmt"
	"net/netip"

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

// TCP states (include/net/tcp_states.h) and the layout of struct
// inet_diag_msg (linux/inet_diag.h).
const (
	tcpEstablished = 1  // TCP_ESTABLISHED
	tcpListen      = 10 // TCP_LISTEN
	tcpSynSent     = 2
	tcpSynRecv     = 3
	tcpFinWait1    = 4
	tcpFinWait2    = 5
	tcpCloseWait   = 8
	tcpLastAck     = 9
	tcpClosing     = 11
	tcpNewSynRecv  = 12

	// sizeof(struct inet_diag_msg): family, state, timer, retrans (1 byte
	// each), inet_diag_sockid (48), expires, rqueue, wqueue, uid, inode (u32).
	sizeofInetDiagMsg = 72
	offsetDiagState   = 1

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
