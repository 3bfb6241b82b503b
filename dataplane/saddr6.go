package dataplane

// IPv6 source address selection on a host with many links.
//
// A host socket that sends IPv6 without a source of its own (a UDP server
// bound to :: answering with sendto, an unconnected client) has the kernel
// choose one for every datagram, and ipv6_dev_get_saddr takes RFC 6724's
// candidates from every link of the namespace: one or two cache misses per
// link, each container's host-side veth among them (they hold no address,
// but each has its IPv6 device). Measured in the sandbox: a host UDP
// server's IPv6 request/response rate fell from 17,000/s to 6,400/s with
// 1,000 containers; IPv4 (the source comes with the route) did not move.
// It is the same over lo (a container's datagram to a host IPv6 address:
// the route to a local address carries the IPv6 device of the link that
// holds it).
//
// net.ipv6.conf.<eth0>.use_oif_addrs_only=1 restricts the candidates, for
// destinations routed through eth0 and eth0's own addresses, to eth0's
// addresses: the cost no longer grows with the containers. isolatord sets
// it only while it cannot change a choice: when no other link holds an
// IPv6 address wider than link-local (lo's ::1 aside). Then every
// candidate the kernel would weigh besides eth0's is ::1 or a link-local
// address of another link, which loses to eth0's addresses by scope (RFC
// 6724 rule 2) or is not a candidate for eth0's destinations at all. When
// another link gains such an address (the follower hears it), isolatord
// puts back the value it found; a value it did not set is never changed
// back.

import (
	"fmt"
	"net"

	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/vishvananda/netlink"
)

// saddr6State is what syncSaddr6 last did (d.mu held).
type saddr6State struct {
	eth0     int    // the eth0 index it applies to
	set      bool   // this run wrote 1 there
	original string // the value found before writing 1
	said     string // the last decision logged, with its reason
}

// saddr6Knob is the sysctl for link name.
func saddr6Knob(name string) string { return "net/ipv6/conf/" + name + "/use_oif_addrs_only" }

// saddr6Blocker returns a link other than eth0 holding an IPv6 address
// wider than link-local (lo's ::1 aside), and whether eth0 holds one.
func saddr6Blocker(addrs []netlink.Addr, eth0 int, name func(int) string) (blocker string, eth0Global bool) {
	for _, a := range addrs {
		if !saddr6Event(a.IP) {
			continue
		}
		if a.LinkIndex == eth0 {
			eth0Global = true
			continue
		}
		if blocker == "" {
			blocker = fmt.Sprintf("%s holds %s", name(a.LinkIndex), a.IP)
		}
	}
	return blocker, eth0Global
}

// syncSaddr6 narrows or widens eth0's IPv6 source candidates as above
// (d.mu held; PrepareHost and each follower pass). Errors are logged: the
// data plane works either way, host sockets just pay more.
func (d *DataPlane) syncSaddr6() {
	eth0, name := d.links.Eth0Index, d.links.Eth0
	if eth0 <= 0 || d.hostSysctl == nil || !d.hostSysctl.HasIPv6() {
		return
	}
	st := &d.saddr6
	if st.eth0 != eth0 { // a recreated eth0 starts with the kernel's default
		*st = saddr6State{eth0: eth0, said: st.said}
	}
	addrs, err := d.h.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		d.log.Warn("IPv6 source selection: cannot read the host's addresses; left as it is", "err", err)
		return
	}
	blocker, eth0Global := saddr6Blocker(addrs, eth0, d.linkName)
	knob := saddr6Knob(name)
	var said string // narrowed, widened, kept, open
	err = d.withHostSysctls(func(sd *sysctl.Dir) error {
		cur, err := sd.Read(knob)
		if err != nil {
			return err
		}
		switch {
		case eth0Global && blocker == "":
			if cur != "1" {
				if err := sd.Write(knob, "1"); err != nil {
					return err
				}
				st.set, st.original = true, cur
			}
			said = "narrowed"
		case st.set:
			if err := sd.Write(knob, st.original); err != nil {
				return err
			}
			st.set = false
			said = "widened"
		case cur == "1":
			said = "kept"
		default:
			said = "open"
		}
		return nil
	})
	if err != nil {
		d.log.Warn("IPv6 source selection: cannot set "+knob+"; left as it is", "err", err)
		return
	}
	if !eth0Global && blocker == "" {
		said = "" // no IPv6 of the host's own to choose from: nothing to say
	}
	if said == "" || said+blocker == st.said {
		return
	}
	st.said = said + blocker
	switch said {
	case "narrowed":
		d.log.Info("IPv6 source selection: candidates narrowed to eth0's addresses (use_oif_addrs_only=1), which are the host's only IPv6 addresses: a host socket's datagrams without a source of their own no longer cost a look at every container's link",
			"eth0", name)
	case "kept":
		d.log.Info("IPv6 source selection: use_oif_addrs_only=1 on eth0, not set by this run, left as it is though another link holds an IPv6 address",
			"eth0", name, "link", blocker)
	default:
		d.log.Info("IPv6 source selection: every link's addresses are candidates (use_oif_addrs_only as found) because another link holds an IPv6 address: a host socket's datagrams without a source of their own cost a look at every container's link",
			"eth0", name, "link", blocker)
	}
}

// linkName names link index for a log line.
func (d *DataPlane) linkName(index int) string {
	if l, err := d.h.LinkByIndex(index); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprintf("link %d", index)
}

// saddr6Event says whether ip counts for syncSaddr6's decision (and its
// notification may change it): an IPv6 address wider than link-local.
func saddr6Event(ip net.IP) bool {
	return ip != nil && ip.To4() == nil && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() && !ip.IsMulticast()
}
