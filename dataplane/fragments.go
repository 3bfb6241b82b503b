package dataplane

// Fragmented datagrams (package tcfilter/fragbpf): the steer program at
// the tcx ingress of host eth0 and host lo, the learn program at the tcx
// egress of every container's host-side veth.

import (
	"github.com/isolatord/isolatord/tcfilter/fragbpf"
)

// FragmentStats are the fragment programs' counters (zero, with Enabled
// false, when the kernel could not run them).
type FragmentStats struct {
	Enabled bool
	fragbpf.Counts
	Size    int  // datagrams each table (IPv4, IPv6) holds
	Adopted bool // the tables were kept from an earlier run
}

// startFragments loads the fragment programs and puts the steer program
// on eth0 and lo (d.mu held, during PrepareHost). A kernel that cannot
// run them costs one log line: later fragments then stay with the host.
func (d *DataPlane) startFragments(eth0, lo int) {
	if d.cfg.FragmentTableSize < 0 {
		d.log.Info("fragment steering off (--fragment-table-size < 0): later fragments of datagrams to containers stay with the host")
		return
	}
	s, err := fragbpf.Load(d.cfg.FragmentTableSize, d.hostNS.Do, lo)
	if err == nil {
		if err = s.AttachSteer(lo); err == nil {
			err = s.AttachSteer(eth0)
		}
		if err != nil {
			_ = s.DetachSteer(lo)
			s.Close()
		}
	}
	if err != nil {
		d.log.Warn("fragment steering unavailable (BPF programs at tcx ingress/egress): later fragments of datagrams to containers stay with the host", "err", err)
		return
	}
	d.frag = s
	d.log.Info("fragment steering on", "table_size", s.Size(), "tables_kept", s.Adopted())
}

// fragEth0 puts the steer program on a recreated eth0 (d.mu held).
func (d *DataPlane) fragEth0(eth0 int) {
	if d.frag == nil {
		return
	}
	if err := d.frag.AttachSteer(eth0); err != nil {
		d.log.Warn("fragment steering not on the recreated eth0: later fragments from outside stay with the host", "err", err)
	}
}

// fragLearn puts the learn program on a container's host-side veth. A
// failure costs that container its later fragments (they stay with the
// host), not its setup.
func (d *DataPlane) fragLearn(id string, veth int) {
	if d.frag == nil {
		return
	}
	if err := d.frag.AttachLearn(veth); err != nil {
		d.log.Warn("fragment learning not on the container's veth: later fragments of its datagrams stay with the host", "container", id, "err", err)
	}
}

// Fragments reads the fragment programs' counters.
func (d *DataPlane) Fragments() (FragmentStats, error) {
	d.mu.Lock()
	s := d.frag
	d.mu.Unlock()
	if s == nil {
		return FragmentStats{}, nil
	}
	c, err := s.Counts()
	if err != nil {
		return FragmentStats{}, err
	}
	return FragmentStats{Enabled: true, Counts: c, Size: s.Size(), Adopted: s.Adopted()}, nil
}
