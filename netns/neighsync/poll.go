package neighsync

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
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
// One socket for every container whatever their number: the kernel walks
// every subscribed NETLINK_ROUTE socket of the machine for every rtnetlink
// notification (netlink_broadcast_filtered), so one socket per container
// made every link, address, route and filter change cost O(containers).
// A second socket, without NETLINK_LISTEN_ALL_NSID, hears the host's own
// table: no container's notification can crowd it out. Each socket has a
// filter (filter.go) that keeps only what the Syncer uses.
//
// Overflow: if a socket's receive buffer fills (ENOBUFS), notifications
// were lost. The reader drains what is queued, then re-reads the tables
// that socket hears (resync.go): the host's, or every container's (in
// the background: the reader goes on serving), where requests still
// pending show as INCOMPLETE entries; a request that failed meanwhile is
// asked again by the container's next packet, as always.

// rcvBuf is the receive buffer asked for each socket (SO_RCVBUFFORCE, as
// root; else SO_RCVBUF, capped by net.core.rmem_max): about 10,000
// notifications.
var rcvBuf = 8 << 20

// resyncGap is the least time between two resyncs: a namespace flooding
// its neighbour table must not make the daemon re-read every container's
// table without pause (the resync after the gap still misses nothing).
var resyncGap = time.Second

// receiver is the sockets and their reader's state.
type receiver struct {
	all  sock // every served namespace's requests (NETLINK_LISTEN_ALL_NSID)
	host sock // the host's own table (its namespace only)
	ep   int  // epoll instance: the sockets and wake
	wake int  // eventfd: Close wakes the loop
	buf  []byte
	oob  []byte
	// served are the container filter's ifindexes (filter.go), each with
	// the number of members whose eth0 has it.
	served map[int]int
	// unfiltered: why the sockets have no filter (nil: they have); they
	// then hear every neighbour notification, as before filters existed.
	unfiltered error
}

// sock is one subscribed socket. lost: an overflow since its last
// resync; last: when that began.
type sock struct {
	fd   int
	lost bool
	last time.Time
}

// Epoll tokens.
const (
	tokWake = iota
	tokSocket
	tokHost
)

// newReceiver opens the sockets in the host's namespace hostNS; the
// host's socket hears interface eth0.
func newReceiver(hostNS *nshandle.NS, eth0 int) (*receiver, error) {
	r := &receiver{all: sock{fd: -1}, host: sock{fd: -1}, ep: -1, wake: -1, served: map[int]int{},
		buf: make([]byte, nl.RECEIVE_BUFFER_SIZE), oob: make([]byte, unix.CmsgSpace(4)*4)}
	err := hostNS.Do(func() (err error) {
		for _, fd := range []*int{&r.all.fd, &r.host.fd} {
			if *fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		r.close()
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := r.setup(eth0); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *receiver) setup(eth0 int) (err error) {
	for _, fd := range []int{r.all.fd, r.host.fd} {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf); err != nil {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf); err != nil {
				return fmt.Errorf("netlink receive buffer: %w", err)
			}
		}
	}
	if err := unix.SetsockoptInt(r.all.fd, unix.SOL_NETLINK, unix.NETLINK_LISTEN_ALL_NSID, 1); err != nil {
		return fmt.Errorf("netlink: listen to all namespaces: %w", err)
	}
	// filters before subscribing: nothing unfiltered is queued
	if err := attachFilter(r.all.fd, containerFilter(nil)); err != nil {
		r.unfiltered = err
	} else if err := attachFilter(r.host.fd, hostFilter(eth0)); err != nil {
		_ = unix.SetsockoptInt(r.all.fd, unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0)
		r.unfiltered = err
	}
	for _, fd := range []int{r.all.fd, r.host.fd} {
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.RTNLGRP_NEIGH - 1)}); err != nil {
			return fmt.Errorf("netlink bind: %w", err)
		}
	}
	if r.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	if r.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	for fd, tok := range map[int]int32{r.wake: tokWake, r.all.fd: tokSocket, r.host.fd: tokHost} {
		if err := unix.EpollCtl(r.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: tok}); err != nil {
			return fmt.Errorf("epoll add: %w", err)
		}
	}
	return nil
}

