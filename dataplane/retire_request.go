package dataplane

import (
	"errors"
	"sync"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/tcfilter/nlbatch"
)

// retireSocket is the rtnetlink socket of the retire requests, opened in
// the host namespace at the first one and closed with the retirer. It is
// its own socket (not the data plane's handle's), so that the teardowns'
// retire requests do not queue behind other requests on one socket.
type retireSocket struct {
	mu   sync.Mutex
	conn *nlbatch.Conn
}

// get returns the socket, opening it in the host namespace of d if needed.
func (s *retireSocket) get(d *DataPlane) (*nlbatch.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		return s.conn, nil
	}
	c, err := openConn(d.hostNS)
	if err != nil {
		return nil, err
	}
	s.conn = c
	return c, nil
}

// close closes the socket, if it was opened.
func (s *retireSocket) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

// setRetired retires link idx in one write to the kernel: with cutMute,
// the mute filter on its ingress (tcfilter.MuteMessage), then RTM_SETLINK
// IFLA_GROUP RetiredGroup, with cutDown also down (ifi_change IFF_UP,
// flags 0; the kernel applies the group first). muteErr is the mute
// request's answer (EEXIST: muted already, not an error), err the link
// request's.
func (r *retirer) setRetired(d *DataPlane, idx int, how cutOff) (muteErr, err error) {
	c, err := r.sock.get(d)
	if err != nil {
		return err, err
	}
	var msgs [][]byte
	mute := how == cutMute
	if mute {
		m, err := tcfilter.MuteMessage(idx)
		if err != nil {
			muteErr, mute = err, false
		} else {
			msgs = append(msgs, m)
		}
	}
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(idx)
	if how == cutDown {
		msg.Change = unix.IFF_UP
		msg.Flags = 0
	}
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(RetiredGroup)))
	msgs = append(msgs, req.Serialize())
	res, xerr := c.Exchange(msgs)
	if xerr != nil {
		return xerr, xerr
	}
	if mute {
		if muteErr = res[0]; errors.Is(muteErr, unix.EEXIST) {
			muteErr = nil
		}
	}
	return muteErr, res[len(res)-1]
}
