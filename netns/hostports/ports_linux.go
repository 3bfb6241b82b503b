package hostports

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nsstats"
)

// Ports holds the reservations of one host namespace. It is safe for
// concurrent use. It does not count holders: a port is reserved once,
// however many containers share it (the lifecycle counts them).
type Ports struct {
	ns       *nshandle.NS
	here     bool   // ns is the process's own namespace: no thread switch needed
	procRoot string // "/proc"

	mu    sync.Mutex
	socks map[uint16]reservation
}

// reservation is the socket pair of one port.
type reservation struct{ tcp, udp int }

// New opens the host namespace at path ("" = the process's own).
func New(path string) (*Ports, error) {
	self, err := nshandle.Current()
	if err != nil {
		return nil, err
	}
	if path == "" {
		return &Ports{ns: self, here: true, procRoot: "/proc", socks: map[uint16]reservation{}}, nil
	}
	defer self.Close()
	ns, err := nshandle.Open(path)
	if err != nil {
		return nil, err
	}
	return &Ports{ns: ns, here: ns.SameAs(self), procRoot: "/proc", socks: map[uint16]reservation{}}, nil
}

// Close releases every reservation and the namespace handle.
func (p *Ports) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for port, r := range p.socks {
		r.close()
		delete(p.socks, port)
	}
	return p.ns.Close()
}

// do runs fn on a thread in the host namespace.
func (p *Ports) do(fn func() error) error {
	if p.here {
		return fn()
	}
	return p.ns.Do(fn)
}

// Reserve takes a reservation for every port of ports not reserved yet, all
// or none: if a host socket holds one, it returns a *HeldError naming its
// holder and changes nothing.
func (p *Ports) Reserve(ports ephemeral.Set) error {
	if ports.Empty() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var taken []uint16
	err := p.do(func() error {
		for _, port := range ports.Ports() {
			if _, ok := p.socks[port]; ok {
				continue
			}
			r, err := bindPair(port)
			if errors.Is(err, unix.EADDRINUSE) {
				return p.holderHere(port)
			}
			if err != nil {
				return fmt.Errorf("reserve host port %d: %w", port, err)
			}
			p.socks[port] = r
			taken = append(taken, port)
		}
		return nil
	})
	if err != nil {
		for _, port := range taken {
			p.socks[port].close()
			delete(p.socks, port)
		}
	}
	return err
}

// Release closes the reservations of ports (those not reserved are
// ignored): host processes may bind them again.
func (p *Ports) Release(ports ephemeral.Set) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range ports.Ranges() {
		for port := int(r.Begin); port <= int(r.End); port++ {
			if res, ok := p.socks[uint16(port)]; ok {
				res.close()
				delete(p.socks, uint16(port))
			}
		}
	}
}

// Held returns the number of ports reserved.
func (p *Ports) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.socks)
}

// Reserved returns the ports reserved, sorted.
func (p *Ports) Reserved() []uint16 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]uint16, 0, len(p.socks))
	for port := range p.socks {
		out = append(out, port)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Holder returns a *HeldError naming what holds port on the host, or nil
// if no socket but ours does.
func (p *Ports) Holder(port uint16) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	if derr := p.do(func() error { err = p.holderHere(port); return nil }); derr != nil {
		return derr
	}
	var he *HeldError
	if errors.As(err, &he) && !he.Socket.Local.IsValid() {
		return nil
	}
	return err
}

// holderHere finds the holder of port from a thread in the host namespace.
// It always returns a *HeldError (without a socket if the dump found none
// but ours); p.mu held.
func (p *Ports) holderHere(port uint16) error {
	he := &HeldError{Port: port}
	bound, err := nsstats.BoundHere(port)
	if err != nil {
		return errors.Join(he, fmt.Errorf("find the holder: %w", err))
	}
	ours := map[uint32]bool{}
	if r, ok := p.socks[port]; ok {
		ours[inode(r.tcp)], ours[inode(r.udp)] = true, true
	}
	// Holders first, then connections; among each, one whose process is
	// found.
	sort.SliceStable(bound, func(i, j int) bool { return rank(bound[i]) < rank(bound[j]) })
	for _, b := range bound {
		if ours[b.Inode] {
			continue
		}
		if !he.Socket.Local.IsValid() {
			he.Socket = b
		}
		if b.Inode == 0 {
			continue // TIME_WAIT and request sockets belong to no file
		}
		if proc, ok := nsstats.ProcessOf(p.procRoot, b.Inode); ok {
			he.Socket, he.Process = b, proc
			break
		}
	}
	return he
}

func inode(fd int) uint32 {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0
	}
	return uint32(st.Ino)
}

// bindPair binds the TCP and UDP reservation sockets of port on the
// calling thread's namespace, dual-stack, or IPv4 when the namespace has no
// IPv6.
func bindPair(port uint16) (reservation, error) {
	tcp, err := bindOne(unix.SOCK_STREAM, port)
	if err != nil {
		return reservation{}, err
	}
	udp, err := bindOne(unix.SOCK_DGRAM, port)
	if err != nil {
		unix.Close(tcp)
		return reservation{}, err
	}
	return reservation{tcp: tcp, udp: udp}, nil
}

func bindOne(typ int, port uint16) (int, error) {
	fd, err := unix.Socket(unix.AF_INET6, typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err == nil {
		if err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err == nil {
			if err = unix.Bind(fd, &unix.SockaddrInet6{Port: int(port)}); err == nil {
				return fd, nil
			}
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EADDRNOTAVAIL) {
			return -1, err
		}
	} else if !errors.Is(err, unix.EAFNOSUPPORT) {
		return -1, err
	}
	// No IPv6 in this namespace.
	fd, err = unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(port)}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func (r reservation) close() {
	unix.Close(r.tcp)
	unix.Close(r.udp)
}
