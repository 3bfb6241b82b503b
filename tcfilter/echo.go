package tcfilter

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/bpfprog"
)

// Echo replies by learning (eth0 only, when the kernel has cls_bpf and a
// clsact qdisc on eth0).
//
// A container's ping cannot be told apart by its echo identifier alone:
// Linux ping sockets (SOCK_DGRAM, IPPROTO_ICMP) take identifiers from one
// global rover, raw-socket pingers (busybox, iputils as root) use their pid
// or a random number, and none of them stays in the container's ports. So
// the host learns them, exactly, at the one place every container's echo
// request passes: host eth0's egress.
//
// The programs are bpfprog's echo.c (C, loaded with cilium/ebpf):
//
//   - learn (clsact egress of eth0, cls_bpf direct-action, prio 1): an echo
//     request (IHL 5, first fragment) whose skb_iif (the device mirred
//     redirected it from: the container's veth, or its egress shaper's
//     exit) is in the origin map is learned as {identifier, destination}
//     -> the container's veth in the echo map; the host's own requests
//     (skb_iif 0) as {identifier, destination} -> 0, "the host"; anything
//     else (forwarded, not in the origin map) is not learned. An entry is
//     its origin's while live (a request within echoLive, 30 s): another
//     container's request with that key is dropped (DropEcho, counted for
//     its veth), the host's takes it; each container learns at most
//     echoQuota keys a window, beyond which its requests are dropped; a
//     sweeper deletes entries no longer live (echoown.go).
//   - steer (clsact ingress of eth0, cls_bpf direct-action, prio 1, before
//     the u32 demux at prio 2): an echo reply to the host IP, or an ICMP
//     error (type 3 or 11) quoting an echo request, whose {identifier,
//     peer} is in the echo map is redirected to that veth, or, learned as
//     the host's, accepted for the host (TC_ACT_OK: the u32 demux does not
//     see it, so the host's ping gets its replies whatever identifier it
//     drew, one in a container's ports or one a container used before, a
//     stale entry of a container gone included); everything else
//     continues to the u32 demux (TC_ACT_UNSPEC), where echo replies with
//     an identifier in a container's ports go to it (TablePort) and the
//     rest stays with the host. When the redirected reply is a first
//     fragment (MF), {source, IP id} -> veth goes into the fragment map
//     (LRU, fragEntries), and the later fragments of that datagram (no ICMP
//     header) are redirected the same way; unknown non-first ICMP fragments
//     stay with the host.
//
// Per packet: one 42-byte load and a few compares for every IPv4 packet on
// eth0, one hash lookup per echo reply (ingress) or echo request (egress,
// with a clock read, and a few times per window a quota lookup): flat in
// the number of containers; no copies.
//
// What ping from a container relies on: its echo request leaves through
// host eth0 (the veth's ICMP redirect) before the reply comes back, and no
// other container or the host pings the same peer with the same
// identifier within 30 s before it (then its requests are dropped: two
// raw pingers in one namespace would instead see each other's replies).
// A container cannot take the host's or another container's replies, nor
// flood their entries away (echoown.go). A restarted daemon takes over
// the programs and maps (not pinned: found through the filters on eth0,
// when their code is the same) and starts a sweeper; an upgraded one
// (other code) starts with empty maps: replies to requests sent before
// the restart go to the host, and for 30 s nobody's entry is protected.
//
// Without cls_bpf (or without clsact on eth0), echo replies and errors
// about echo requests that TablePort cannot attribute are mirrored to every
// container (TableICMPFn), as before.

// Prio of the echo programs on eth0 (ingress and egress). eth0 has no ARP
// classifier (ARP stays with the host), so prio 1 is free there.
const PrioEcho uint16 = 1

const (
	echoHandle  = 1
	originMax   = 16384 // veths and shaper exits (ORIGIN_MAX in bpfprog's own.h)
	fragEntries = 4096  // fragmented echo replies in flight; LRU (FRAG_ENTRIES in echo.c)
)

type echoSteer struct {
	echo, origin, frag, quota *ebpf.Map
	steer, learn              *ebpf.Program
	sweep                     *echoSweeper
}

func (e *echoSteer) close() {
	e.sweep.halt()
	closeAll(e.echo, e.origin, e.frag, e.quota, e.steer, e.learn)
}

// closeAll closes programs and maps (a nil one is fine: their Close
// methods accept a nil receiver).
func closeAll(cs ...io.Closer) {
	for _, c := range cs {
		c.Close()
	}
}

