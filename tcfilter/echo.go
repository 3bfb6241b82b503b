package tcfilter

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
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
	echoHandle = 1
	originMax  = 16384 // veths and shaper exits
)

type echoSteer struct {
	echo, origin, frag, quota *bpfMap
	steerFd, learnFd          int
	sweep                     *echoSweeper
}

func (e *echoSteer) close() {
	e.sweep.halt()
	for _, m := range []*bpfMap{e.echo, e.origin, e.frag, e.quota} {
		if m != nil {
			m.close()
		}
	}
	unix.Close(e.steerFd)
	unix.Close(e.learnFd)
}

// stack layout of both programs (offsets from r10)
const (
	stkPkt    = -48 // 42 bytes of the frame (Ethernet + IPv4 + 8), or 28 inner bytes
	stkKey    = -56 // 8: identifier (2), 0 (2), peer address (4)
	stkValue  = -64 // 4: veth ifindex
	stkOrigin = -72 // 4: skb_iif
	stkFrag   = -80 // 8: source address (4), IP id (2), 0 (2)
)

const fragEntries = 4096 // fragmented echo replies in flight; LRU

func pkt(i int) int16 { return int16(stkPkt + i) }

// loadHeader loads the first 42 bytes (Ethernet, IPv4 without options,
// 8 bytes of ICMP) and checks: IPv4 IHL 5, ICMP, first fragment (a
// non-first fragment jumps to label frag, or "pass" if frag is "").
func loadHeader(a *asm, frag string) {
	if frag == "" {
		frag = "pass"
	}
	loadBytes(a, 0, 42)
	a.ldxB(r1, r10, pkt(14))
	a.jmp(opJne32, r1, 0x45, "pass")
	a.ldxB(r1, r10, pkt(23))
	a.jmp(opJne32, r1, ipprotoICMP, "pass")
	a.ldxB(r1, r10, pkt(20))
	a.emit(opAndImm32, r1, 0, 0, 0x1f)
	a.jmp(opJne32, r1, 0, frag)
	a.ldxB(r1, r10, pkt(21))
	a.jmp(opJne32, r1, 0, frag)
	a.stW(r10, stkKey, 0)
	a.stW(r10, stkKey+4, 0)
}

// loadBytes copies n bytes of the packet (r6) from offset off to the
// stack buffer at stkPkt; a packet too short jumps to "pass".
func loadBytes(a *asm, off, n int32) { loadBytesTo(a, off, n, stkPkt) }

// loadBytesTo is loadBytes into the stack buffer at buf.
func loadBytesTo(a *asm, off, n, buf int32) {
	a.movReg(r1, r6)
	a.movImm(r2, off)
	a.movReg(r3, r10)
	a.addImm(r3, buf)
	a.movImm(r4, n)
	a.call(helperLoadBytes)
	a.jmp(opJne32, r0, 0, "pass")
}

// mapUpdate stores the value at stack offset value under the key at
// stack offset key in map fd (BPF_ANY).
func mapUpdate(a *asm, fd int, key, value int32) { mapUpdateFlags(a, fd, key, value, 0) }

// mapUpdateFlags is mapUpdate with update flags (BPF_ANY, BPF_NOEXIST...);
// r0 is the helper's result.
func mapUpdateFlags(a *asm, fd int, key, value, flags int32) {
	a.ldMap(r1, fd)
	a.movReg(r2, r10)
	a.addImm(r2, key)
	a.movReg(r3, r10)
	a.addImm(r3, value)
	a.movImm(r4, flags)
	a.call(helperMapUpdate)
}

// originValue stores at stack offset value what an echo request leaving
// eth0 is learned as: 0 for the host's own (skb_iif 0), else the target
// the origin map gives for skb_iif (stored at stack offset origin); an
// unknown origin jumps to "pass". It ends at label "learn" with r6 the
// packet.
func originValue(a *asm, originFd int, origin, value int16) {
	a.movReg(r6, r1)
	a.ldxW(r7, r6, 36)   // __sk_buff.ingress_ifindex (skb_iif)
	a.stW(r10, value, 0) // the host's own request: learned as 0
	a.jmp(opJeq32, r7, 0, "learn")
	a.stxW(r10, r7, origin)
	lookupOrPass(a, originFd, origin)
	a.ldxW(r8, r0, 0)
	a.stxW(r10, r8, value)
	a.label("learn")
}

