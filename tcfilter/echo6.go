package tcfilter

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/bpfprog"
)

// ICMPv6 echo replies by learning (eth0, with the IPv4 echo programs and
// an IPv6 demux): the twins of echo.go's programs (bpfprog's echo6.c), at
// PrioEcho6 (ETH_P_IPV6), before the u32 IPv6 classifier.
//
//   - learn6 (eth0 egress): an ICMPv6 echo request right after the fixed
//     header records {identifier, destination} -> the container's veth
//     (the origin map shared with IPv4, by skb_iif) or 0 for the host's
//     own in the echo6 map, owned while live and within a quota like
//     IPv4's (echoown.go; its own quota map and sweeper).
//   - steer6 (eth0 ingress): an echo reply, or an ICMPv6 error (types
//     1..7) quoting an echo request, whose {identifier, peer} is learned
//     is redirected to that veth or accepted for the host; everything
//     else continues to the u32 classifier (TablePort by identifier,
//     else the host).
//
// Per packet: one load and a few compares per IPv6 packet on eth0, one
// hash lookup per echo reply or request: flat in the number of
// containers, no copies. Not followed: fragments of a fragmented echo
// reply (they stay with the host; IPv6 fragments have no ICMPv6 header
// after the first), and the destination address of a reply is not
// checked (eth0 receives only the host's frames; a container drops a
// reply that is not for its addresses). A restarted daemon adopts the
// programs and maps of the same code, as for IPv4.

// PrioEcho6 is the priority of the ICMPv6 echo programs on eth0 (ingress
// and egress).
const PrioEcho6 uint16 = 3

type echo6Steer struct {
	m, quota     *ebpf.Map
	steer, learn *ebpf.Program
	sweep        *echoSweeper
}

func (e *echo6Steer) close() {
	e.sweep.halt()
	closeAll(e.m, e.quota, e.steer, e.learn)
}

// newEcho6Steer loads the IPv6 programs on the IPv4 programs' origin map
// and the drop count map counts (nil: none).
func newEcho6Steer(origin, counts *ebpf.Map) (*echo6Steer, error) {
	var o bpfprog.Echo6Objects
	replace := map[string]*ebpf.Map{bpfprog.Echo6MapIsoEchoOrigin: origin}
	if counts != nil {
		replace[bpfprog.Echo6MapIsoDrops] = counts
	}
	vars := map[string]any{bpfprog.Echo6VarEchoDropReason: uint32(slices.Index(DropReasons, DropEcho))}
	if err := loadObjects(bpfprog.LoadEcho6, &o, vars, replace); err != nil {
		return nil, err
	}
	o.IsoDrops.Close() // the programs hold them
	o.IsoEchoOrigin.Close()
	e := &echo6Steer{m: o.IsoEcho6, quota: o.IsoEcho6Quota, steer: o.IsoEcho6Steer, learn: o.IsoEcho6Learn}
	e.sweep = startSweep(e.m, e.quota)
	return e, nil
}

// echo6FilterNames are the filter names of the IPv6 steer and learn
// programs: the program name and a digest of the object (and whether the
// learn program counts its drops), so that a restarted daemon adopts
// programs of the same code.
func echo6FilterNames(counted bool) [2]string {
	return [2]string{filterName("iso_echo6_steer-", "echo6"), filterName("iso_echo6_learn-", "echo6", countsFlag(counted))}
}

// syncEcho6 (x.mu held) attaches the ICMPv6 echo programs when eth0 has
// the IPv4 ones and an IPv6 demux, and detaches them otherwise. Without
// them (Echo6Steering says why), ICMPv6 echo replies go by identifier
// (TablePort) or to the host. A restarted daemon adopts the programs (and
// what they learned) of its predecessor when they are the same code and
// use the origin map the IPv4 programs use.
func (x *HostDemux) syncEcho6() {
	x.echo6Err = nil
	if x.echo == nil || x.ip6 == nil || x.dst == nil {
		x.dropEcho6()
		if x.ip6 != nil && x.dst != nil {
			x.echo6Err = errors.New("no IPv4 echo programs (cls_bpf)")
		}
		return
	}
	names := echo6FilterNames(x.counts != nil)
	if x.echo6 == nil {
		x.echo6 = x.adoptEcho6(names)
	}
	if x.echo6 == nil {
		e, err := newEcho6Steer(x.echo.origin, x.counts)
		if err != nil {
			x.echo6Err = fmt.Errorf("%s: ICMPv6 echo programs: %w", x.d.label, err)
			return
		}
		x.echo6 = e
	}
	if err := x.attachEcho(PrioEcho6, unix.ETH_P_IPV6, x.echo6.steer, x.echo6.learn, names); err != nil {
		x.dropEcho6()
		x.echo6Err = err
		return
	}
}

// adoptEcho6 takes over the IPv6 echo programs and their map that the
// kernel runs under these names, if the learn program uses the IPv4
// programs' origin map; nil otherwise.
func (x *HostDemux) adoptEcho6(names [2]string) *echo6Steer {
	steer, learn, ok := x.echoProgs(PrioEcho6, names)
	if !ok {
		return nil
	}
	e := &echo6Steer{steer: steer, learn: learn}
	maps := takeMaps(progMaps(learn), bpfprog.Echo6MapIsoEcho6, bpfprog.Echo6MapIsoEcho6Quota)
	if maps == nil || !usesMap(learn, x.echo.origin) || x.counts != nil && !usesMap(learn, x.counts) {
		closeMaps(maps)
		e.close()
		return nil
	}
	e.m, e.quota = maps[0], maps[1]
	e.sweep = startSweep(e.m, e.quota)
	return e
}

// Echo6Steering reports whether ICMPv6 echo replies are steered by
// learning (nil) or not (the reason; also without an IPv6 demux).
func (x *HostDemux) Echo6Steering() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.echo6 == nil && x.echo6Err == nil {
		return errors.New("no IPv6 demux on eth0")
	}
	return x.echo6Err
}

// dropEcho6 detaches the ICMPv6 echo programs and releases them.
func (x *HostDemux) dropEcho6() {
	x.detachEcho(PrioEcho6, unix.ETH_P_IPV6)
	if x.echo6 != nil {
		x.echo6.close()
		x.echo6 = nil
	}
}
