package nsstats

// Sockets holding local ports (Bound, listed by BoundHere in
// bound_linux.go) and the processes holding them.

import (
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
