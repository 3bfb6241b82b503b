package nsstats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/nlbatch/nlattr"
)

// sock_diag constants and layouts (linux/inet_diag.h, linux/tcp.h).
const (
	inetDiagInfo = 2 // INET_DIAG_INFO: attribute carrying struct tcp_info

	// sizeof(struct inet_diag_req_v2): family, protocol, ext, pad (1 byte
	// each), states (u32), inet_diag_sockid (48 bytes).
	sizeofInetDiagReqV2 = 56

	// diagTimeout bounds each receive of a dump.
	diagTimeout = 5 * time.Second
)

// offsetTCPInfoRTT is the offset of tcpi_rtt in struct tcp_info.
var offsetTCPInfoRTT = int(unsafe.Offsetof(unix.TCPInfo{}.Rtt))

// diagResult is what the TCP socket dumps found.
type diagResult struct {
	listening uint64
	rtts      []uint32 // tcpi_rtt (µs) of ESTABLISHED sockets, zeros included
}

// diagTCP dumps the LISTEN and ESTABLISHED TCP sockets of the calling
// thread's network namespace, IPv4 (if v4) then IPv6 (if v6). A kernel
// without IPv6 (or with it disabled) has no AF_INET6 sockets to report.
func diagTCP(v4, v6 bool) (diagResult, error) {
	var res diagResult
	if !v4 && !v6 {
		return res, nil
	}
	fd, err := openDiag()
	if err != nil {
		return diagResult{}, err
	}
	defer unix.Close(fd)
	for i, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if (family == unix.AF_INET && !v4) || (family == unix.AF_INET6 && !v6) {
			continue
		}
		err := dump(fd, uint32(i+1), family, 1<<tcpEstablished|1<<tcpListen, func(state uint8, info []byte) {
			switch state {
			case tcpListen:
				res.listening++
			case tcpEstablished:
				if len(info) >= offsetTCPInfoRTT+4 {
					res.rtts = append(res.rtts, binary.NativeEndian.Uint32(info[offsetTCPInfoRTT:]))
				}
			}
		})
		if err != nil {
			if family == unix.AF_INET6 && noIPv6(err) {
				continue
			}
			name := map[uint8]string{unix.AF_INET: "AF_INET", unix.AF_INET6: "AF_INET6"}[family]
			return diagResult{}, fmt.Errorf("sock_diag %s TCP dump: %w", name, err)
		}
	}
	return res, nil
}

// dump sends one inet_diag_req_v2 dump request for TCP sockets of family in
// the given states (a bit mask of 1<<TCP_state) with INET_DIAG_INFO, and
// calls fn with each socket's state and tcp_info bytes (nil if absent).
func dump(fd int, seq uint32, family uint8, states uint32, fn func(state uint8, info []byte)) error {
	return diagDump(fd, seq, family, unix.IPPROTO_TCP, 1<<(inetDiagInfo-1), states, nil, func(m []byte) error {
		if len(m) < sizeofInetDiagMsg {
			return fmt.Errorf("short inet_diag_msg (%d bytes)", len(m))
		}
		fn(m[offsetDiagState], nlattr.Get(m[sizeofInetDiagMsg:], inetDiagInfo))
		return nil
	})
}

