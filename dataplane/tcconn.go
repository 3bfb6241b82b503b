package dataplane

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/tcfilter/nlbatch"
)

// openConn opens a tc batch socket in namespace ns: the host's (d.hc, for
// the veth filters) or a container's (its own filters, during Setup).
func openConn(ns *nshandle.NS) (*nlbatch.Conn, error) {
	var c *nlbatch.Conn
	err := ns.Do(func() (err error) {
		c, err = nlbatch.Open()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("tc batch socket in %s: %w", ns, err)
	}
	return c, nil
}

// openHandles opens, in one visit to namespace ns (a container's), the
// netlink handle Setup configures it with and the tc batch socket of its
// filters: nshandle.NS.Netlink and openConn would each switch the thread
// into ns and back, the handle once per socket.
func openHandles(ns *nshandle.NS) (*netlink.Handle, *nlbatch.Conn, error) {
	var (
		h *netlink.Handle
		c *nlbatch.Conn
	)
	err := ns.Do(func() (err error) {
		// The calling thread is in ns: no switch per socket. Only
		// NETLINK_ROUTE: the container is configured through links,
		// addresses, routes and tc (not xfrm or netfilter sockets).
		if h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return fmt.Errorf("netlink handle: %w", err)
		}
		if c, err = nlbatch.Open(); err != nil {
			h.Close()
			return fmt.Errorf("tc batch socket: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("in %s: %w", ns, err)
	}
	return h, c, nil
}
