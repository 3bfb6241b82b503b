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
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// TCP states of Bound sockets (include/net/tcp_states.h).
const (
	StateClose         = 7  // TCP_CLOSE: a UDP socket not connected
	StateBoundInactive = 13 // TCP_BOUND_INACTIVE (Linux 6.7): a TCP socket only bound
)

const (
	inetDiagSKV6Only = 11 // INET_DIAG_SKV6ONLY: u8, the IPV6_V6ONLY flag of an AF_INET6 socket

	// offsets in struct inet_diag_msg
	offsetDiagUID   = 64
	offsetDiagInode = 68

	anyState = 0xffffffff
)

// Bound is a socket holding a local port.
type Bound struct {
	Proto  uint8          // unix.IPPROTO_TCP or unix.IPPROTO_UDP
	State  uint8          // the kernel's TCP state number (LISTEN 10, BOUND_INACTIVE 13, CLOSE 7, ...)
	Local  netip.AddrPort // v4-mapped IPv6 addresses are given as IPv4
	IPv6   bool           // an AF_INET6 socket
	V6Only bool           // AF_INET6 with IPV6_V6ONLY: does not hold the IPv4 port
	UID    uint32
	Inode  uint32
}

// Listening reports whether the socket is a TCP listener.
func (b Bound) Listening() bool { return b.Proto == unix.IPPROTO_TCP && b.State == tcpListen }

// String describes the socket, e.g. "TCP listening on 0.0.0.0:80".
func (b Bound) String() string {
	what := "UDP bound to"
	switch {
	case b.Proto != unix.IPPROTO_TCP:
	case b.Listening():
		what = "TCP listening on"
	case b.State == StateBoundInactive || b.State == StateClose:
		what = "TCP bound to"
	default:
		what = fmt.Sprintf("TCP connection (state %d) from", b.State)
	}
	return what + " " + b.Local.String()
}

// BoundHere lists the TCP and UDP sockets of the calling thread's network
// namespace whose local port is one of ports (at most MaxConnPorts), in any
// state. The calling goroutine must be locked to its thread.
func BoundHere(ports ...uint16) ([]Bound, error) {
	if len(ports) == 0 || len(ports) > MaxConnPorts {
		return nil, fmt.Errorf("nsstats: %d local ports: give 1 to %d", len(ports), MaxConnPorts)
	}
	fd, err := openDiag()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	bc := portFilter(ports)
	var out []Bound
	seq := uint32(0)
	for _, p := range []struct {
		proto  uint8
		states uint32
	}{{unix.IPPROTO_TCP, anyState}, {unix.IPPROTO_UDP, anyState}} {
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			seq++
			err := diagDump(fd, seq, family, p.proto, 0, p.states, bc, func(m []byte) error {
				b, err := parseBound(m, p.proto)
				if err == nil {
					out = append(out, b)
				}
				return err
			})
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

// parseBound reads one inet_diag_msg (and its INET_DIAG_SKV6ONLY attribute).
func parseBound(m []byte, proto uint8) (Bound, error) {
	c, err := parseConn(m, proto)
	if err != nil {
		return Bound{}, err
	}
	ne := binary.NativeEndian
	b := Bound{Proto: proto, State: c.State, Local: c.Local, IPv6: m[0] == unix.AF_INET6,
		UID: ne.Uint32(m[offsetDiagUID:]), Inode: ne.Uint32(m[offsetDiagInode:])}
	if v := attr(m[sizeofInetDiagMsg:], inetDiagSKV6Only); len(v) > 0 {
		b.V6Only = v[0] != 0
	}
	return b, nil
}

// openDiag opens a sock_diag socket in the calling thread's namespace, with
// a receive timeout.
func openDiag() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_INET_DIAG)
	if err != nil {
		return -1, fmt.Errorf("sock_diag socket: %w", err)
	}
	tv := unix.NsecToTimeval(diagTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sock_diag SO_RCVTIMEO: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sock_diag bind: %w", err)
	}
	return fd, nil
}

// Process is a process found holding a socket.
type Process struct {
	Pid  int
	Comm string // /proc/PID/comm
}

func (p Process) String() string { return fmt.Sprintf("%s (pid %d)", p.Comm, p.Pid) }

// ProcessOf finds a process holding the socket with the given inode by
// reading the fd links of every process under procRoot ("/proc" when
// empty): the first one found (several may share the socket). It returns
// false when none is found (the socket's owner is gone, or is in another
// pid namespace).
func ProcessOf(procRoot string, inode uint32) (Process, bool) {
	if procRoot == "" {
		procRoot = "/proc"
	}
	want := "socket:[" + strconv.FormatUint(uint64(inode), 10) + "]"
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return Process{}, false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := filepath.Join(procRoot, e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && l == want {
				comm, _ := os.ReadFile(filepath.Join(procRoot, e.Name(), "comm"))
				return Process{Pid: pid, Comm: strings.TrimSpace(string(comm))}, true
			}
		}
	}
	return Process{}, false
}
