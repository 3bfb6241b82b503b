// Package nlbatch sends many rtnetlink requests at once: Conn writes a
// chunk of requests in one sendmsg and reads their acks with recvmmsg,
// and Request serializes one tc request (u32, cls_bpf or ingress qdisc)
// into a caller's buffer. Package tcfilter builds its batches on it.
package nlbatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/nlbatch/nlattr"
)

// Conn is a NETLINK_ROUTE socket that sends many tc requests at once: one
// sendmsg carries a chunk of requests, each asking for an ack, and the
// acks are read back with recvmmsg. The kernel handles a chunk inside the
// sendmsg call, one request after the other, and answers every one of them
// (a failed request does not stop the ones after it), so the acks are
// already queued when sendmsg returns: nothing waits for a wake-up, and the
// socket is never registered with the Go poller.
//
// A Conn belongs to the network namespace it was opened in; it is safe for
// concurrent use (one exchange at a time) and keeps that namespace alive
// until Close.
type Conn struct {
	mu  sync.Mutex
	fd  int
	pid uint32
	seq uint32
	max int // requests per sendmsg (chunkRequests, fewer with a small receive buffer)
}

// scratch is what one chunk needs besides its requests: the buffer its
// requests are copied into for sendmsg, and recvmmsg's ack buffers and
// headers. A daemon sends thousands of chunks a second in a burst, most on
// Conns opened for one setup: they share scratch areas through
// scratchPool instead of allocating them (the garbage collector ran every
// few hundred ms during bursts, and the ack buffers alone were ~15% of a
// setup's allocations).
type scratch struct {
	out  []byte
	acks [chunkRequests * ackBufSize]byte
	iovs [chunkRequests]unix.Iovec
	hdrs [chunkRequests]mmsghdr
	got  [chunkRequests][]byte
	pend [chunkRequests]bool
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

const (
	// chunkRequests bounds the requests of one sendmsg, so that their acks
	// (each a small skb, under ackTruesize bytes of receive buffer) always
	// fit in the socket's receive buffer (rmem_default, 208 KiB, unless the
	// host set it smaller).
	chunkRequests = 64
	ackTruesize   = 2048
	// chunkBytes bounds the bytes of one sendmsg (the socket's send
	// buffer, wmem_default, is 208 KiB).
	chunkBytes = 64 << 10
	// ackBufSize holds an ack: a header, an error code, the header of the
	// request (NETLINK_CAP_ACK: not its payload) and the kernel's message.
	ackBufSize = 1024
	// ackTimeout bounds the wait for an ack that is not queued when
	// sendmsg returns (it always is: the kernel answers in sendmsg).
	ackTimeout = 10 * time.Second
)

// Open opens a Conn in the network namespace of the calling thread
// (run it on a thread locked inside the namespace, nshandle.NS.Do).
func Open() (*Conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	c := &Conn{fd: fd}
	if err := c.init(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return c, nil
}

func (c *Conn) init() error {
	if err := unix.Bind(c.fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("bind netlink socket: %w", err)
	}
	// Acks of failed requests carry the kernel's reason (extack) and
	// only the header of the request, not the request itself.
	for _, o := range []int{unix.NETLINK_EXT_ACK, unix.NETLINK_CAP_ACK} {
		if err := unix.SetsockoptInt(c.fd, unix.SOL_NETLINK, o, 1); err != nil {
			return fmt.Errorf("netlink socket option %d: %w", o, err)
		}
	}
	sa, err := unix.Getsockname(c.fd)
	if err != nil {
		return fmt.Errorf("netlink socket name: %w", err)
	}
	nsa, ok := sa.(*unix.SockaddrNetlink)
	if !ok {
		return errors.New("netlink socket name: not a netlink address")
	}
	c.pid = nsa.Pid
	rcv, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		return fmt.Errorf("netlink socket receive buffer: %w", err)
	}
	c.max = max(1, min(chunkRequests, rcv/ackTruesize))
	return nil
}

// Close closes the socket.
func (c *Conn) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd = -1
	return err
}

// Exchange sends msgs (serialized netlink requests of any kind, each with
// NLM_F_ACK; their sequence numbers are set here) and returns the kernel's answer to
// each: nil for success, else its error (a unix.Errno, wrapped with the
// kernel's message when there is one). err is set when the exchange itself
// failed; results of requests it did not get an answer for are then that
// error too.
func (c *Conn) Exchange(msgs [][]byte) (res []error, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res = make([]error, len(msgs))
	if c.fd < 0 {
		err = errors.New("netlink batch socket closed")
	}
	for start := 0; start < len(msgs) && err == nil; {
		end, size := start, 0
		for end < len(msgs) && end-start < c.max && (end == start || size+len(msgs[end]) <= chunkBytes) {
			size += nlattr.Align(len(msgs[end]))
			end++
		}
		err = c.chunk(msgs[start:end], res[start:end], size)
		start = end
	}
	if err != nil {
		for i := range res {
			if res[i] == nil {
				res[i] = err
			}
		}
	}
	return res, err
}