// diagDump sends one inet_diag_req_v2 dump request (family, protocol,
// extensions, state mask, optional bytecode filter) on the sock_diag socket
// fd and calls fn with the payload (an inet_diag_msg and its attributes) of
// each reply, until the kernel says the dump is done.
func diagDump(fd int, seq uint32, family, proto, ext uint8, states uint32, bc []byte, fn func(msg []byte) error) error {
	ne := binary.NativeEndian
	size := unix.NLMSG_HDRLEN + sizeofInetDiagReqV2
	if bc != nil {
		size += unix.SizeofRtAttr + len(bc)
	}
	req := make([]byte, size)
	ne.PutUint32(req[0:], uint32(size))                       // nlmsg_len
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)           // nlmsg_type
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP) // nlmsg_flags
	ne.PutUint32(req[8:], seq)                                // nlmsg_seq; nlmsg_pid 0: the kernel fills it in
	body := req[unix.NLMSG_HDRLEN:]
	body[0], body[1], body[2] = family, proto, ext
	ne.PutUint32(body[4:], states) // idiag_states; id: zero = any socket
	if bc != nil {
		a := body[sizeofInetDiagReqV2:]
		ne.PutUint16(a[0:], uint16(unix.SizeofRtAttr+len(bc)))
		ne.PutUint16(a[2:], inetDiagReqBytecode)
		copy(a[unix.SizeofRtAttr:], bc)
	}
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send: %w", err)
	}

	// Dump replies are at most 32 KiB per datagram (netlink caps them there).
	buf := make([]byte, 64<<10)
	for {
		n, _, flags, from, err := unix.Recvmsg(fd, buf, nil, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EAGAIN) {
				return fmt.Errorf("no answer from the kernel within %v", diagTimeout)
			}
			return fmt.Errorf("receive: %w", err)
		}
		if flags&unix.MSG_TRUNC != 0 {
			return errors.New("receive: reply truncated")
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // not from the kernel
		}
		msgs, err := splitMessages(buf[:n])
		if err != nil {
			return fmt.Errorf("parse reply: %w", err)
		}
		for _, m := range msgs {
			if m.seq != seq {
				continue
			}
			switch m.typ {
			case unix.NLMSG_DONE:
				if len(m.data) >= 4 {
					if e := int32(ne.Uint32(m.data)); e < 0 {
						return unix.Errno(-e)
					}
				}
				return nil
			case unix.NLMSG_ERROR:
				if len(m.data) < 4 {
					return errors.New("short NLMSG_ERROR")
				}
				if e := int32(ne.Uint32(m.data)); e < 0 {
					return unix.Errno(-e)
				}
				// An ack (error 0): keep reading.
			case unix.SOCK_DIAG_BY_FAMILY:
				if err := fn(m.data); err != nil {
					return err
				}
			}
		}
	}
}

// message is one netlink message of a datagram.
type message struct {
	typ  uint16
	seq  uint32
	data []byte // payload after the header
}

// splitMessages splits a netlink datagram into its messages.
func splitMessages(b []byte) ([]message, error) {
	ne := binary.NativeEndian
	var out []message
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(ne.Uint32(b[0:]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return nil, fmt.Errorf("bad message length %d (%d bytes left)", l, len(b))
		}
		out = append(out, message{typ: ne.Uint16(b[4:]), seq: ne.Uint32(b[8:]), data: b[unix.NLMSG_HDRLEN:l]})
		step := nlattr.Align(l)
		if step >= len(b) {
			break
		}
		b = b[step:]
	}
	return out, nil
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

// noIPv6 reports whether an AF_INET6 dump failed because the kernel has no
// IPv6 sockets to report (IPv6 absent or disabled).
func noIPv6(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EAFNOSUPPORT) || errors.Is(err, unix.EOPNOTSUPP)
}

// dumpSockets dumps, on a sock_diag socket of the calling thread's
// namespace, the TCP sockets in tcpStates and the UDP sockets in udpStates
// (masks of 1<<TCP_state), IPv4 then IPv6 (skipped when the kernel has
// none), keeping those bc accepts (nil: all), and returns each socket's
// message as parse reads it.
func dumpSockets[T any](bc []byte, tcpStates, udpStates uint32, parse func(m []byte, proto uint8) (T, error)) ([]T, error) {
	fd, err := openDiag()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []T
	seq := uint32(0)
	for _, p := range []struct {
		proto  uint8
		states uint32
	}{{unix.IPPROTO_TCP, tcpStates}, {unix.IPPROTO_UDP, udpStates}} {
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			seq++
			err := diagDump(fd, seq, family, p.proto, 0, p.states, bc, func(m []byte) error {
				v, err := parse(m, p.proto)
				if err == nil {
					out = append(out, v)
				}
				return err
			})
			if err != nil {
				if family == unix.AF_INET6 && noIPv6(err) {
					continue
				}
				return nil, fmt.Errorf("sock_diag %s %s dump: %w", protoName(p.proto), familyName(family), err)
			}
		}
	}
	return out, nil
}
