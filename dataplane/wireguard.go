package dataplane

// The wire guard (package tcfilter/wirebpf): a BPF program at the tcx
// egress of host eth0 drops frames larger than eth0 takes, counted for the
// container whose veth they came from.

import (
	"github.com/isolatord/isolatord/netns/containerns"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/tcfilter/wirebpf"
)

// startWireGuard loads the guard and puts it on eth0 (d.mu held, during
// PrepareHost). A kernel that cannot run it costs one log line.
func (d *DataPlane) startWireGuard(eth0 int, drops *tcfilter.DropSinks) {
	counts, reason, err := drops.WireCounts()
	if err != nil {
		d.log.Warn("wire guard drops not counted per container", "err", err)
	}
	g, err := wirebpf.Load(d.hostNS.Do, counts, reason)
	if counts != nil {
		counts.Close()
	}
	if err == nil {
		if err = g.Attach(eth0); err != nil {
			g.Close()
		}
	}
	if err != nil {
		d.log.Warn("wire guard unavailable (BPF program at eth0's tcx egress): containers' large datagrams to the host over 127.0.0.1/::1 are lost, and frames of up to 4 bytes over the MTU from their packet sockets reach the wire", "err", err)
		return
	}
	d.wire = g
	d.lopath.Store(true)
}

// vethMTU is the MTU of a container's host-side veth and shaper pair
// (mtu the host's): containerns.EthMTU with the wire guard on, so that a
// container's datagrams to the host's lo cross unfragmented (its lo has
// containerns.LoMTU); the host's without it.
func (d *DataPlane) vethMTU(mtu int) int {
	if d.lopath.Load() && mtu > 0 {
		return containerns.EthMTU
	}
	return mtu
}

// loMTU is the container lo's MTU instead of the host's (0: the host's).
func (d *DataPlane) loMTU() int {
	if d.lopath.Load() {
		return containerns.LoMTU
	}
	return 0
}

// wireEth0 puts the guard on a recreated eth0 (d.mu held).
func (d *DataPlane) wireEth0(eth0 int) {
	if d.wire == nil {
		return
	}
	err := d.wire.Attach(eth0)
	if err == nil {
		return
	}
	// Without the guard no host veth may take more than the wire: back
	// to the host's MTU (containers' large datagrams over 127.0.0.1/::1
	// are lost again).
	d.lopath.Store(false)
	n := 0
	for _, rec := range d.ctrs {
		if rec.veth > 0 && d.h.LinkSetMTU(linkRefIdx(rec.veth), d.info.MTU) != nil {
			n++
		}
	}
	d.log.Error("wire guard not on the recreated eth0: host veths back at the host's MTU", "err", err, "failed", n)
}
