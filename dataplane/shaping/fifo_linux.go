package shaping

import (
	"encoding/binary"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netlink v1.3.1 cannot give a bfifo a limit (its GenericQdisc sends no
// options, so the kernel sizes the queue from the device's txqueuelen), so
// the fifo leaf is created and resized with one hand-built RTM_NEWQDISC
// request: TCA_KIND "bfifo", TCA_OPTIONS = struct tc_fifo_qopt { __u32
// limit; }. The request goes through a socket opened in the namespace whose
// fd is nsFd (netlink.Handle does not expose its sockets); nsFd <= 0 means
// the calling thread's namespace.

// bfifoRequest creates (create) or changes in place (!create) the bfifo
// qdisc handle under parent on ifindex with a byte limit. A change keeps the
// queued packets (the kernel's fifo .change only sets the limit).
func bfifoRequest(nsFd, ifindex int, parent, handle, limit uint32, create bool) error {
	ns := netns.None()
	if nsFd > 0 {
		ns = netns.NsHandle(nsFd)
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket for the fifo leaf: %w", err)
	}
	defer s.Close()
	flags := 0
	if create {
		flags = unix.NLM_F_CREATE | unix.NLM_F_REPLACE
	}
	req := nl.NewNetlinkRequest(unix.RTM_NEWQDISC, flags|unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(ifindex), Handle: handle, Parent: parent})
	req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated("bfifo")))
	opt := make([]byte, 4)
	binary.NativeEndian.PutUint32(opt, limit)
	req.AddData(nl.NewRtAttr(nl.TCA_OPTIONS, opt))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return err
	}
	return nil
}
