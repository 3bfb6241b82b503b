package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/nlbatch/nlattr"
)

// rtnl is a NETLINK_ROUTE socket opened inside a network namespace, for
// the three requests that read one interface (a link by name, an address
// dump, a route dump): a few system calls where a netlink library would
// cost the plugin's start-up its package and twice the requests.
type rtnl struct {
	fd  int
	seq uint32
	buf []byte
}

// openRtnl opens a NETLINK_ROUTE socket inside the network namespace at
// nsPath. Only a locked thread of a goroutine of its own enters the
// namespace, for the socket call; if it cannot go back, it stays locked
// and ends with its goroutine.
func openRtnl(nsPath string) (*rtnl, error) {
	ns, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	defer unix.Close(ns)
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("this thread's network namespace: %w", err)}
			return
		}
		defer unix.Close(self)
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("enter %s: %w", nsPath, err)}
			return
		}
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if berr := unix.Setns(self, unix.CLONE_NEWNET); berr == nil {
			runtime.UnlockOSThread()
		}
		done <- result{fd, err}
	}()
	r := <-done
	if r.err != nil {
		if r.fd >= 0 {
			unix.Close(r.fd)
		}
		return nil, fmt.Errorf("netlink in %s: %w", nsPath, r.err)
	}
	return &rtnl{fd: r.fd, buf: make([]byte, 64<<10)}, nil
}

func (s *rtnl) Close() error { return unix.Close(s.fd) }

// request sends a request of type typ (body: its fixed header, then
// attributes) and returns the messages of the reply until NLMSG_DONE (a
// dump) or the first message (a single answer). An NLMSG_ERROR is its
// errno.
func (s *rtnl) request(typ uint16, flags uint16, body []byte) ([]syscall.NetlinkMessage, error) {
	s.seq++
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:6], typ)
	binary.NativeEndian.PutUint16(msg[6:8], unix.NLM_F_REQUEST|flags)
	binary.NativeEndian.PutUint32(msg[8:12], s.seq)
	msg = append(msg, body...)
	if err := unix.Sendto(s.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out []syscall.NetlinkMessage
	for {
		n, _, err := unix.Recvfrom(s.fd, s.buf, 0)
		if err != nil {
			return nil, err
		}
		msgs, err := syscall.ParseNetlinkMessage(s.buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != s.seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("netlink: short error message")
				}
				if errno := -int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
					return nil, syscall.Errno(errno)
				}
				return out, nil
			}
			m.Data = append([]byte(nil), m.Data...) // the buffer is reused
			out = append(out, m)
			if flags&unix.NLM_F_DUMP == 0 {
				return out, nil
			}
		}
	}
}

// link is what the plugin reads of an interface.
type link struct {
	index int32
	mac   net.HardwareAddr
	mtu   int
}

// errLinkNotFound is the error for a name no link has.
var errLinkNotFound = errors.New("link not found")

// linkByName asks for the link named name.
func (s *rtnl) linkByName(name string) (link, error) {
	body := make([]byte, unix.SizeofIfInfomsg)
	body[0] = unix.AF_UNSPEC
	body = nlattr.Append(body, unix.IFLA_IFNAME, append([]byte(name), 0))
	msgs, err := s.request(unix.RTM_GETLINK, 0, body)
	if errors.Is(err, unix.ENODEV) {
		return link{}, errLinkNotFound
	}
	if err != nil {
		return link{}, err
	}
	if len(msgs) != 1 || msgs[0].Header.Type != unix.RTM_NEWLINK || len(msgs[0].Data) < unix.SizeofIfInfomsg {
		return link{}, errors.New("netlink: no link in the reply")
	}
	m := msgs[0]
	l := link{index: int32(binary.NativeEndian.Uint32(m.Data[4:8]))}
	attrs, err := syscall.ParseNetlinkRouteAttr(&m)
	if err != nil {
		return link{}, err
	}
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.IFLA_ADDRESS:
			l.mac = net.HardwareAddr(a.Value)
		case unix.IFLA_MTU:
			if len(a.Value) == 4 {
				l.mtu = int(binary.NativeEndian.Uint32(a.Value))
			}
		}
	}
	return l, nil
}

// address is one address of a link: its IP with the prefix.
type address struct {
	family uint8
	ipnet  net.IPNet
}

// addresses dumps the addresses of the link with index idx, both families.
// The address is IFA_LOCAL when it differs from IFA_ADDRESS (a peer) or
// the family is IPv6, else IFA_ADDRESS with its prefix, as iproute2 and
// libnl read them.
func (s *rtnl) addresses(idx int32) ([]address, error) {
	body := make([]byte, unix.SizeofIfAddrmsg)
	body[0] = unix.AF_UNSPEC
	msgs, err := s.request(unix.RTM_GETADDR, unix.NLM_F_DUMP, body)
	if err != nil {
		return nil, err
	}
	var out []address
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != unix.RTM_NEWADDR || len(m.Data) < unix.SizeofIfAddrmsg {
			continue
		}
		family, prefix := m.Data[0], int(m.Data[1])
		if int32(binary.NativeEndian.Uint32(m.Data[4:8])) != idx {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return nil, err
		}
		var dst, local *net.IPNet
		for _, a := range attrs {
			ip := net.IP(a.Value)
			switch a.Attr.Type {
			case unix.IFA_ADDRESS:
				dst = &net.IPNet{IP: ip, Mask: net.CIDRMask(prefix, 8*len(ip))}
			case unix.IFA_LOCAL:
				local = &net.IPNet{IP: ip, Mask: net.CIDRMask(8*len(ip), 8*len(ip))}
			}
		}
		a := dst
		if local != nil && !(family == unix.AF_INET && dst != nil && local.IP.Equal(dst.IP)) {
			a = local
		}
		if a != nil {
			out = append(out, address{family: family, ipnet: *a})
		}
	}
	return out, nil
}

// defaultGateways dumps the routes of the main table and returns the
// gateway of the first IPv4 and of the first IPv6 default route out of
// the link with index idx (nil when there is none).
func (s *rtnl) defaultGateways(idx int32) (gw4, gw6 net.IP, err error) {
	body := make([]byte, unix.SizeofRtMsg)
	body[0] = unix.AF_UNSPEC
	msgs, err := s.request(unix.RTM_GETROUTE, unix.NLM_F_DUMP, body)
	if err != nil {
		return nil, nil, err
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != unix.RTM_NEWROUTE || len(m.Data) < unix.SizeofRtMsg {
			continue
		}
		family, table := m.Data[0], uint32(m.Data[4])
		flags := binary.NativeEndian.Uint32(m.Data[8:12])
		if (family != unix.AF_INET && family != unix.AF_INET6) || flags&unix.RTM_F_CLONED != 0 {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return nil, nil, err
		}
		var oif int32
		var dst, gw net.IP
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.RTA_TABLE:
				if len(a.Value) == 4 {
					table = binary.NativeEndian.Uint32(a.Value)
				}
			case unix.RTA_OIF:
				if len(a.Value) == 4 {
					oif = int32(binary.NativeEndian.Uint32(a.Value))
				}
			case unix.RTA_DST:
				dst = net.IP(a.Value)
			case unix.RTA_GATEWAY:
				gw = net.IP(a.Value)
			}
		}
		if table != unix.RT_TABLE_MAIN || oif != idx || gw == nil || (dst != nil && !(m.Data[1] == 0 && dst.IsUnspecified())) {
			continue
		}
		if family == unix.AF_INET && gw4 == nil {
			gw4 = gw
		}
		if family == unix.AF_INET6 && gw6 == nil {
			gw6 = gw
		}
	}
	return gw4, gw6, nil
}