// echoVars are the parameters of the echo objects: the host's IPv4
// address (steer) and the code of DropEcho (learn).
func echoVars(hostIP net.IP) map[string]any {
	v := map[string]any{bpfprog.EchoVarEchoDropReason: uint32(slices.Index(DropReasons, DropEcho))}
	if ip4 := hostIP.To4(); ip4 != nil {
		v[bpfprog.EchoVarHostIp] = [4]byte(ip4)
	}
	return v
}

// countsReplace passes the drop count map counts to an object's programs
// (nil: they count into a map of their own that nobody reads).
func countsReplace(counts *ebpf.Map) map[string]*ebpf.Map {
	if counts == nil {
		return nil
	}
	return map[string]*ebpf.Map{bpfprog.EchoMapIsoDrops: counts}
}

// newEchoSteer creates the maps and programs; counts is the drop count
// map (nil: none).
func newEchoSteer(hostIP net.IP, counts *ebpf.Map) (*echoSteer, error) {
	var o bpfprog.EchoObjects
	if err := loadObjects(bpfprog.LoadEcho, &o, echoVars(hostIP), countsReplace(counts)); err != nil {
		return nil, err
	}
	o.IsoDrops.Close() // the learn program holds it
	e := &echoSteer{echo: o.IsoEcho, origin: o.IsoEchoOrigin, frag: o.IsoEchoFrag, quota: o.IsoEchoQuota,
		steer: o.IsoEchoSteer, learn: o.IsoEchoLearn}
	e.sweep = startSweep(e.echo, e.quota)
	return e, nil
}

// loadSteer loads the IPv4 steer program for hostIP on the maps of e.
func (e *echoSteer) loadSteer(hostIP net.IP) (*ebpf.Program, error) {
	var o struct {
		Steer *ebpf.Program `ebpf:"iso_echo_steer"`
	}
	err := loadObjects(bpfprog.LoadEcho, &o, echoVars(hostIP),
		map[string]*ebpf.Map{bpfprog.EchoMapIsoEcho: e.echo, bpfprog.EchoMapIsoEchoFrag: e.frag})
	return o.Steer, err
}

// attachEcho attaches an echo steer program (ingress) and learn program
// (egress) to eth0 at prio for protocol proto, under names, leaving a
// filter in place when the kernel already runs that very program there.
func (x *HostDemux) attachEcho(prio, proto uint16, steer, learn *ebpf.Program, names [2]string) error {
	for _, f := range []struct {
		parent uint32
		p      *ebpf.Program
		name   string
	}{{netlink.HANDLE_MIN_INGRESS, steer, names[0]}, {netlink.HANDLE_MIN_EGRESS, learn, names[1]}} {
		if id := x.echoFilterID(prio, f.parent, f.name); id != 0 && id == int(progID(f.p)) {
			continue
		}
		err := x.d.h.FilterReplace(&netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: x.d.ifindex, Parent: f.parent, Priority: prio,
				Protocol: proto, Handle: echoHandle},
			Fd: f.p.FD(), Name: f.name, DirectAction: true,
		})
		x.d.observe(OpUpdate, KindICMP, err)
		if err != nil {
			return fmt.Errorf("%s: attach %s: %w", x.d.label, f.name, err)
		}
	}
	return nil
}

// initEcho (eth0, with x.mu held) makes the echo programs run: created
// once per HostDemux, attached (or re-attached) unless the kernel already
// runs ours. On failure the demux falls back to the ICMP fan-out; the
// reason is kept for EchoSteering.
func (x *HostDemux) initEcho() {
	names := echoFilterNames(x.dst, x.counts != nil)
	if x.echo == nil {
		// A restarted daemon takes over the programs (and the learned
		// identifiers) of its predecessor when they are the same code.
		x.echo = x.adoptEcho(names)
	}
	if x.echo == nil {
		e, err := newEchoSteer(x.dst, x.counts)
		if err != nil {
			x.echoErr = err
			return
		}
		x.echo = e
	}
	if err := x.attachEcho(PrioEcho, unix.ETH_P_IP, x.echo.steer, x.echo.learn, names); err != nil {
		x.echoErr = err
		x.dropEcho()
		return
	}
	x.echoErr = nil
}

// echoFilterID returns the program id of the echo filter named name on
// parent (0: none). Filter names carry a digest of the program's object
// and parameters, so a name match means the same code (and host IP).
func (x *HostDemux) echoFilterID(prio uint16, parent uint32, name string) int {
	fs := x.initDump // Init's dump of the ingress hook, while it runs
	if parent != netlink.HANDLE_MIN_INGRESS || fs == nil {
		var err error
		if fs, err = x.d.h.FilterList(linkRef(x.d.ifindex), parent); err != nil {
			return 0
		}
	}
	for _, f := range fs {
		if b, ok := f.(*netlink.BpfFilter); ok && b.Priority == prio && b.Name == name {
			return b.Id
		}
	}
	return 0
}

