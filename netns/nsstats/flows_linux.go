package nsstats

// Live flows of a namespace (Conns, PeerPorts): what the data plane asks
// before it moves a shared port's spread bucket away from a holder, so that
// flows the holder has sockets for keep reaching it.
//
// The sockets are listed with sock_diag from a NETLINK_INET_DIAG socket
// opened inside the namespace (on a locked thread, as Collect does), one
// SOCK_DIAG_BY_FAMILY dump per protocol (TCP, UDP) and family (AF_INET,
// AF_INET6: a dual-stack listener's IPv4 connections are AF_INET6 sockets
// with v4-mapped addresses). The kernel filters the dump itself: by state
// (idiag_states) and, when local ports are given, by an inet_diag bytecode
// program of INET_DIAG_BC_S_EQ tests (the "S" side of a socket is its
// local side), so the answer carries only the sockets asked for.

import (
	"fmt"
	"slices"

	"github.com/isolatord/isolatord/netns/nshandle"
)

// Conns lists the live flows (see Conn) of the network namespace at
// netnsPath whose local port is one of ports, or all of them when no port
// is given, IPv4 and IPv6, TCP then UDP. It never changes the namespace of
// the calling goroutine's thread.
func Conns(netnsPath string, ports ...uint16) ([]Conn, error) {
	if len(ports) > MaxConnPorts {
		return nil, fmt.Errorf("nsstats: %d local ports: at most %d per call", len(ports), MaxConnPorts)
	}
	var out []Conn
	err := doIn(netnsPath, func() error {
		var err error
		out, err = connsHere(ports)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PeerPorts returns the distinct remote ports, sorted, of the live flows
// (TCP and connected UDP, see Conn) whose local port is localPort in the
// namespace at netnsPath: for a server port, the source ports its clients
// connect from.
func PeerPorts(netnsPath string, localPort uint16) ([]uint16, error) {
	cs, err := Conns(netnsPath, localPort)
	if err != nil {
		return nil, err
	}
	var out []uint16
	for _, c := range cs {
		out = append(out, c.Remote.Port())
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// doIn runs fn inside the namespace at netnsPath (nshandle.NS.Do).
func doIn(netnsPath string, fn func() error) error {
	ns, err := nshandle.Open(netnsPath)
	if err != nil {
		return fmt.Errorf("nsstats: %w", err)
	}
	defer ns.Close()
	if err := ns.Do(fn); err != nil {
		return fmt.Errorf("nsstats: %s: %w", netnsPath, err)
	}
	return nil
}

// connsHere dumps the live flows of the calling thread's namespace. The
// thread must be locked.
func connsHere(ports []uint16) ([]Conn, error) {
	return dumpSockets(portFilter(ports), liveTCPStates, liveUDPStates, parseConn)
}
