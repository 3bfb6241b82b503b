package neighsync

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Containers' neighbour requests: one netlink socket per container (in its
// namespace, subscribed to RTNLGRP_NEIGH), all read by one goroutine
// through epoll into one buffer. A subscription per container through the
// netlink library costs three goroutines and a 64 KiB receive buffer held
// while it waits: 1,000 containers held over 100 MiB.

// poller waits for any container socket to be readable.
type poller struct {
	ep   int // epoll instance
	wake int // eventfd: Close wakes the loop
	buf  []byte
	next uint64 // tokens of members (never reused; 0 is wake)
}

func newPoller() (*poller, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, fmt.Errorf("epoll add: %w", err)
	}
	return &poller{ep: ep, wake: wake, buf: make([]byte, nl.RECEIVE_BUFFER_SIZE)}, nil
}

// subscribeHere opens a netlink socket in the calling thread's namespace,
// subscribed to its neighbour table, and asks for a dump of the table (so
// requests pending before the subscription are seen).
func subscribeHere() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return -1, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.RTNLGRP_NEIGH - 1)}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("netlink bind: %w", err)
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, unix.NLM_F_DUMP)
	req.AddData(&netlink.Ndmsg{Family: unix.AF_UNSPEC})
	if err := unix.Sendto(fd, req.Serialize(), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("netlink dump request: %w", err)
	}
	return fd, nil
}

// watch adds m's socket to the poller (with s.mu held).
func (s *Syncer) watch(m *member) error {
	s.poll.next++
	m.tok = s.poll.next
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	ev.Fd, ev.Pad = int32(m.tok), int32(m.tok>>32)
	if err := unix.EpollCtl(s.poll.ep, unix.EPOLL_CTL_ADD, m.fd, &ev); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	s.byTok[m.tok] = m
	return nil
}

// drop stops serving m: its socket leaves the poller and is closed, as is
// its request handle (with s.mu held).
func (s *Syncer) drop(m *member) {
	delete(s.byTok, m.tok)
	if m.fd >= 0 {
		_ = unix.EpollCtl(s.poll.ep, unix.EPOLL_CTL_DEL, m.fd, nil)
		unix.Close(m.fd)
		m.fd = -1
	}
	m.h.Close()
}

// loop reads the containers' sockets until Close.
func (s *Syncer) loop() {
	defer s.wg.Done()
	evs := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(s.poll.ep, evs, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			s.log.Error("neighbour sync: epoll wait; containers' requests are no longer served", "err", err)
			return
		}
		for _, ev := range evs[:n] {
			tok := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if tok == 0 {
				return // Close
			}
			s.readMember(tok)
		}
	}
}

// readMember handles what member tok's socket holds.
func (s *Syncer) readMember(tok uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < 64; i++ { // bounded: the rest waits for the next wake-up (level-triggered)
		m, ok := s.byTok[tok]
		if !ok || s.closed {
			return
		}
		n, from, err := unix.Recvfrom(m.fd, s.poll.buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return
		}
		if err != nil { // ENOBUFS: requests were lost; they are asked again
			s.log.Warn("neighbour sync: netlink receive", "namespace", m.id, "err", err)
			if !errors.Is(err, unix.ENOBUFS) {
				return
			}
			continue
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != nl.PidKernel {
			continue
		}
		msgs, err := syscall.ParseNetlinkMessage(s.poll.buf[:n])
		if err != nil {
			s.log.Warn("neighbour sync: netlink message", "namespace", m.id, "err", err)
			continue
		}
		for _, msg := range msgs {
			switch msg.Header.Type {
			case unix.NLMSG_DONE:
				continue
			case unix.NLMSG_ERROR:
				if len(msg.Data) >= 4 {
					if e := int32(nl.NativeEndian().Uint32(msg.Data[0:4])); e != 0 {
						s.log.Warn("neighbour sync: netlink error", "namespace", m.id, "err", syscall.Errno(-e))
					}
				}
				continue
			}
			neigh, err := netlink.NeighDeserialize(msg.Data)
			if err != nil {
				s.log.Warn("neighbour sync: netlink message", "namespace", m.id, "err", err)
				continue
			}
			s.containerUpdateLocked(m, netlink.NeighUpdate{Type: msg.Header.Type, Neigh: *neigh})
		}
	}
}

// wakePoller makes the loop return.
func (s *Syncer) wakePoller() {
	var one [8]byte
	one[0] = 1
	if nl.NativeEndian().Uint64(one[:]) != 1 {
		one[0], one[7] = 0, 1
	}
	_, _ = unix.Write(s.poll.wake, one[:])
}

// close releases the poller once the loop has returned.
func (p *poller) close() {
	unix.Close(p.ep)
	unix.Close(p.wake)
}
