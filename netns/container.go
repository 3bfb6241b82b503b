package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ContainerConfig is how a container namespace is set up to share the host's
// IPv4 address and MAC.
type ContainerConfig struct {
	Eth0    string           // the container end of the veth, already inside the namespace
	Lo      string           // loopback name, "" = "lo"
	Addr    net.IPNet        // the host's primary IPv4 address and prefix
	MAC     net.HardwareAddr // the host's MAC (given to lo; eth0 got it at creation)
	MTU     int              // the host's MTU (given to lo; eth0 got it at creation)
	Gateway net.IP           // default gateway, nil for none
	Ports   ephemeral.Range  // becomes ip_local_port_range
	Copy    []Sysctl         // host sysctls to replicate (skipped if missing in the namespace)
}

// ContainerLinks are the ifindexes of the configured container links.
type ContainerLinks struct {
	Eth0 int
	Lo   int
}

// Container settings. Each one is needed by a traffic path:
//
//   - IPv6 off for the whole namespace: the shared MAC would give every
//     container the same link-local address (DAD failures, duplicates), and
//     IPv6 is not isolated by the port filters.
//   - ip_local_port_range = the container's ephemeral block, so its outgoing
//     connections use source ports the host filters send back to it.
//   - eth0 and lo accept_local=1: host-local traffic arrives with the shared
//     IP as source; without it the kernel drops it as IP_LOCAL_SOURCE.
//   - lo route_localnet=1: 127.0.0.1 traffic redirected between namespaces.
//   - rp_filter 0 on all/eth0/lo: redirected frames arrive on an interface
//     the reverse route does not point to (a new namespace copies "all" and
//     "default" from the initial one, where distributions turn it on).
//   - eth0 arp_ignore=8: only the host answers ARP for the shared address;
//     the containers see the requests mirrored to them and must stay silent.
//
// ContainerSysctls are the ones written through /proc/sys, in order;
// ContainerDevconf the per-device IPv4 ones, set over netlink.
func ContainerSysctls(ports ephemeral.Range) []Sysctl {
	return []Sysctl{
		// Writing "all" also sets "default" and every existing device
		// (addrconf_disable_ipv6), so eth0 and lo need no write of their own.
		{"net/ipv6/conf/all/disable_ipv6", "1"},
		{"net/ipv4/ip_local_port_range", fmt.Sprintf("%d %d", ports.Begin, ports.End)},
		{"net/ipv4/conf/all/rp_filter", "0"},
	}
}

// ContainerDevconf are the per-device IPv4 settings of the container's eth0
// and lo (see ContainerSysctls for why each is needed).
func ContainerDevconf() (eth0, lo map[int]uint32) {
	return map[int]uint32{DevconfAcceptLocal: 1, DevconfRPFilter: 0, DevconfArpIgnore: 8},
		map[int]uint32{DevconfAcceptLocal: 1, DevconfRouteLocalnet: 1, DevconfRPFilter: 0}
}

// ConfigureContainer configures the namespace ns through h (a netlink handle
// opened inside ns): settings (ContainerDevconf, ContainerSysctls, then
// cfg.Copy), lo gets the
// host MAC and MTU and is set up, eth0 gets the host address and is set up,
// and the default route goes via cfg.Gateway. Sysctls are written before any
// link goes up, so no IPv6 address or ARP reply ever appears.
func ConfigureContainer(ns *NS, h *netlink.Handle, cfg ContainerConfig) (ContainerLinks, error) {
	var cl ContainerLinks
	if cfg.Lo == "" {
		cfg.Lo = "lo"
	}
	if cfg.Addr.IP.To4() == nil {
		return cl, fmt.Errorf("container address %v is not IPv4", cfg.Addr.IP)
	}
	if cfg.Ports.Size() == 0 {
		return cl, errors.New("container ephemeral port range is empty")
	}
	eth, err := h.LinkByName(cfg.Eth0)
	if err != nil {
		return cl, fmt.Errorf("container %s: %w", cfg.Eth0, err)
	}
	lo, err := h.LinkByName(cfg.Lo)
	if err != nil {
		return cl, fmt.Errorf("container %s: %w", cfg.Lo, err)
	}
	cl.Eth0, cl.Lo = eth.Attrs().Index, lo.Attrs().Index

	sysctls := ContainerSysctls(cfg.Ports)
	ethConf, loConf := ContainerDevconf()
	err = ns.Do(func() error {
		if err := SetIPv4ConfHere(cl.Eth0, ethConf); err != nil {
			return err
		}
		if err := SetIPv4ConfHere(cl.Lo, loConf); err != nil {
			return err
		}
		sd, err := OpenSysctlDir()
		if err != nil {
			return err
		}
		defer sd.Close()
		for _, kv := range sysctls {
			err := sd.Write(kv.Name, kv.Value)
			if err != nil && errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(kv.Name, "net/ipv6/") && !sd.ipv6Present() {
				continue // no IPv6 in this kernel: nothing to turn off
			}
			if err != nil {
				return err
			}
		}
		for _, kv := range cfg.Copy {
			err := sd.Write(kv.Name, kv.Value)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return cl, fmt.Errorf("container sysctls: %w", err)
	}

	if len(cfg.MAC) == 6 {
		if err := h.LinkSetHardwareAddr(lo, cfg.MAC); err != nil {
			return cl, fmt.Errorf("container %s MAC: %w", cfg.Lo, err)
		}
	}
	if cfg.MTU > 0 {
		if err := h.LinkSetMTU(lo, cfg.MTU); err != nil {
			return cl, fmt.Errorf("container %s MTU: %w", cfg.Lo, err)
		}
	}
	if err := h.LinkSetUp(lo); err != nil {
		return cl, fmt.Errorf("container %s up: %w", cfg.Lo, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: cfg.Addr.IP.To4(), Mask: cfg.Addr.Mask}}
	if err := h.AddrAdd(eth, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return cl, fmt.Errorf("container %s address %s: %w", cfg.Eth0, addr.IPNet, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return cl, fmt.Errorf("container %s up: %w", cfg.Eth0, err)
	}
	if cfg.Gateway != nil {
		r := &netlink.Route{LinkIndex: cl.Eth0, Gw: cfg.Gateway.To4(), Scope: netlink.SCOPE_UNIVERSE}
		if err := h.RouteReplace(r); err != nil {
			return cl, fmt.Errorf("container default route via %s: %w", cfg.Gateway, err)
		}
	}
	return cl, nil
}