// serve counts ifindex as a served eth0's (add: one more member, else
// one less) and, when the set of ifindexes changes, replaces the
// container filter (with the Syncer's lock held: the filter is in place
// before the member is served). An add whose filter could not be attached
// is not counted.
func (r *receiver) serve(ifindex int, add bool) error {
	n := r.served[ifindex]
	if add {
		r.served[ifindex] = n + 1
	} else if n <= 1 {
		delete(r.served, ifindex)
	} else {
		r.served[ifindex] = n - 1
	}
	if n > 0 && (add || n > 1) || r.unfiltered != nil {
		return nil // the set is the same, or no filter
	}
	idx := make([]int, 0, len(r.served))
	for i := range r.served {
		idx = append(idx, i)
	}
	err := attachFilter(r.all.fd, containerFilter(idx))
	if err != nil && add {
		// not served: the next Add of ifindex attaches the filter again
		if n == 0 {
			delete(r.served, ifindex)
		} else {
			r.served[ifindex] = n
		}
	}
	return err
}

// close releases the receiver once the loop has returned.
func (r *receiver) close() {
	for _, fd := range []int{r.all.fd, r.host.fd, r.ep, r.wake} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// loop reads the sockets until Close, and resyncs after an overflow: the
// host's table after the host's socket's, every container's after the
// other's.
func (s *Syncer) loop() {
	defer s.wg.Done()
	r := s.rx
	evs := make([]unix.EpollEvent, 3)
	for {
		timeout := -1
		for _, k := range []*sock{&r.all, &r.host} {
			if k.lost {
				t := max(0, int(time.Until(k.last.Add(resyncGap)).Milliseconds())+1)
				if timeout < 0 || t < timeout {
					timeout = t
				}
			}
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
			switch ev.Fd {
			case tokWake:
				return // Close
			case tokHost:
				s.read(&r.host, true)
			default:
				s.read(&r.all, false)
			}
		}
		if r.host.due() {
			s.countResync("host")
			s.resyncHost()
		}
		if r.all.due() {
			s.countResync("containers")
			s.resyncMembersAsync()
		}
	}
}

// due reports whether k overflowed and its resync may run now (resyncGap
// after the last one); if so, the overflow is taken as handled.
func (k *sock) due() bool {
	if !k.lost || time.Since(k.last) < resyncGap {
		return false
	}
	k.lost = false
	k.last = time.Now()
	return true
}

// read handles what socket k holds (host: the host's socket), a bounded
// number of datagrams (the rest waits for the next wake-up:
// level-triggered).
func (s *Syncer) read(k *sock, host bool) {
	r := s.rx
	for range 256 {
		n, oobn, _, from, err := unix.Recvmsg(k.fd, r.buf, r.oob, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return
		}
		if errors.Is(err, unix.ENOBUFS) {
			k.lost = true
			continue
		}
		if err != nil {
			s.log.Warn("neighbour sync: netlink receive", "err", err)
			return
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != nl.PidKernel {
			continue
		}
		nsid, peer := nsidOf(r.oob[:oobn])
		if !host && (!peer || nsid == s.selfID) {
			continue // the host's own: its socket hears them
		}
		msgs, err := syscall.ParseNetlinkMessage(r.buf[:n])
		if err != nil {
			s.log.Warn("neighbour sync: netlink message", "err", err)
			continue
		}
		s.mu.Lock()
		s.handleLocked(host, nsid, msgs)
		s.mu.Unlock()
	}
}

// handleLocked handles the notifications of one datagram, from the host's
// namespace (host) or from the namespace whose id is nsid (with s.mu
// held).
func (s *Syncer) handleLocked(host bool, nsid int32, msgs []syscall.NetlinkMessage) {
	if s.closed {
		return
	}
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