// chunk sends msgs (at most chunkRequests) in one sendmsg and reads their
// acks into res.
func (c *Conn) chunk(msgs [][]byte, res []error, size int) error {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	var pad [unix.NLMSG_ALIGNTO]byte
	out := sc.out[:0]
	if cap(out) < size {
		out = make([]byte, 0, size)
	}
	base := c.seq + 1
	for _, m := range msgs {
		c.seq++
		binary.NativeEndian.PutUint32(m[8:12], c.seq) // nlmsg_seq
		out = append(out, m...)
		out = append(out, pad[:nlattr.Align(len(m))-len(m)]...)
	}
	if cap(out) <= chunkBytes {
		sc.out = out[:0] // kept for the next chunk (a larger one is not)
	}
	if err := unix.Sendto(c.fd, out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send %d netlink requests: %w", len(msgs), err)
	}
	pending := sc.pend[:len(msgs)]
	for i := range pending {
		pending[i] = true
	}
	left := len(msgs)
	deadline := time.Now().Add(ackTimeout)
	for left > 0 {
		bufs, err := c.recv(sc, left)
		if errors.Is(err, unix.EAGAIN) {
			if time.Now().After(deadline) {
				return fmt.Errorf("%d of %d netlink requests unanswered after %v", left, len(msgs), ackTimeout)
			}
			if err := c.wait(deadline); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("read netlink acks: %w", err)
		}
		for _, b := range bufs {
			seq, aerr, ok := parseAck(b, c.pid)
			i := int(seq - base)
			if !ok || i < 0 || i >= len(msgs) || !pending[i] {
				continue // not an ack of this chunk
			}
			pending[i], res[i] = false, aerr
			left--
		}
	}
	return nil
}

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// recv reads up to n queued datagrams without blocking (recvmmsg) into
// sc's ack buffers; what it returns is valid until sc's next use.
func (c *Conn) recv(sc *scratch, n int) ([][]byte, error) {
	n = min(n, c.max, chunkRequests)
	for i := range n {
		sc.iovs[i].Base = &sc.acks[i*ackBufSize]
		sc.iovs[i].SetLen(ackBufSize)
		sc.hdrs[i] = mmsghdr{}
		sc.hdrs[i].hdr.Iov = &sc.iovs[i]
		sc.hdrs[i].hdr.SetIovlen(1)
	}
	got, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(c.fd), uintptr(unsafe.Pointer(&sc.hdrs[0])), uintptr(n),
		unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return nil, errno
	}
	out := sc.got[:got]
	for i := range out {
		out[i] = sc.acks[i*ackBufSize : i*ackBufSize+int(min(sc.hdrs[i].n, ackBufSize))]
	}
	return out, nil
}

// wait blocks until the socket is readable or the deadline passes.
func (c *Conn) wait(deadline time.Time) error {
	ms := int(time.Until(deadline) / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	_, err := unix.Poll([]unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}, ms)
	if err != nil && !errors.Is(err, unix.EINTR) {
		return fmt.Errorf("wait for netlink acks: %w", err)
	}
	return nil
}

// parseAck reads one datagram: the sequence number of the request it
// answers and the answer, if it is an ack (NLMSG_ERROR) sent to pid.
func parseAck(b []byte, pid uint32) (seq uint32, err error, ok bool) {
	if len(b) < unix.SizeofNlMsghdr+4 {
		return 0, nil, false
	}
	ne := binary.NativeEndian
	typ := ne.Uint16(b[4:6])
	flags := ne.Uint16(b[6:8])
	seq = ne.Uint32(b[8:12])
	if typ != unix.NLMSG_ERROR || ne.Uint32(b[12:16]) != pid {
		return 0, nil, false
	}
	l := min(int(ne.Uint32(b[0:4])), len(b))
	code := int32(ne.Uint32(b[16:20]))
	if code == 0 {
		return seq, nil, true
	}
	err = unix.Errno(-code)
	// With NETLINK_CAP_ACK the echoed request is its header alone;
	// extack attributes follow it.
	if flags&unix.NLM_F_ACK_TLVS != 0 {
		if m := nlattr.Get(b[min(20+unix.SizeofNlMsghdr, l):l], unix.NLMSGERR_ATTR_MSG); m != nil {
			err = fmt.Errorf("%w: %s", err, unix.ByteSliceToString(m))
		}
	}
	return seq, err, true
}
