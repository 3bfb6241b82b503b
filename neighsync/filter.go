package neighsync

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Socket filters: a tenant is root in its namespace and may churn
// neighbour entries on links of its own (a dummy link, many addresses,
// `ip neigh add/del` in a loop). The socket listening to every namespace
// hears each of those notifications; queued, they would fill its receive
// buffer, so that other containers' requests were lost until the next
// resync, which reads every container's table. A classic BPF filter on
// each socket (the kernel runs it before queueing a broadcast: an
// unwanted notification costs the kernel a few instructions and the
// daemon nothing) keeps only what the Syncer uses:
//
//   - the all-namespaces socket: a container's request (RTM_GETNEIGH, the
//     app_solicit hook) on an interface with the ifindex of a served
//     container's eth0. What a container does with its own entries (new,
//     changed, deleted ones) is not needed: the Syncer only writes them.
//     The filter cannot see the namespace id (it is ancillary data, not in
//     the message), so a tenant's link with the ifindex of a served eth0
//     gets through: per-namespace accounting bounds what it then costs
//     (budget.go).
//   - the host's socket (no NETLINK_LISTEN_ALL_NSID: nothing from a
//     container reaches it): new and deleted entries on the host's eth0.
//
// A filter's loads of the message are big-endian (BPF_ABS); netlink
// fields are in the host's byte order: the constants are byte-swapped to
// match (wire16, wire32).

// Offsets in a neighbour notification: struct nlmsghdr then struct ndmsg.
const (
	offType    = 4                       // nlmsghdr.nlmsg_type (u16)
	offIfindex = unix.SizeofNlMsghdr + 4 // ndmsg.ndm_ifindex (s32)
)

// maxFilterIndexes bounds the ifindexes a container filter lists (a jump
// offset is 8 bits). A host whose containers' eth0 have more distinct
// ifindexes (they are usually all 2: the first link after lo in a fresh
// namespace) gets requests on any interface.
const maxFilterIndexes = 200

// wire16 and wire32 are v as a filter loads it from a message in the
// host's byte order.
func wire16(v uint16) uint32 {
	var b [2]byte
	nl.NativeEndian().PutUint16(b[:], v)
	return uint32(binary.BigEndian.Uint16(b[:]))
}

func wire32(v uint32) uint32 {
	var b [4]byte
	nl.NativeEndian().PutUint32(b[:], v)
	return binary.BigEndian.Uint32(b[:])
}

const (
	bpfKeep = 0xffffffff // return: the whole message
	bpfDrop = 0
)

// Instructions of the filters (golang.org/x/net/bpf assembles them).
var (
	loadType    = bpf.LoadAbsolute{Off: offType, Size: 2}
	loadIfindex = bpf.LoadAbsolute{Off: offIfindex, Size: 4}
	keep        = bpf.RetConstant{Val: bpfKeep}
	drop        = bpf.RetConstant{Val: bpfDrop}
)

// jumpEq skips t instructions if the loaded value is v, else f.
func jumpEq(v uint32, t, f uint8) bpf.Instruction {
	return bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipTrue: t, SkipFalse: f}
}

// assemble encodes prog for SO_ATTACH_FILTER (its instructions are all
// valid: an error is a bug here).
func assemble(prog []bpf.Instruction) []unix.SockFilter {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		panic(fmt.Sprintf("neighsync: socket filter: %v", err))
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out
}

// containerFilter keeps RTM_GETNEIGH on an interface whose ifindex is in
// ifindexes (all of them if more than maxFilterIndexes; none if empty).
// A message too short for a load is dropped (the kernel's rule).
func containerFilter(ifindexes []int) []unix.SockFilter {
	idx := slices.Clone(ifindexes)
	slices.Sort(idx)
	idx = slices.Compact(idx)
	if len(idx) > maxFilterIndexes {
		return assemble([]bpf.Instruction{loadType, jumpEq(wire16(unix.RTM_GETNEIGH), 0, 1), keep, drop})
	}
	n := len(idx)
	// 0 type, 1 is GETNEIGH?, 2 ifindex, 3..3+n-1 one per ifindex, drop, keep
	prog := []bpf.Instruction{loadType, jumpEq(wire16(unix.RTM_GETNEIGH), 0, uint8(n+1)), loadIfindex}
	for i, x := range idx {
		prog = append(prog, jumpEq(wire32(uint32(x)), uint8(n-i), 0))
	}
	return assemble(append(prog, drop, keep))
}

// hostFilter keeps RTM_NEWNEIGH and RTM_DELNEIGH on interface eth0.
func hostFilter(eth0 int) []unix.SockFilter {
	return assemble([]bpf.Instruction{
		loadType,
		jumpEq(wire16(unix.RTM_NEWNEIGH), 1, 0),
		jumpEq(wire16(unix.RTM_DELNEIGH), 0, 3),
		loadIfindex,
		jumpEq(wire32(uint32(eth0)), 0, 1),
		keep,
		drop,
	})
}

// attachFilter sets (or replaces, atomically) fd's socket filter.
func attachFilter(fd int, prog []unix.SockFilter) error {
	f := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &f); err != nil {
		return fmt.Errorf("netlink socket filter: %w", err)
	}
	return nil
}
