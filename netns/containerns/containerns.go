// Package containerns configures a container's network namespace to share
// the host's IPv4 address and MAC (and, when asked, its IPv6 addresses:
// ipv6.go): the settings every traffic path needs
// (sysctls, per-device IPv4 settings), lo with the host's MAC and MTU, eth0
// with the host's address, and the default route; eth0 has MTU EthMTU and
// the routes through it the host's MTU (mtu.go). It also names the host
// sysctls copied into every container. It is tested on a real veth between
// scratch namespaces (root; the tests skip otherwise).
package containerns

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Config is how a container namespace is set up to share the host's
// IPv4 address and MAC.
type Config struct {
	Eth0    string           // the container end of the veth, already inside the namespace
	Lo      string           // loopback name, "" = "lo"
	Addr    net.IPNet        // the host's primary IPv4 address and prefix
	MAC     net.HardwareAddr // the host's MAC (given to lo; eth0 got it at creation)
	MTU     int              // the host's MTU (lo's, and the routes' through eth0; eth0 gets EthMTU: mtu.go)
	LoMTU   int              // lo's MTU instead of MTU (LoMTU with the host's wire guard on; 0: MTU)
	Gateway net.IP           // default gateway, nil for none
	Ports   ephemeral.Range  // becomes ip_local_port_range
	Copy    []sysctl.Setting // host sysctls to replicate (skipped if missing in the namespace)
	// IPv6, when set, gives eth0 the host's IPv6 addresses and routes and
	// lo ::1 (ipv6.go); nil keeps IPv6 off in the namespace.
	IPv6 *hostlink.IPv6
}

// Links are the ifindexes of the configured container links.
type Links struct {
	Eth0 int
	Lo   int
}

// Container settings. Each one is needed by a traffic path:
//
//   - IPv6 off for the whole namespace unless Config.IPv6 says otherwise
//     (ipv6.go): the shared MAC would give every container the same
//     link-local address (DAD failures, duplicates).
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
// Sysctls are the ones written through /proc/sys, in order;
// Devconf the per-device IPv4 ones, set over netlink.
func Sysctls(ports ephemeral.Range) []sysctl.Setting {
	return []sysctl.Setting{
		// Writing "all" also sets "default" and every existing device
		// (addrconf_disable_ipv6), so eth0 and lo need no write of their own.
		{Name: allDisableIPv6, Value: "1"},
		{Name: "net/ipv4/ip_local_port_range", Value: fmt.Sprintf("%d %d", ports.Begin, ports.End)},
		{Name: "net/ipv4/conf/all/rp_filter", Value: "0"},
	}
}

// allDisableIPv6 is the IPv6 switch of every device of a namespace.
const allDisableIPv6 = "net/ipv6/conf/all/disable_ipv6"

// Devconf are the per-device IPv4 settings of the container's eth0
// and lo (see Sysctls for why each is needed).
func Devconf() (eth0, lo map[int]uint32) {
	return map[int]uint32{sysctl.DevconfAcceptLocal: 1, sysctl.DevconfRPFilter: 0, sysctl.DevconfArpIgnore: 8},
		map[int]uint32{sysctl.DevconfAcceptLocal: 1, sysctl.DevconfRouteLocalnet: 1, sysctl.DevconfRPFilter: 0}
}

