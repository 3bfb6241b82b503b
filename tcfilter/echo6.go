package tcfilter

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// ICMPv6 echo replies by learning (eth0, with the IPv4 echo programs and
// an IPv6 demux): the twins of echo.go's programs, at PrioEcho6
// (ETH_P_IPV6), before the u32 IPv6 classifier.
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

// stack layout of the IPv6 programs (offsets from r10)
const (
	stk6Pkt    = -72  // 62 bytes: Ethernet, IPv6, 8 bytes of ICMPv6; or 48 quoted bytes
	stk6Key    = -96  // 20 (24 zeroed): identifier (2), 0 (2), peer address (16)
	stk6Value  = -100 // 4: veth ifindex
	stk6Origin = -104 // 4: skb_iif
)

func p6(i int) int16 { return int16(stk6Pkt + i) }

type echo6Steer struct {
	m, quota         *bpfMap
	steerFd, learnFd int
	sweep            *echoSweeper
}

func (e *echo6Steer) close() {
	e.sweep.halt()
	for _, m := range []*bpfMap{e.m, e.quota} {
		if m != nil {
			m.close()
		}
	}
	unix.Close(e.steerFd)
	unix.Close(e.learnFd)
}

// loadICMPv6 loads Ethernet, the IPv6 header and 8 bytes of ICMPv6 and
// checks that ICMPv6 follows the fixed header; it zeroes the key.
func loadICMPv6(a *asm) {
	loadBytesTo(a, 0, 62, stk6Pkt)
	a.ldxB(r1, r10, p6(20))
	a.jmp(opJne32, r1, ipprotoICMPv6, "pass")
	for i := int16(0); i < 24; i += 4 {
		a.stW(r10, stk6Key+i, 0)
	}
}

func learn6Program(m ownMaps, originFd int) ([]byte, error) {
	a := newAsm()
	originValue(a, originFd, stk6Origin, stk6Value)
	loadICMPv6(a)
	a.ldxB(r1, r10, p6(54))
	a.jmp(opJne32, r1, icmp6EchoRequest, "pass")
	a.copyBytes(stk6Key, p6(58), 2)
	a.copyBytes(stk6Key+4, p6(38), 16) // destination: the peer
	learnOwned(a, m, stk6Key, stk6Value)
	passExit(a)
	return a.assemble()
}

func steer6Program(echo6Fd int) ([]byte, error) {
	a := newAsm()
	a.movReg(r6, r1)
	loadICMPv6(a)
	a.ldxB(r1, r10, p6(54)) // ICMPv6 type
	a.jmp(opJeq32, r1, icmp6EchoReply, "reply")
	a.jmp(opJeq32, r1, 0, "pass")
	a.emit(opAndImm32, r1, 0, 0, 0xf8)
	a.jmp(opJne32, r1, 0, "pass") // not an error
	// an error: the quoted IPv6 header and 8 bytes (48 bytes from 62)
	loadBytesTo(a, 62, 48, stk6Pkt)
	a.ldxB(r1, r10, p6(6))
	a.jmp(opJne32, r1, ipprotoICMPv6, "pass")
	a.ldxB(r1, r10, p6(40))
	a.jmp(opJne32, r1, icmp6EchoRequest, "pass") // quoting an echo request
	a.copyBytes(stk6Key, p6(44), 2)
	a.copyBytes(stk6Key+4, p6(24), 16) // its destination: the peer
	a.jmp(opJa, 0, 0, "lookup")
	a.label("reply")
	a.copyBytes(stk6Key, p6(58), 2)
	a.copyBytes(stk6Key+4, p6(22), 16) // the source: the peer
	a.label("lookup")
	lookupOrPass(a, echo6Fd, stk6Key)
	a.ldxW(r7, r0, 0)
	a.jmp(opJeq32, r7, 0, "host")
	redirectR7(a)
	// the host's: delivered to it, before the u32 demux
	a.label("host")
	a.movImm(r0, tcActOK)
	a.exit()
	passExit(a)
	return a.assemble()
}

func newEcho6Steer(originFd, counts int) (_ *echo6Steer, err error) {
	e := &echo6Steer{steerFd: -1, learnFd: -1}
	if e.m, e.quota, err = newOwnMaps(20, "iso_echo6", "iso_echo6_quota"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	code, err := steer6Program(e.m.fd)
	if err != nil {
		return nil, err
	}
	if e.steerFd, err = loadSchedCls("iso_echo6_steer", code); err != nil {
		return nil, err
	}
	if code, err = learn6Program(ownMaps{e.m.fd, e.quota.fd, counts}, originFd); err != nil {
		return nil, err
	}
	if e.learnFd, err = loadSchedCls("iso_echo6_learn", code); err != nil {
		return nil, err
	}
	e.sweep = startSweep(e.m, e.quota, 20)
	return e, nil
}

// echo6FilterNames are the filter names of the IPv6 steer and learn
// programs: the program name and a digest of its code (map references
// zeroed), so that a restarted daemon adopts programs of the same code.
func echo6FilterNames(counts int) ([2]string, error) {
	s, err := steer6Program(0)
	if err != nil {
		return [2]string{}, err
	}
	l, err := learn6Program(ownMaps{0, 0, counts}, 0)
	if err != nil {
		return [2]string{}, err
	}
	ds, dl := sha256.Sum256(s), sha256.Sum256(l)
	return [2]string{fmt.Sprintf("iso_echo6_steer-%x", ds[:6]), fmt.Sprintf("iso_echo6_learn-%x", dl[:6])}, nil
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
	names, err := echo6FilterNames(x.countsCode())
	if err != nil {
		x.echo6Err = err
		return
	}
	if x.echo6 == nil {
		x.echo6 = x.adoptEcho6(names)
	}
	if x.echo6 == nil {
		e, err := newEcho6Steer(x.echo.origin.fd, x.countsFd())
		if err != nil {
			x.echo6Err = fmt.Errorf("%s: ICMPv6 echo programs: %w", x.d.label, err)
			return
		}
		x.echo6 = e
	}
	if err := x.attachEcho(PrioEcho6, unix.ETH_P_IPV6, x.echo6.steerFd, x.echo6.learnFd, names); err != nil {
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
	e := &echo6Steer{steerFd: steer, learnFd: learn}
	origin := false
	for _, id := range progMapIDs(e.learnFd) {
		fd, err := fdByID(unix.BPF_MAP_GET_FD_BY_ID, id)
		if err != nil {
			continue
		}
		switch {
		case mapName(fd) == "iso_echo6" && e.m == nil:
			e.m = &bpfMap{fd: fd}
			continue
		case mapName(fd) == "iso_echo6_quota" && e.quota == nil:
			e.quota = &bpfMap{fd: fd}
			continue
		case id == mapID(x.echo.origin.fd):
			origin = true
		}
		unix.Close(fd)
	}
	if e.m == nil || e.quota == nil || !origin || x.counts != nil && !usesMap(e.learnFd, x.counts.fd) {
		e.close()
		return nil
	}
	e.sweep = startSweep(e.m, e.quota, 20)
	return e
}

// mapID is a map's id (bpf_map_info.id at 4; 0 if unknown).
func mapID(fd int) int {
	info := make([]byte, 128)
	if objInfo(fd, info) != nil {
		return 0
	}
	return int(binary.NativeEndian.Uint32(info[4:8]))
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
