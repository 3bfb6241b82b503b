package neighsync

import (
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// A container's neighbour settings (ContainerSysctls, ContainerSysctls6)
// are written over netlink, as the neighbour table's per-device parameters
// (RTM_SETNEIGHTBL: NDTA_PARMS of the device), through the request handle
// the Syncer holds in the container's namespace anyway. Writing them as
// sysctls went through the shared /proc, whose dentry hash chains for
// /proc/sys/net/ipv4/neigh/eth0/... grow with every namespace that ever
// looked the same names up. Both set the same value and mark it as set for
// the device (a later change of the table's default does not override it).

// Attributes of linux/neighbour.h that x/sys/unix does not name.
const (
	ndtaName  = 1 // NDTA_NAME: the table ("arp_cache", "ndisc_cache")
	ndtaParms = 6 // NDTA_PARMS: nested NDTPA_* of one device

	ndtpaIfindex     = 1  // NDTPA_IFINDEX
	ndtpaAppProbes   = 9  // NDTPA_APP_PROBES: app_solicit
	ndtpaMcastProbes = 11 // NDTPA_MCAST_PROBES: mcast_solicit
)

// Values of ContainerSysctls and ContainerSysctls6 (app_solicit and
// mcast_solicit), as parameters.
const (
	appSolicit   = 3
	mcastSolicit = 0
)

// setProbes makes device ifindex ask user space appSolicit times and the
// wire never, for IPv4 and, if v6, IPv6. It runs on a thread inside the
// device's namespace (each request opens a netlink socket there: the
// library's Handle sends no request it does not build itself).
func setProbes(ifindex int, v6 bool) error {
	tables := []struct {
		family uint8
		name   string
	}{{unix.AF_INET, "arp_cache"}, {unix.AF_INET6, "ndisc_cache"}}
	if !v6 {
		tables = tables[:1]
	}
	for _, t := range tables {
		req := nl.NewNetlinkRequest(unix.RTM_SETNEIGHTBL, unix.NLM_F_ACK)
		req.AddData(&ndtmsg{family: t.family})
		req.AddData(nl.NewRtAttr(ndtaName, nl.ZeroTerminated(t.name)))
		p := nl.NewRtAttr(ndtaParms, nil)
		p.AddRtAttr(ndtpaIfindex, nl.Uint32Attr(uint32(ifindex)))
		p.AddRtAttr(ndtpaAppProbes, nl.Uint32Attr(appSolicit))
		p.AddRtAttr(ndtpaMcastProbes, nl.Uint32Attr(mcastSolicit))
		req.AddData(p)
		if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
			return fmt.Errorf("%s parameters of ifindex %d: %w", t.name, ifindex, err)
		}
	}
	return nil
}

// ndtmsg is struct ndtmsg (family, 3 bytes of padding).
type ndtmsg struct{ family uint8 }

func (m *ndtmsg) Len() int { return 4 }

func (m *ndtmsg) Serialize() []byte { return []byte{m.family, 0, 0, 0} }
