package containerns

import (
	"fmt"

	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/vishvananda/netlink"
)

// TurnOnIPv6 gives a running container set up without IPv6 (its eth0 up)
// what Configure gives one set up with v6: the host followed it gaining
// IPv6. The order keeps setup's promise that the container never sends
// anything of its own: eth0's address generation off (no link-local
// address of its own), then eth0's DAD, router advertisements,
// autoconfiguration and router solicitations off, and only then IPv6 on
// (all/disable_ipv6=0); then the host's addresses, lo's ::1 and the
// host's routes, with mtu (the host's) as their MTU metric. ns is the container's namespace, h a handle in it. A
// namespace that already has IPv6 addresses on eth0 is left to SyncIPv6.
func TurnOnIPv6(ns *nshandle.NS, h *netlink.Handle, eth0 string, v6 *hostlink.IPv6, mtu int) error {
	eth, err := h.LinkByName(eth0)
	if err != nil {
		return fmt.Errorf("container %s: %w", eth0, err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("container lo: %w", err)
	}
	if err := ns.Do(func() error { return linkChange{index: eth.Attrs().Index, noAddrGen: true}.apply() }); err != nil {
		return fmt.Errorf("container %s: %w", eth0, err)
	}
	err = sysctl.In(ns, func(sd *sysctl.Dir) error {
		kvs := IPv6Sysctls(eth0)
		for _, kv := range kvs {
			if kv.Name == allDisableIPv6 {
				continue // last
			}
			if err := sd.Write(kv.Name, kv.Value); err != nil {
				return err
			}
		}
		return sd.SetAllDisableIPv6("0")
	})
	if err != nil {
		return fmt.Errorf("container IPv6 settings: %w", err)
	}
	if err := preIPv6Up(h, eth, lo, v6); err != nil {
		return err
	}
	return postIPv6Up(h, eth.Attrs().Index, v6, mtu)
}