// redirectR7 (label "redirect") redirects the packet to the ifindex in r7.
func redirectR7(a *asm) {
	a.label("redirect")
	a.movReg(r1, r7)
	a.movImm(r2, 0)
	a.call(helperRedirect) // returns TC_ACT_REDIRECT
	a.exit()
}

// lookupOrPass looks the key at stack offset key up in map fd; r0 is the
// value's address, a miss jumps to "pass".
func lookupOrPass(a *asm, fd int, key int16) {
	a.ldMap(r1, fd)
	a.movReg(r2, r10)
	a.addImm(r2, int32(key))
	a.call(helperMapLookup)
	a.jmp(opJeqImm, r0, 0, "pass")
}

func passExit(a *asm) {
	a.label("pass")
	a.movImm(r0, tcActUnspec)
	a.exit()
}

// fragKey fills stkFrag from the outer header: source address and IP id.
func fragKey(a *asm) {
	a.stW(r10, stkFrag, 0)
	a.stW(r10, stkFrag+4, 0)
	a.copyBytes(stkFrag, pkt(26), 4)
	a.copyBytes(stkFrag+4, pkt(18), 2)
}

func checkDst(a *asm, hostIP net.IP) {
	for i, b := range hostIP.To4() {
		a.ldxB(r1, r10, pkt(30+i))
		a.jmp(opJne32, r1, int32(b), "pass")
	}
}

// steerProgram: see the comment at the top. A first fragment of an echo
// reply it redirects (MF set) also records {source, IP id} -> veth in the
// fragment map, so that the reply's other fragments (no ICMP header) follow
// it to the same container.
func steerProgram(echoFd, fragFd int, hostIP net.IP) ([]byte, error) {
	a := newAsm()
	a.movReg(r6, r1)
	loadHeader(a, "frag")
	checkDst(a, hostIP)
	fragKey(a)
	a.ldxB(r9, r10, pkt(20))
	a.emit(opAndImm32, r9, 0, 0, 0x20) // MF
	a.ldxB(r1, r10, pkt(34))           // ICMP type
	a.jmp(opJeq32, r1, 0, "reply")
	a.emit(opAndImm32, r1, 0, 0, 0xf7)
	a.jmp(opJne32, r1, 3, "pass") // not 3 or 11
	// an error: the quoted header (28 bytes from offset 42)
	loadBytes(a, 42, 28)
	a.ldxB(r1, r10, pkt(0))
	a.jmp(opJne32, r1, 0x45, "pass")
	a.ldxB(r1, r10, pkt(9))
	a.jmp(opJne32, r1, ipprotoICMP, "pass")
	a.ldxB(r1, r10, pkt(20))
	a.jmp(opJne32, r1, 8, "pass") // quoting an echo request
	a.copyBytes(stkKey, pkt(24), 2)
	a.copyBytes(stkKey+4, pkt(16), 4) // its destination: the peer
	a.movImm(r9, 0)                   // errors are not followed by fragments
	a.jmp(opJa, 0, 0, "lookup")
	a.label("reply")
	a.copyBytes(stkKey, pkt(38), 2)
	a.copyBytes(stkKey+4, pkt(26), 4) // the source: the peer
	a.label("lookup")
	lookupOrPass(a, echoFd, stkKey)
	a.ldxW(r7, r0, 0)
	a.jmp(opJeq32, r7, 0, "host") // the host's own request
	a.jmp(opJeq32, r9, 0, "redirect")
	a.stxW(r10, r7, stkValue)
	mapUpdate(a, fragFd, stkFrag, stkValue)
	redirectR7(a)
	// a non-first fragment to the host IP: where its first fragment went
	a.label("frag")
	checkDst(a, hostIP)
	fragKey(a)
	lookupOrPass(a, fragFd, stkFrag)
	a.ldxW(r1, r0, 0)
	a.movImm(r2, 0)
	a.call(helperRedirect)
	a.exit()
	// the host's: delivered to it, before the u32 demux (where an
	// identifier in a container's ports would send it to the container)
	a.label("host")
	a.movImm(r0, tcActOK)
	a.exit()
	passExit(a)
	return a.assemble()
}