// Configure configures the namespace ns through h (a netlink handle
// opened inside ns), on one thread inside ns: eth0's per-device settings
// (Devconf; IPv6 address generation off when cfg.IPv6 is set) in one
// request, the sysctls (Sysctls, then cfg.Copy) through a private procfs
// instance of ns (sysctl.Dir), then lo's settings, the host MAC and MTU and
// up in one request; then eth0 gets the host address and is set up, and
// the default route goes via cfg.Gateway. Sysctls are written before any
// link goes up, so no IPv6 address or ARP reply ever appears.
func Configure(ns *nshandle.NS, h *netlink.Handle, cfg Config) (Links, error) {
	var cl Links
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

	ethConf, loConf := Devconf()
	ethChange := linkChange{index: cl.Eth0, ipv4: ethConf, noAddrGen: cfg.IPv6 != nil}
	if cfg.MTU > 0 {
		ethChange.mtu = EthMTU // the routes carry cfg.MTU (mtu.go)
	}
	// lo's settings only let more through (accept_local, route_localnet,
	// rp_filter off), so that the kernel sets them just after the flags
	// within the request opens no window for anything unwanted.
	loChange := linkChange{index: cl.Lo, ipv4: loConf, up: true, mtu: cfg.MTU}
	if cfg.LoMTU > 0 && cfg.MTU > 0 {
		loChange.mtu = cfg.LoMTU
	}
	if len(cfg.MAC) == 6 {
		loChange.mac = cfg.MAC
	}
	err = ns.Do(func() error {
		if err := ethChange.apply(); err != nil {
			return fmt.Errorf("container %s: %w", cfg.Eth0, err)
		}
		if err := sysctl.Here(func(sd *sysctl.Dir) error { return writeSysctls(sd, cfg) }); err != nil {
			return fmt.Errorf("container sysctls: %w", err)
		}
		if err := loChange.apply(); err != nil {
			return fmt.Errorf("container %s: %w", cfg.Lo, err)
		}
		return nil
	})
	if err != nil {
		return cl, err
	}

	addr := &netlink.Addr{IPNet: &net.IPNet{IP: cfg.Addr.IP.To4(), Mask: cfg.Addr.Mask}}
	if err := h.AddrAdd(eth, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return cl, fmt.Errorf("container %s address %s: %w", cfg.Eth0, addr.IPNet, err)
	}
	if cfg.IPv6 != nil {
		if err := preIPv6Up(h, eth, lo, cfg.IPv6); err != nil {
			return cl, err
		}
	}
	if err := h.LinkSetUp(eth); err != nil {
		return cl, fmt.Errorf("container %s up: %w", cfg.Eth0, err)
	}
	if cfg.IPv6 != nil {
		if err := postIPv6Up(h, cl.Eth0, cfg.IPv6, cfg.MTU); err != nil {
			return cl, err
		}
	}
	if err := connectedMTU4(h, cl.Eth0, cfg.Addr, cfg.MTU); err != nil {
		return cl, err
	}
	if cfg.Gateway != nil {
		r := &netlink.Route{LinkIndex: cl.Eth0, Gw: cfg.Gateway.To4(), Scope: netlink.SCOPE_UNIVERSE, MTU: cfg.MTU}
		if err := h.RouteReplace(r); err != nil {
			return cl, fmt.Errorf("container default route via %s: %w", cfg.Gateway, err)
		}
	}
	return cl, nil
}

// writeSysctls writes Configure's sysctls (Sysctls or the IPv6 ones, then
// the host's copied values) through sd.
func writeSysctls(sd *sysctl.Dir, cfg Config) error {
	for _, kv := range sysctlsFor(cfg) {
		var err error
		if kv.Name == allDisableIPv6 {
			err = sd.SetAllDisableIPv6(kv.Value) // written only when something differs
		} else {
			err = sd.Write(kv.Name, kv.Value)
		}
		if err != nil && errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(kv.Name, "net/ipv6/") && !sd.HasIPv6() {
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
}

// HostSysctlsToCopy are the namespaced sysctls whose host values are copied
// into every container (those a workload notices: listen backlog, ECN, TCP
// keepalive, buffers and retries). Missing ones are skipped.
var HostSysctlsToCopy = []string{
	"net/core/somaxconn",
	"net/ipv4/tcp_ecn",
	"net/ipv4/tcp_ecn_fallback",
	"net/ipv4/tcp_keepalive_time",
	"net/ipv4/tcp_keepalive_intvl",
	"net/ipv4/tcp_keepalive_probes",
	"net/ipv4/tcp_max_syn_backlog",
	"net/ipv4/tcp_rmem",
	"net/ipv4/tcp_wmem",
	"net/ipv4/tcp_retries2",
	"net/ipv4/tcp_synack_retries",
}
