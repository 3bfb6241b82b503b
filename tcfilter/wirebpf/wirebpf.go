// Package wirebpf guards the host's wire: a BPF program at the tcx egress
// of host eth0 drops every frame larger than eth0 takes (its MTU plus the
// Ethernet header, plus 4 bytes for a frame whose data carries a VLAN tag:
// the rule af_packet applies to a host's own packet sockets), and every
// GSO packet whose segments would be (bpf_check_mtu with
// BPF_MTU_CHK_SEGS: network and transport headers plus gso_size; the
// host's own are cut to the MSS their route gave and pass).
//
// Why: a veth checks a frame against the MTU of its receiving end
// (is_skb_forwardable on the peer), with 4 bytes of slack for a VLAN tag
// whether or not the frame has one, and a tc mirred redirect to eth0
// checks nothing. So a tenant writing frames on its eth0 through a packet
// socket put 1,504-byte IPv4 packets on the wire of a 1,500-byte link
// (untagged 1,518-byte frames: its VLAN check drops tagged ones), and a
// host-side veth with a larger MTU would let through frames of any size.
// A veth passes GSO packets of any size too, so a tenant's packet socket
// with PACKET_VNET_HDR choosing a gso_size over the MTU put oversized
// segments on the wire.
// Drops are counted in the drop sinks' count map by the interface the
// frame entered the host on (skb->ingress_ifindex: mirred sets it to a
// container's host-side veth for what its filters redirected to eth0; 0
// for the host's own frames) and the reason the data plane gives.
package wirebpf

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// progName is the program's name as the kernel reports it (how a
// restarted daemon finds its own program on eth0).
const progName = "wire_guard"

// Runner runs fn where ifindexes mean the host's devices (bpf(2) attach
// calls resolve them in the calling thread's network namespace).
type Runner func(fn func() error) error

// Guard is the loaded program.
type Guard struct {
	objs wireObjects
	do   Runner
}

// Load loads the program, counting its drops under reason (an index in
// tcfilter.DropReasons) in counts (the drop sinks' count map, keyed
// {veth, reason}; nil: a map of the program's own, not read). An error
// means the kernel cannot run it (no BPF, no tcx, no bpf_check_mtu).
func Load(do Runner, counts *ebpf.Map, reason uint32) (*Guard, error) {
	if do == nil {
		do = func(fn func() error) error { return fn() }
	}
	spec, err := loadWire()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[wireVarDropReason].Set(reason); err != nil {
		return nil, fmt.Errorf("wire guard: %w", err)
	}
	var opts ebpf.CollectionOptions
	if counts != nil {
		opts.MapReplacements = map[string]*ebpf.Map{wireMapIsoDrops: counts}
	}
	g := &Guard{do: do}
	if err := spec.LoadAndAssign(&g.objs, &opts); err != nil {
		return nil, fmt.Errorf("load wire guard: %w", err)
	}
	return g, nil
}

// Close releases what this process holds; the attached program stays.
func (g *Guard) Close() error { return g.objs.Close() }

// Attach puts the guard at the tcx egress of ifindex (host eth0),
// replacing a guard of an earlier run.
func (g *Guard) Attach(ifindex int) error {
	return g.do(func() error {
		opts := link.RawAttachProgramOptions{Target: ifindex, Program: g.objs.WireGuard, Attach: ebpf.AttachTCXEgress}
		if old := attached(ifindex); old != nil {
			defer old.Close()
			opts.Anchor = link.ReplaceProgram(old)
		}
		if err := link.RawAttachProgram(opts); err != nil {
			return fmt.Errorf("attach %s to ifindex %d: %w", progName, ifindex, err)
		}
		return nil
	})
}

// Detach removes the guard from ifindex's tcx egress (none: nil).
func (g *Guard) Detach(ifindex int) error {
	return g.do(func() error {
		old := attached(ifindex)
		if old == nil {
			return nil
		}
		defer old.Close()
		return link.RawDetachProgram(link.RawDetachProgramOptions{Target: ifindex, Program: old, Attach: ebpf.AttachTCXEgress})
	})
}

// Attached reports whether ifindex's tcx egress holds a guard.
func (g *Guard) Attached(ifindex int) (ok bool) {
	_ = g.do(func() error {
		if p := attached(ifindex); p != nil {
			ok = true
			p.Close()
		}
		return nil
	})
	return ok
}

// attached opens the guard on ifindex's tcx egress, or nil.
func attached(ifindex int) *ebpf.Program {
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXEgress})
	if err != nil {
		return nil
	}
	for _, ap := range res.Programs {
		p, err := ebpf.NewProgramFromID(ap.ID)
		if err != nil {
			continue
		}
		if info, err := p.Info(); err == nil && info.Name == progName {
			return p
		}
		p.Close()
	}
	return nil
}
