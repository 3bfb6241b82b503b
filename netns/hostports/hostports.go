// Package hostports keeps host processes and containers off each other's
// static ports, in the host network namespace: it holds a reservation
// socket pair per port while a container owns the port, names the host
// process holding a port it cannot reserve, and keeps the ephemeral pool in
// the host's net.ipv4.ip_local_reserved_ports (pool.go).
//
// A reservation is one TCP and one UDP socket, each AF_INET6 with
// IPV6_V6ONLY off, bound to the wildcard [::]:port and never listening or
// connected. Created on a thread inside the host namespace, they belong to
// it. The kernel's bind-conflict rules then refuse (EADDRINUSE) any host
// socket's bind() of that port on any IPv4 address (the host IP, 0.0.0.0,
// 127.0.0.1) or the IPv6 wildcard: a wildcard dual-stack socket conflicts
// with every address of both families. Neither SO_REUSEADDR (two
// non-listening TCP sockets that both set it may share a port) nor
// SO_REUSEPORT (two sockets of the same uid that both set it may) is set, so
// neither lets a host process in. A host namespace without IPv6 gets AF_INET
// sockets bound to 0.0.0.0 instead.
//
// The sockets never see a packet: the data plane's ingress filters redirect
// traffic for a container's port to its veth before the host stack looks
// anything up, so a reservation costs nothing per packet; and its queue
// stays empty since nothing listens. They are close-on-exec and die with
// the process: a restarted daemon takes them again (Reserve per port), and
// a host process that bound a port in between is found then.
//
// When a bind fails, Holder dumps the host namespace's sockets on the port
// with sock_diag (nsstats.BoundHere) and finds their process through
// /proc/PID/fd (nsstats.ProcessOf): nothing is forked.
//
// The sockets and the sysctl write are in the _linux.go files; HeldError and
// the pool arithmetic (MergeReserved) build anywhere. MergeReserved has table
// tests; the rest is tested in a sandbox's host namespace (root; the tests
// skip otherwise), with host processes binding the ports for real.
package hostports

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nsstats"
)

// HeldError says that a host socket holds a port: Reserve's refusal.
type HeldError struct {
	Port    uint16
	Socket  nsstats.Bound   // the socket found (zero if the dump found none)
	Process nsstats.Process // its process (zero Pid if none was found)
}

func (e *HeldError) Error() string {
	switch {
	case e.Process.Pid != 0:
		return fmt.Sprintf("port %d is held on the host by %s: %s", e.Port, e.Process, e.Socket)
	case e.Socket.Local.IsValid():
		return fmt.Sprintf("port %d is held on the host by a socket of no visible process (uid %d): %s", e.Port, e.Socket.UID, e.Socket)
	}
	return fmt.Sprintf("port %d is in use on the host (bind: address already in use; the holder was not found)", e.Port)
}

// HeldPort is the port (the lifecycle recognizes the error by this method).
func (e *HeldError) HeldPort() uint16 { return e.Port }

// rank orders sockets for naming a holder: listening and bound sockets
// before connections.
func rank(b nsstats.Bound) int {
	if b.Proto == unix.IPPROTO_UDP || b.Listening() || b.State == nsstats.StateBoundInactive || b.State == nsstats.StateClose {
		return 0
	}
	return 1
}
