package dataplane

import (
	"fmt"
	"net"
	"strings"

	"github.com/isolatord/isolatord/netns/hostlink"
)

// IPv6Mode says whether containers share the host's IPv6 addresses.
type IPv6Mode int

const (
	// IPv6Auto: on when the host's public interface has a global IPv6
	// address at PrepareHost, off otherwise; the follower turns it on
	// when one appears later (followIPv6).
	IPv6Auto IPv6Mode = iota
	// IPv6On: on; PrepareHost fails if the interface has no global IPv6
	// address.
	IPv6On
	// IPv6Off: off; containers' IPv6 stays disabled.
	IPv6Off
)

func (m IPv6Mode) String() string {
	switch m {
	case IPv6On:
		return "on"
	case IPv6Off:
		return "off"
	default:
		return "auto"
	}
}

// decideIPv6 reads the host's IPv6 facts (unless the mode is off) and
// decides whether containers get IPv6, saying so in one log line. It
// returns nil when they do not.
func (d *DataPlane) decideIPv6(hl hostlink.Links) (*hostlink.IPv6, error) {
	mode := d.cfg.IPv6
	if mode == IPv6Off {
		d.log.Info("IPv6: off (disabled by configuration); containers have IPv4 only", "mode", mode.String())
		return nil, nil
	}
	v6, err := hostlink.ReadIPv6(d.h, hl.Eth0Index)
	if err != nil {
		if mode == IPv6On {
			return nil, fmt.Errorf("IPv6: %w", err)
		}
		d.log.Warn("IPv6: off (the host's IPv6 addresses could not be read); containers have IPv4 only", "eth0", hl.Eth0, "err", err)
		return nil, nil
	}
	if !v6.HasGlobal() {
		if mode == IPv6On {
			return nil, fmt.Errorf("IPv6 is required but %s has no global IPv6 address", hl.Eth0)
		}
		d.log.Info("IPv6: off (the host interface has no global IPv6 address); containers have IPv4 only", "mode", mode.String(), "eth0", hl.Eth0)
		return nil, nil
	}
	d.log.Info("IPv6: on; containers share the host's IPv6 addresses", "mode", mode.String(), "eth0", hl.Eth0,
		"addresses", ipNets(v6.Global), "link_local", v6.LinkLocal.String(), "gateway", v6.Gateway(), "routes", len(v6.Routes))
	return &v6, nil
}

func ipNets(ns []net.IPNet) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = n.String()
	}
	return strings.Join(s, ",")
}

// IPv6 returns the host IPv6 facts containers get (nil: IPv6 is off or the
// host is not prepared).
func (d *DataPlane) IPv6() *hostlink.IPv6 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.v6
}

// shareIPv6 returns the addresses the filters match (filterAddrs6) and
// trims v6 to them: a container carries only addresses its filters let it
// use (the rest are not shared; a log line says which).
func (d *DataPlane) shareIPv6(v6 *hostlink.IPv6) []net.IP {
	addrs, dropped := filterAddrs6(v6.Global, v6.LinkLocal.IP)
	if dropped == 0 {
		return addrs
	}
	kept := map[string]bool{}
	for _, a := range addrs {
		kept[a.String()] = true
	}
	var global, left []net.IPNet
	for _, n := range v6.Global {
		if kept[n.IP.String()] {
			global = append(global, n)
		} else {
			left = append(left, n)
		}
	}
	v6.Global = global
	if !kept[v6.LinkLocal.IP.String()] {
		v6.LinkLocal = net.IPNet{}
	}
	d.log.Warn("IPv6: the host has more addresses than the filters match; containers get the first ones only",
		"shared", len(addrs), "not_shared", ipNets(left), "link_local_shared", v6.LinkLocal.IP != nil)
	return addrs
}
