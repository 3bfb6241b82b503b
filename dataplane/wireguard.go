package dataplane

// The wire guard (package tcfilter/wirebpf): a BPF program at the tcx
// egress of host eth0 drops frames larger than eth0 takes, counted for the
// container whose veth they came from.

import (
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
		d.log.Warn("wire guard unavailable (BPF program at eth0's tcx egress): frames of up to 4 bytes over the MTU from containers' packet sockets reach the wire", "err", err)
		return
	}
	d.wire = g
}

// wireEth0 puts the guard on a recreated eth0 (d.mu held).
func (d *DataPlane) wireEth0(eth0 int) {
	if d.wire == nil {
		return
	}
	if err := d.wire.Attach(eth0); err != nil {
		d.log.Warn("wire guard not on the recreated eth0", "err", err)
	}
}