// learnProgram: see the comment at the top, and echoown.go.
func learnProgram(m ownMaps, originFd int) ([]byte, error) {
	a := newAsm()
	originValue(a, originFd, stkOrigin, stkValue)
	loadHeader(a, "")
	a.ldxB(r1, r10, pkt(34))
	a.jmp(opJne32, r1, 8, "pass") // echo request
	a.copyBytes(stkKey, pkt(38), 2)
	a.copyBytes(stkKey+4, pkt(30), 4) // destination: the peer
	learnOwned(a, m, stkKey, stkValue)
	passExit(a)
	return a.assemble()
}

// newEchoSteer creates the maps and programs; counts is the drop count
// map (-1: none).
func newEchoSteer(hostIP net.IP, counts int) (_ *echoSteer, err error) {
	e := &echoSteer{steerFd: -1, learnFd: -1}
	if e.echo, e.quota, err = newOwnMaps(8, "iso_echo", "iso_echo_quota"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.origin, err = newBPFMap(unix.BPF_MAP_TYPE_HASH, 4, 4, originMax, "iso_echo_origin"); err != nil {
		return nil, err
	}
	if e.frag, err = newBPFMap(unix.BPF_MAP_TYPE_LRU_HASH, 8, 4, fragEntries, "iso_echo_frag"); err != nil {
		return nil, err
	}
	code, err := steerProgram(e.echo.fd, e.frag.fd, hostIP)
	if err != nil {
		return nil, err
	}
	if e.steerFd, err = loadSchedCls("iso_echo_steer", code); err != nil {
		return nil, err
	}
	if code, err = learnProgram(ownMaps{e.echo.fd, e.quota.fd, counts}, e.origin.fd); err != nil {
		return nil, err
	}
	if e.learnFd, err = loadSchedCls("iso_echo_learn", code); err != nil {
		return nil, err
	}
	e.sweep = startSweep(e.echo, e.quota, 8)
	return e, nil
}

// attachEcho attaches an echo steer program (ingress) and learn program
// (egress) to eth0 at prio for protocol proto, under names, leaving a
// filter in place when the kernel already runs that very program there.
func (x *HostDemux) attachEcho(prio, proto uint16, steerFd, learnFd int, names [2]string) error {
	for _, f := range []struct {
		parent uint32
		fd     int
		name   string
	}{{netlink.HANDLE_MIN_INGRESS, steerFd, names[0]}, {netlink.HANDLE_MIN_EGRESS, learnFd, names[1]}} {
		if id := x.echoFilterID(prio, f.parent, f.name); id != 0 && id == progID(f.fd) {
			continue
		}
		err := x.d.h.FilterReplace(&netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: x.d.ifindex, Parent: f.parent, Priority: prio,
				Protocol: proto, Handle: echoHandle},
			Fd: f.fd, Name: f.name, DirectAction: true,
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
	names, err := echoFilterNames(x.dst, x.countsCode())
	if err != nil {
		x.echoErr = err
		return
	}
	if x.echo == nil {
		// A restarted daemon takes over the programs (and the learned
		// identifiers) of its predecessor when they are the same code.
		x.echo = x.adoptEcho(names)
	}
	if x.echo == nil {
		e, err := newEchoSteer(x.dst, x.countsFd())
		if err != nil {
			x.echoErr = err
			return
		}
		x.echo = e
	}
	if err := x.attachEcho(PrioEcho, unix.ETH_P_IP, x.echo.steerFd, x.echo.learnFd, names); err != nil {
		x.echoErr = err
		x.dropEcho()
		return
	}
	x.echoErr = nil
}

// echoFilterID returns the program id of the echo filter named name on
// parent (0: none). Filter names carry a digest of the program's code, so a
// name match means the same code (and host IP).
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

// echoFilterNames are the filter names of the steer and learn programs:
// the program name and a digest of its code (map references zeroed).
func echoFilterNames(hostIP net.IP, counts int) ([2]string, error) {
	s, err := steerProgram(0, 0, hostIP)
	if err != nil {
		return [2]string{}, err
	}
	l, err := learnProgram(ownMaps{0, 0, counts}, 0)
	if err != nil {
		return [2]string{}, err
	}
	ds, dl := sha256.Sum256(s), sha256.Sum256(l)
	return [2]string{fmt.Sprintf("iso_echo_steer-%x", ds[:6]), fmt.Sprintf("iso_echo_learn-%x", dl[:6])}, nil
}

// echoProgs opens the programs of the echo filters at prio named names
// (ingress, egress); ok is false unless both are there.
func (x *HostDemux) echoProgs(prio uint16, names [2]string) (steer, learn int, ok bool) {
	sid := x.echoFilterID(prio, netlink.HANDLE_MIN_INGRESS, names[0])
	lid := x.echoFilterID(prio, netlink.HANDLE_MIN_EGRESS, names[1])
	if sid == 0 || lid == 0 {
		return -1, -1, false
	}
	steer, err := fdByID(unix.BPF_PROG_GET_FD_BY_ID, sid)
	if err != nil {
		return -1, -1, false
	}
	if learn, err = fdByID(unix.BPF_PROG_GET_FD_BY_ID, lid); err != nil {
		unix.Close(steer)
		return -1, -1, false
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
	e := &echoSteer{steerFd: steer, learnFd: learn}
	maps := map[string]**bpfMap{"iso_echo": &e.echo, "iso_echo_origin": &e.origin, "iso_echo_frag": &e.frag,
		"iso_echo_quota": &e.quota}
	for _, id := range append(progMapIDs(e.learnFd), progMapIDs(e.steerFd)...) {
		fd, err := fdByID(unix.BPF_MAP_GET_FD_BY_ID, id)
		if err != nil {
			continue
		}
		if p, ok := maps[mapName(fd)]; ok && *p == nil {
			*p = &bpfMap{fd: fd}
		} else {
			unix.Close(fd)
		}
	}
	if e.echo == nil || e.origin == nil || e.frag == nil || e.quota == nil ||
		x.counts != nil && !usesMap(e.learnFd, x.counts.fd) {
		e.close()
		return nil
	}
	e.sweep = startSweep(e.echo, e.quota, 8)
	return e
}

func fdByID(cmd, id int) (int, error) {
	attr := struct{ id, next, flags uint32 }{id: uint32(id)}
	return bpfSys(cmd, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
}

// objInfo fills info for the program or map behind fd.
func objInfo(fd int, info []byte) error {
	attr := struct {
		fd, infoLen uint32
		info        uint64
	}{fd: uint32(fd), infoLen: uint32(len(info)), info: uint64(uintptr(unsafe.Pointer(&info[0])))}
	_, err := bpfSys(unix.BPF_OBJ_GET_INFO_BY_FD, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(info)
	return err
}

// progMapIDs lists the ids of the maps a program uses (bpf_prog_info:
// nr_map_ids at 52, map_ids at 56).
func progMapIDs(fd int) []int {
	ids := make([]uint32, 8)
	info := make([]byte, 256)
	binary.NativeEndian.PutUint32(info[52:], uint32(len(ids)))
	binary.NativeEndian.PutUint64(info[56:], uint64(uintptr(unsafe.Pointer(&ids[0]))))
	err := objInfo(fd, info)
	runtime.KeepAlive(ids)
	if err != nil {
		return nil
	}
	n := min(int(binary.NativeEndian.Uint32(info[52:])), len(ids))
	out := make([]int, n)
	for i := range out {
		out[i] = int(ids[i])
	}
	return out
}

// mapName is a map's name (bpf_map_info.name at 24).
func mapName(fd int) string {
	info := make([]byte, 128)
	if objInfo(fd, info) != nil {
		return ""
	}
	return unix.ByteSliceToString(info[24:40])
}

// progID reads the id of the program behind fd (0 if unknown).
func progID(fd int) int {
	info := make([]byte, 256)
	if objInfo(fd, info) != nil {
		return 0
	}
	return int(binary.NativeEndian.Uint32(info[4:8])) // bpf_prog_info: type, id
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

func ifKey(i int) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, uint32(i))
	return b
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
	if err := x.echo.origin.update(ifKey(iif), ifKey(target)); err != nil {
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
	if err := x.echo.origin.delete(ifKey(iif)); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s: echo origin %d: %w", x.d.label, iif, err)
	}
	return nil
}