// countsFlag is the digest parameter of a learn program: whether it
// counts into the drop sinks' map.
func countsFlag(counted bool) []byte {
	if counted {
		return []byte{1}
	}
	return []byte{0}
}

// echoFilterNames are the filter names of the steer and learn programs:
// the program name and a digest of the object and its parameters.
func echoFilterNames(hostIP net.IP, counted bool) [2]string {
	return [2]string{filterName("iso_echo_steer-", "echo", hostIP.To4()),
		filterName("iso_echo_learn-", "echo", countsFlag(counted))}
}

// echoProgs opens the programs of the echo filters at prio named names
// (ingress, egress); ok is false unless both are there.
func (x *HostDemux) echoProgs(prio uint16, names [2]string) (steer, learn *ebpf.Program, ok bool) {
	sid := x.echoFilterID(prio, netlink.HANDLE_MIN_INGRESS, names[0])
	lid := x.echoFilterID(prio, netlink.HANDLE_MIN_EGRESS, names[1])
	if sid == 0 || lid == 0 {
		return nil, nil, false
	}
	steer, err := ebpf.NewProgramFromID(ebpf.ProgramID(sid))
	if err != nil {
		return nil, nil, false
	}
	if learn, err = ebpf.NewProgramFromID(ebpf.ProgramID(lid)); err != nil {
		steer.Close()
		return nil, nil, false
	}
	return steer, learn, true
}

// adoptEcho takes over the echo programs and maps the kernel runs under
// these names (a restarted daemon); nil if they are not all there.
func (x *HostDemux) adoptEcho(names [2]string) *echoSteer {
	steer, learn, ok := x.echoProgs(PrioEcho, names)
	if !ok {
		return nil
	}
	e := &echoSteer{steer: steer, learn: learn}
	ms := progMaps(learn)
	for n, m := range progMaps(steer) {
		if ms[n] == nil {
			ms[n] = m
		} else {
			m.Close()
		}
	}
	maps := takeMaps(ms, bpfprog.EchoMapIsoEcho, bpfprog.EchoMapIsoEchoOrigin, bpfprog.EchoMapIsoEchoFrag,
		bpfprog.EchoMapIsoEchoQuota)
	if maps == nil || x.counts != nil && !usesMap(learn, x.counts) {
		closeMaps(maps)
		e.close()
		return nil
	}
	e.echo, e.origin, e.frag, e.quota = maps[0], maps[1], maps[2], maps[3]
	e.sweep = startSweep(e.echo, e.quota)
	return e
}

// detachEcho deletes the echo filters of priority prio and protocol
// proto from both directions of the demux's device (missing ones are fine).
func (x *HostDemux) detachEcho(prio uint16, proto uint16) {
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		err := x.d.h.FilterDel(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
			LinkIndex: x.d.ifindex, Parent: parent, Priority: prio, Protocol: proto, Handle: echoHandle}})
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			x.d.observe(OpRemove, KindICMP, err)
		}
	}
}

// dropEcho detaches the echo programs and releases them (fallback).
func (x *HostDemux) dropEcho() {
	x.detachEcho(PrioEcho, unix.ETH_P_IP)
	if x.echo != nil {
		x.echo.close()
		x.echo = nil
	}
}

// EchoSteering reports whether echo replies are steered by learning (nil)
// or fall back to the fan-out (the reason). Meaningful after Init.
func (x *HostDemux) EchoSteering() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.dst == nil {
		return ErrNoFanout
	}
	if x.echo == nil && x.echoErr == nil {
		return errors.New("not initialised")
	}
	return x.echoErr
}

// SetEchoOrigin makes echo requests that reach eth0 from device iif (a
// container's host veth, or its egress shaper's exit) teach the demux to
// send the replies to target (the container's veth). No-op without the
// echo programs.
func (x *HostDemux) SetEchoOrigin(iif, target int) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.echo == nil || iif <= 0 || target <= 0 {
		return nil
	}
	if err := x.echo.origin.Update(uint32(iif), uint32(target), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("%s: echo origin %d -> %d: %w", x.d.label, iif, target, err)
	}
	return nil
}

// DelEchoOrigin forgets device iif (missing is fine).
func (x *HostDemux) DelEchoOrigin(iif int) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.echo == nil || iif <= 0 {
		return nil
	}
	if err := x.echo.origin.Delete(uint32(iif)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("%s: echo origin %d: %w", x.d.label, iif, err)
	}
	return nil
}
