package dataplane

import (
	"fmt"
	"sync"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// retireSocket is the rtnetlink socket of the retire requests, opened in
// the host namespace at the first one and closed with the retirer. It is
// its own socket (not the data plane's handle's), so that the teardowns'
// retire requests do not queue behind other requests on one socket.
type retireSocket struct {
	mu sync.Mutex
	sh *nl.SocketHandle
}

// get returns the socket, opening it in the host namespace of d if needed.
func (s *retireSocket) get(d *DataPlane) (*nl.SocketHandle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sh != nil {
		return s.sh, nil
	}
	sock, err := nl.GetNetlinkSocketAt(netns.NsHandle(d.hostNS.Fd()), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("rtnetlink socket in the host namespace: %w", err)
	}
	tv := nl.SocketTimeoutTv
	if err := sock.SetReceiveTimeout(&tv); err != nil {
		sock.Close()
		return nil, err
	}
	s.sh = &nl.SocketHandle{Socket: sock}
	return s.sh, nil
}

// close closes the socket, if it was opened.
func (s *retireSocket) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sh != nil {
		s.sh.Close()
		s.sh = nil
	}
}

// setRetired retires link idx in one RTM_SETLINK: down (ifi_change IFF_UP,
// flags 0), IFLA_IFNAME retiredName(idx), IFLA_GROUP RetiredGroup. The
// kernel applies the group, the name and the flags in that order under one
// hold of the rtnl lock; it may stop after a part (an error then).
func (r *retirer) setRetired(d *DataPlane, idx int) error {
	sh, err := r.sock.get(d)
	if err != nil {
		return err
	}
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sh}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(idx)
	msg.Change = unix.IFF_UP
	msg.Flags = 0
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(retiredName(idx))))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(RetiredGroup)))
	_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}
