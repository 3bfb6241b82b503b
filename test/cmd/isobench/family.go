package main

import (
	"net"

	"github.com/isolatord/isolatord/test/sandbox"
)

// family is the IP family a data-plane case is measured over. The sandboxes
// are dual-stack (sandbox.WithIPv6, addresses of 2001:db8::/32), so every
// daemon gives its containers IPv6 too (--ipv6 is on by default when the
// host has a global IPv6 address, as a dual-stack host has), and every
// server (`isotraffic serve --tcp :port`) answers on both: each case is
// measured over IPv4 and over IPv6, in the same interleaved rounds.
type family string

const (
	ipv4 family = "ipv4"
	ipv6 family = "ipv6"
)

var families = []family{ipv4, ipv6}

// hostIP is the sandbox host's address the clients connect to in family f.
func (f family) hostIP(sb *sandbox.Sandbox) net.IP {
	if f == ipv6 {
		return sb.HostIP6
	}
	return sandbox.HostIP
}

// label is how the tables name the family.
func (f family) label() string {
	if f == ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

// targetSuffix is appended to the name of a data-plane target of family f
// (the IPv4 names are the original ones).
func (f family) targetSuffix() string {
	if f == ipv6 {
		return " IPv6"
	}
	return ""
}

// dataPlane is the part of the results holding family f's figures.
func (r *Results) dataPlane(f family) *DataPlane {
	if f == ipv6 {
		return r.DataPlane6
	}
	return &r.DataPlane
}
