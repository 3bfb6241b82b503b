package neighsync

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/nshandle"
)

// Every neighbour notification, the host's and the containers', arrives on
// one netlink socket in the host's namespace, subscribed to RTNLGRP_NEIGH
// with NETLINK_LISTEN_ALL_NSID: the kernel also gives it the notifications
// of every namespace the host's namespace has an id for (an nsid), each
// with that id as ancillary data (none: the host's own). The Syncer gives
// each container's namespace an id at Add (the veth pair usually gave it
// one already) and maps ids to containers; the member's request handle
// keeps the namespace alive, so its id is not given to another namespace
// while the container is served. Ids come from the kernel: a container
// cannot pass for another.
//
// One subscribed socket whatever the number of containers: the kernel walks
// every subscribed NETLINK_ROUTE socket of the machine for every rtnetlink
// notification (netlink_broadcast_filtered), so one socket per container
// made every link, address, route and filter change cost O(containers).
//
// Overflow: if the socket's receive buffer fills (ENOBUFS), notifications
// were lost. The reader drains what is queued, then re-reads the host's
// table and every container's table (resync.go): requests still pending
// show as INCOMPLETE entries; a request that failed meanwhile is asked
// again by the container's next packet, as always.

// rcvBuf is the receive buffer asked for the socket (SO_RCVBUFFORCE, as
// root; else SO_RCVBUF, capped by net.core.rmem_max): about 10,000
// notifications.
var rcvBuf = 8 << 20

// resyncGap is the least time between two resyncs: a namespace flooding
// its neighbour table must not make the daemon re-read every container's
// table without pause (the resync after the gap still misses nothing).
var resyncGap = time.Second

// receiver is the socket and its reader's state.
type receiver struct {
	fd   int // the subscribed socket (host namespace)
	ep   int // epoll instance: fd and wake
	wake int // eventfd: Close wakes the loop
	buf  []byte
	oob  []byte
	// lost: an overflow since the last resync; last: when that began.
	lost bool
	last time.Time
}

// Epoll tokens.
const (
	tokWake = iota
	tokSocket
)

// newReceiver opens the socket in the host's namespace hostNS.
func newReceiver(hostNS *nshandle.NS) (*receiver, error) {
	r := &receiver{fd: -1, ep: -1, wake: -1, buf: make([]byte, nl.RECEIVE_BUFFER_SIZE), oob: make([]byte, unix.CmsgSpace(4)*4)}
	err := hostNS.Do(func() (err error) {
		r.fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := r.setup(); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *receiver) setup() (err error) {
	if err := unix.SetsockoptInt(r.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf); err != nil {
		if err := unix.SetsockoptInt(r.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf); err != nil {
			return fmt.Errorf("netlink receive buffer: %w", err)
		}
	}
	if err := unix.SetsockoptInt(r.fd, unix.SOL_NETLINK, unix.NETLINK_LISTEN_ALL_NSID, 1); err != nil {
		return fmt.Errorf("netlink: listen to all namespaces: %w", err)
	}
	if err := unix.Bind(r.fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.RTNLGRP_NEIGH - 1)}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	if r.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	if r.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	for fd, tok := range map[int]int32{r.wake: tokWake, r.fd: tokSocket} {
		if err := unix.EpollCtl(r.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: tok}); err != nil {
			return fmt.Errorf("epoll add: %w", err)
		}
	}
	return nil
}

// close releases the receiver once the loop has returned.
func (r *receiver) close() {
	for _, fd := range []int{r.fd, r.ep, r.wake} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// loop reads the socket until Close, and resyncs after an overflow.
func (s *Syncer) loop() {
	defer s.wg.Done()
	r := s.rx
	evs := make([]unix.EpollEvent, 2)
	for {
		timeout := -1
		if r.lost {
			timeout = max(0, int(time.Until(r.last.Add(resyncGap)).Milliseconds())+1)
		}
		n, err := unix.EpollWait(r.ep, evs, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			s.log.Error("neighbour sync: epoll wait; neighbour requests are no longer served", "err", err)
			return
		}
		for _, ev := range evs[:n] {
			if ev.Fd == tokWake {
				return // Close
			}
			s.read()
		}
		if r.lost && time.Since(r.last) >= resyncGap {
			r.lost = false
			r.last = time.Now()
			s.resync()
		}
	}
}

// read handles what the socket holds, a bounded number of datagrams (the
// rest waits for the next wake-up: level-triggered).
func (s *Syncer) read() {
	r := s.rx
	for range 256 {
		n, oobn, _, from, err := unix.Recvmsg(r.fd, r.buf, r.oob, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return
		}
		if errors.Is(err, unix.ENOBUFS) {
			r.lost = true
			continue
		}
		if err != nil {
			s.log.Warn("neighbour sync: netlink receive", "err", err)
			return
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != nl.PidKernel {
			continue
		}
		nsid, ok := nsidOf(r.oob[:oobn])
		msgs, err := syscall.ParseNetlinkMessage(r.buf[:n])
		if err != nil {
			s.log.Warn("neighbour sync: netlink message", "err", err)
			continue
		}
		s.mu.Lock()
		s.handleLocked(ok, nsid, msgs)
		s.mu.Unlock()
	}
}

// handleLocked handles the notifications of one datagram, from the host's
// namespace (!fromPeer) or from the namespace whose id is nsid (with s.mu
// held).
func (s *Syncer) handleLocked(fromPeer bool, nsid int32, msgs []syscall.NetlinkMessage) {
	if s.closed {
		return
	}
	host := !fromPeer || nsid == s.selfID
	ms := s.byNSID[nsid] // the containers served in that namespace (usually one)
	if !host && len(ms) == 0 {
		return // a namespace the Syncer does not serve
	}
	for _, msg := range msgs {
		switch msg.Header.Type {
		case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH, unix.RTM_GETNEIGH:
		default:
			continue
		}
		neigh, err := netlink.NeighDeserialize(msg.Data)
		if err != nil {
			s.log.Warn("neighbour sync: netlink message", "err", err)
			continue
		}
		u := netlink.NeighUpdate{Type: msg.Header.Type, Neigh: *neigh}
		if host {
			s.hostUpdateLocked(u)
			continue
		}
		for _, m := range ms {
			s.containerUpdateLocked(m, u)
		}
	}
}

// nsidOf returns the namespace id in a datagram's ancillary data, if any.
func nsidOf(oob []byte) (int32, bool) {
	cms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, c := range cms {
		if c.Header.Level == unix.SOL_NETLINK && c.Header.Type == unix.NETLINK_LISTEN_ALL_NSID && len(c.Data) >= 4 {
			return int32(nl.NativeEndian().Uint32(c.Data)), true
		}
	}
	return 0, false
}

// wakeLoop makes the loop return.
func (s *Syncer) wakeLoop() {
	var one [8]byte
	nl.NativeEndian().PutUint64(one[:], 1)
	_, _ = unix.Write(s.rx.wake, one[:])
}
