package tcfilter

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/isolatord/isolatord/ephemeral"
)

// The host's loopback is the operator's to open. A host service bound only
// to 127.0.0.1, 127.0.0.53 or ::1 (an agent's API, etcd, kubelet's
// healthz, a local resolver) trusts every sender to be a host process; a
// container's TCP and UDP to 127.0.0.0/8 or ::1 therefore passes its veth
// only to a destination port in LoopPorts, a table of the veth
// (TableVethLoopPort, divisor 1, one node per aligned range, node ids
// 1..n) between the loopback link nodes and the source-port check:
//
//   - the ports containers may own (the daemon's static ports and
//     ephemeral pool): host lo's demux steers 127.0.0.1:P to P's owner, so
//     containers keep reaching each other through 127.0.0.1 and ::1;
//   - the host's own ip_local_port_range: a host client that connected to
//     a container on 127.0.0.1 or ::1 gets its replies (a host service
//     listening on a port of that range stays reachable: documented);
//   - the ports the operator opened (--host-loopback-ports).
//
// Everything else is dropped as DropLoopback, counted per container. The
// decision is the veth's, where the tenant cannot touch it, whatever its
// source port or raw sockets; the table depends on the daemon's
// configuration, not on the number of containers, and only packets a
// container sends to 127/8 or ::1 walk it. Packets for 127/8 arriving on
// the host's eth0 never match the demux (it matches the host IP) and the
// host's stack drops them as martians (route_localnet is set on lo only).
const TableVethLoopPort = 0x01d

// MaxLoopPortNodes bounds the aligned ranges of LoopPorts (a node each).
const MaxLoopPortNodes = 256

// LoopPortRanges splits the ports a container may reach on the host's
// loopback into the aligned ranges of TableVethLoopPort.
func LoopPortRanges(s ephemeral.Set) ([]ephemeral.Range, error) {
	rs := ephemeral.Split(s)
	if len(rs) > MaxLoopPortNodes {
		return nil, fmt.Errorf("loopback ports %s: %d aligned ranges, at most %d", s, len(rs), MaxLoopPortNodes)
	}
	return rs, nil
}

// loopPortNodes are the nodes of TableVethLoopPort: an allowed destination
// port goes on to the source-port check (TableVethLocal; default
// DropPort).
func (v VethFilters) loopPortNodes() []node {
	var ns []node
	for i, r := range v.LoopPorts {
		if i >= MaxLoopPortNodes || !r.IsAligned() {
			break // check refuses these
		}
		ns = append(ns, v.drop(node{prio: PrioIP, handle: MakeU32Handle(TableVethLoopPort, 0, uint32(1+i)),
			sel: sel(0, dportKey(r)), link: vethLocal.hashTable}, DropPort))
	}
	return ns
}

// checkLoopPorts refuses loopback ranges the table cannot hold.
func (v VethFilters) checkLoopPorts() error {
	if len(v.LoopPorts) > MaxLoopPortNodes {
		return fmt.Errorf("veth filters: %d loopback port ranges, at most %d", len(v.LoopPorts), MaxLoopPortNodes)
	}
	for _, r := range v.LoopPorts {
		if !r.IsAligned() {
			return fmt.Errorf("veth filters: loopback port range %s: %w", r, ErrNotAligned)
		}
	}
	return nil
}

// toLoopPorts is the link of the loopback nodes (at the L4 header): on to
// TableVethLoopPort, DropLoopback when the destination port is not there.
func (v VethFilters) toLoopPorts(prio uint16, handle uint32, s *nl.TcU32Sel) node {
	return v.drop(node{prio: prio, handle: handle, sel: s, link: TableVethLoopPort}, DropLoopback)
}

// staleLoopPorts are the deletions of the nodes of TableVethLoopPort in fs
// beyond the ones v wants (a shorter LoopPorts than before).
func (v VethFilters) staleLoopPorts(b *batch, d dev, fs []*netlink.U32) {
	want := uint32(len(v.loopPortNodes()))
	for _, f := range fs {
		htid, _, nid := SplitU32Handle(f.Handle)
		if f.Priority == PrioIP && htid == TableVethLoopPort && nid > want {
			b.del(d, KindIP, PrioIP, f.Handle, true)
		}
	}
}

// SetLoopPorts brings the veth's loopback port table in line with
// v.LoopPorts (the operator changed --host-loopback-ports): nodes are
// replaced in place (a node whose range changed is deleted and added
// again: a packet for it meanwhile is dropped as DropLoopback), the ones
// beyond the new list deleted.
func (v VethFilters) SetLoopPorts() error {
	if err := v.check(); err != nil {
		return err
	}
	d := v.dev()
	fs, err := d.list()
	if err != nil {
		return err
	}
	var table []*netlink.U32
	for _, f := range fs {
		if htid, _, _ := SplitU32Handle(f.Handle); f.Priority == PrioIP && htid == TableVethLoopPort {
			table = append(table, f)
		}
	}
	if err := syncFixed(v.C, d, v.loopPortNodes(), table); err != nil {
		return err
	}
	b := batch{c: v.C}
	v.staleLoopPorts(&b, d, table)
	_, err = b.run()
	return err
}
