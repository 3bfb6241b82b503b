package sysctl

import (
	"encoding/binary"
	"fmt"
	"sort"
	"strings"

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
//
// The kernel only stores the values (inet_set_link_af); its sysctl handler
// does more for a few keys on a change, and SetIPv4Conf suits the keys
// where none of it matters:
//   - forwarding (devinet_sysctl_forward): a route cache flush, a netconf
//     notification and, when turned on, LRO off. Routing reads the device's
//     value for every packet it would forward (ip_route_input_slow), and
//     turning it off needs no LRO change: setting it to 0 is safe here, 1
//     is not (use Write).
//   - accept_local and route_localnet: a route cache flush when turned off
//     (a cached route may rely on them); turning them on needs none.
//   - rp_filter: a netconf notification only.
//   - arp_ignore: nothing.
func (d *Dir) SetIPv4Conf(ifindex int, conf map[int]uint32) error {
	if len(conf) == 0 {
		return nil
	}
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	spec.AddChild(IPv4ConfAttr(conf))
	req.AddData(spec)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("set IPv4 settings %s of link %d: %w", DescribeIPv4Conf(conf), ifindex, err)
	}
	return nil
}

// IPv4ConfAttr is the AF_INET attribute of an IFLA_AF_SPEC that sets conf
// (IFLA_INET_CONF, one u32 per IPV4_DEVCONF_* id, in id order), for a
// request that changes more of a link (see SetIPv4Conf for which keys may
// go this way).
func IPv4ConfAttr(conf map[int]uint32) *nl.RtAttr {
	inetConf := nl.NewRtAttr(unix.IFLA_INET_CONF, nil)
	for _, id := range sortedIDs(conf) {
		v := make([]byte, 4)
		binary.NativeEndian.PutUint32(v, conf[id])
		inetConf.AddRtAttr(id, v)
	}
	inet := nl.NewRtAttr(unix.AF_INET, nil)
	inet.AddChild(inetConf)
	return inet
}

// DescribeIPv4Conf names conf's settings and values, for errors.
func DescribeIPv4Conf(conf map[int]uint32) string {
	var names []string
	for _, id := range sortedIDs(conf) {
		names = append(names, fmt.Sprintf("%s=%d", devconfNames[id], conf[id]))
	}
	return "[" + strings.Join(names, " ") + "]"
}

func sortedIDs(conf map[int]uint32) []int {
	ids := make([]int, 0, len(conf))
	for id := range conf {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}
