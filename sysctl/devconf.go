package sysctl

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Per-device IPv4 settings (enum IPV4_DEVCONF_* of linux/ip.h) that
// Dir.SetIPv4Conf can set over netlink.
const (
	DevconfForwarding    = 1
	DevconfRPFilter      = 8
	DevconfArpIgnore     = 19
	DevconfAcceptLocal   = 23
	DevconfRouteLocalnet = 26
)

// devconfNames maps the settings above to their sysctl names (for errors
// and tests).
var devconfNames = map[int]string{
	DevconfForwarding:    "forwarding",
	DevconfRPFilter:      "rp_filter",
	DevconfArpIgnore:     "arp_ignore",
	DevconfAcceptLocal:   "accept_local",
	DevconfRouteLocalnet: "route_localnet",
}

// SetIPv4Conf sets per-device IPv4 settings (net/ipv4/conf/<dev>/...) of
// link ifindex in the Dir's namespace with one RTM_SETLINK
// request (IFLA_AF_SPEC / AF_INET / IFLA_INET_CONF), the way the kernel
// lets netlink set devconf values. It avoids /proc/sys: a sysctl file of a
// device named like one in every namespace (eth0, lo) is looked up against
// every namespace's copy of that dentry, which profiles showed growing with
// the number of containers. Like every Dir method, it runs on a thread of
// the Dir's namespace: the request goes out on a socket of that namespace.
func (d *Dir) SetIPv4Conf(ifindex int, conf map[int]uint32) error {
	if len(conf) == 0 {
		return nil
	}
	ids := make([]int, 0, len(conf))
	for id := range conf {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	inetConf := nl.NewRtAttr(unix.IFLA_INET_CONF, nil)
	for _, id := range ids {
		v := make([]byte, 4)
		binary.NativeEndian.PutUint32(v, conf[id])
		inetConf.AddRtAttr(id, v)
	}
	inet := nl.NewRtAttr(unix.AF_INET, inetConf.Serialize())
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, inet.Serialize())

	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	req.AddData(spec)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		var names []string
		for _, id := range ids {
			names = append(names, fmt.Sprintf("%s=%d", devconfNames[id], conf[id]))
		}
		return fmt.Errorf("set IPv4 settings %v of link %d: %w", names, ifindex, err)
	}
	return nil
}
