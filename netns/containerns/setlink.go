package containerns

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/sysctl"
)

// linkChange is what Configure changes of one container link in a single
// RTM_SETLINK request, instead of one request (and one notification to
// every listener on the machine) per attribute.
type linkChange struct {
	index int
	mac   net.HardwareAddr // nil: unchanged
	mtu   int              // 0: unchanged
	up    bool
	// ipv4 are per-device IPv4 settings (sysctl.Devconf*; see
	// sysctl.Dir.SetIPv4Conf for the keys that may be set this way).
	ipv4 map[int]uint32
	// noAddrGen turns IPv6 address generation off (IFLA_INET6_ADDR_GEN_MODE
	// none): the link gets no link-local address of its own.
	noAddrGen bool
}

// inet6AddrGenModeNone is IN6_ADDR_GEN_MODE_NONE (linux/if_link.h).
const inet6AddrGenModeNone = 1

// apply sends the change on a socket of the calling thread's namespace
// (call it inside the container's NS.Do). The kernel checks the form of
// the attributes (validate_linkmsg, each family's validate_link_af) before
// it changes anything, then sets, under one hold of the rtnl lock, the
// address, the MTU, the flags and last the per-family settings.
func (c linkChange) apply() error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(c.index)
	if c.up {
		msg.Flags, msg.Change = unix.IFF_UP, unix.IFF_UP
	}
	req.AddData(msg)
	if c.mac != nil {
		req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, c.mac))
	}
	if c.mtu > 0 {
		mtu := make([]byte, 4)
		binary.NativeEndian.PutUint32(mtu, uint32(c.mtu))
		req.AddData(nl.NewRtAttr(unix.IFLA_MTU, mtu))
	}
	if len(c.ipv4) > 0 || c.noAddrGen {
		spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
		if len(c.ipv4) > 0 {
			spec.AddChild(sysctl.IPv4ConfAttr(c.ipv4))
		}
		if c.noAddrGen {
			inet6 := nl.NewRtAttr(unix.AF_INET6, nil)
			inet6.AddRtAttr(unix.IFLA_INET6_ADDR_GEN_MODE, []byte{inet6AddrGenModeNone})
			spec.AddChild(inet6)
		}
		req.AddData(spec)
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("link %d: %s: %w", c.index, c, err)
	}
	return nil
}

// String says what the change sets, for errors.
func (c linkChange) String() string {
	s := ""
	if c.mac != nil {
		s += fmt.Sprintf("MAC %s, ", c.mac)
	}
	if c.mtu > 0 {
		s += fmt.Sprintf("MTU %d, ", c.mtu)
	}
	if c.up {
		s += "up, "
	}
	if len(c.ipv4) > 0 {
		s += "IPv4 settings " + sysctl.DescribeIPv4Conf(c.ipv4) + ", "
	}
	if c.noAddrGen {
		s += "IPv6 address generation off, "
	}
	if s == "" {
		return "nothing"
	}
	return s[:len(s)-2]
}
