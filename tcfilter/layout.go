package tcfilter

// The handle scheme every device shares: priorities, table ids, node ids,
// classids and match keys (docs/datapath.md, "Priorities, parents,
// handles, classids"). Every device gets at most three u32 classifiers at
// parent ffff:fff2 (PrioARP 1, PrioIP 2, PrioIP6 4); nodes have explicit
// handles htid:bucket:node, never automatic ids (they wrap at 0x7ff);
// our table ids stay below 0x800, where the kernel numbers each
// priority's root table. A container's node carries classid 1:slot, so a
// restarted daemon maps kernel objects back to containers. Port-range node
// ids follow from the range alone (RangeNodeID), so deletion needs no
// saved state and a container's old and new ranges may coexist.

import (
	"errors"
	"fmt"
	"math/bits"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
)

// Classifier priorities. Every device we touch gets at most two u32
// classifiers under its ingress hook: one for ARP and one for IPv4.
const (
	PrioARP uint16 = 1 // protocol ETH_P_ARP
	PrioIP  uint16 = 2 // protocol ETH_P_IP
)

// Priorities on a container's host veth (ingress), which also has PrioIP:
// the VLAN check runs first, ARP after IP, everything else last. The drop
// sink's egress has one cls_bpf filter.
const (
	PrioVethVLAN  uint16 = 1 // cls_bpf, all protocols: drop 802.1Q/802.1ad-tagged frames
	PrioVethARP   uint16 = 3 // u32, ETH_P_ARP
	PrioVethOther uint16 = 5 // u32, all protocols: what is neither IPv4, ARP nor IPv6 -> sink (after PrioIP6)
	PrioSinkShot  uint16 = 1 // cls_bpf on the sink's egress: drop
)

// MaxSlot is the largest container slot: slots are u32 node ids (12 bits).
const MaxSlot = 0xfff

// ClassMajor is the classid major number of every node that belongs to a
// container: such a node carries classid ClassMajor:slot (tc prints "flowid
// 1:2a"). Infrastructure nodes that stop classification carry ClassStop.
// Classids are ignored by ingress/clsact except that the minor becomes
// skb->tc_index, which nothing on this kernel reads.
const (
	ClassMajor uint16 = 0x1
	ClassStop  uint32 = 0xffff0000 // ffff:0, "stop here, deliver to this device's stack"
)

// Table ids (the htid field of a u32 handle, 12 bits). Table ids are per
// classifier block (per qdisc hook), so every device reuses the same numbers.
// The kernel allocates the root table of each priority itself (0x800 and
// up); our own ids stay below 0x800 so they can never collide with those.
const (
	// host demux (host eth0 / host lo ingress)
	TableL      = 0x001 // IP prio, divisor 1: one node hashing the dport high byte into H1
	TableH1     = 0x002 // IP prio, divisor 256: bucket = dport >> 8
	TableICMP   = 0x003 // IP prio, divisor 1: ICMP to the host IP by type (see hostdemux_icmp.go)
	TableICMPFn = 0x004 // IP prio, divisor 1: one mirror node per container (node id = slot), unattributed echo only
	TablePort   = 0x006 // IP prio, divisor 256 on port>>8: ICMP errors by inner sport, echo by identifier
	TableH2Base = 0x100 // IP prio, 0x100+b, divisor 16: bucket = (dport >> 4) & 15, for dport>>8 == b
	// TableSpreadFirst..TableSpreadLast: one table per shared port, divisor
	// spread.Buckets, hashed on source-port bits 1..8.
	TableSpreadFirst = 0x200
	TableSpreadLast  = 0x7ff

	// host-side veth ingress: traffic from the container, keyed on its
	// source port (a "hash" table of divisor 1 holds the node that hashes
	// the L4 word after the IHL eat into the 256-bucket table)
	TableVethLocalHash = 0x010 // -> TableVethLocal
	TableVethLocal     = 0x011 // divisor 256 on sport>>8: owned sport -> redirect host lo
	TableVethOutHash   = 0x012 // -> TableVethOut
	TableVethOut       = 0x013 // divisor 256 on sport>>8: owned sport -> redirect host eth0
	TableVethHost      = 0x014 // divisor 1: host MAC, plain IPv4 header, source = host IP; by protocol
	TableVethLoop      = 0x015 // divisor 1: same, source and destination in 127.0.0.0/8
	TableVethICMP      = 0x016 // divisor 1 (after the IHL eat): allowed ICMP types
	TableVethFrag      = 0x017 // divisor 1: non-first fragments, by destination
	TableVethErrHash   = 0x018 // -> TableVethErr
	TableVethErr       = 0x019 // divisor 256 on the quoted dport>>8: ICMP error about an own port -> out

	// inside the container, keyed on the destination port
	TableCtrLoHash   = 0x020 // -> TableCtrLo
	TableCtrLo       = 0x021 // container lo, divisor 256 on dport>>8: own dport -> stop (stay local)
	TableCtrEth0Hash = 0x022 // -> TableCtrEth0
	TableCtrEth0     = 0x023 // container eth0, divisor 256 on dport>>8: own dport -> redirect lo
)

// Node ids of infrastructure nodes.
const (
	nodeRootTCP      = 0x1 // root: TCP first fragments (eat IHL) -> L / VL / CL ...
	nodeRootUDP      = 0x2
	nodeRootICMP     = 0x3 // eth0 root: ICMP first fragment to host IP -> TableICMP
	nodeRootICMPFrag = 0x4 // eth0 root: ICMP (non-first fragment) to host IP -> TableICMPFn
	nodeARPRoot      = 0x1 // ARP prio root: match-all -> stop (host) or redirect (veth)
	nodeL            = 0x1 // the node in TableL
	nodeEchoStop     = 0x1 // TableICMP: echo request -> stop
	// TableICMP nodes 0x10..0x21 and 0x800: see hostdemux_icmp.go
	nodeH2Link     = 0x800
	nodeSharedBase = 0x400 // shared-port link node in H2: 0x400 | (port & 0xff)
	// Spread-table bucket b holds pin nodes 1..0x100 (one per pinned
	// client, see newPinID) before its match-all default node.
	nodeSpread = 0x800
)

// spreadHmask hashes a spread table on source-port bits 1..8 in the first
// L4 word: spread.Bucket, spread.Buckets buckets (the largest u32 divisor).
const spreadHmask = uint32(spread.Buckets-1) << 17

// MakeU32Handle builds a u32 handle htid:bucket:node.
func MakeU32Handle(htid, bucket, node uint32) uint32 {
	return (htid&0xfff)<<20 | (bucket&0xff)<<12 | node&0xfff
}

// SplitU32Handle splits a u32 handle into table id, bucket and node id.
func SplitU32Handle(h uint32) (htid, bucket, node uint32) {
	return h >> 20, (h >> 12) & 0xff, h & 0xfff
}

// FormatHandle prints a u32 handle as "htid:bucket:node" in hex, exactly
// like tc prints "fh": 800::800, 2:80:208, 100: (a table), "none" for 0.
func FormatHandle(h uint32) string {
	if h == 0 {
		return "none"
	}
	htid, bkt, node := SplitU32Handle(h)
	s := ""
	if htid != 0 {
		s = fmt.Sprintf("%x:", htid)
	}
	if bkt != 0 {
		s += fmt.Sprintf("%x", bkt)
	}
	if node != 0 {
		s += fmt.Sprintf(":%x", node)
	}
	return s
}

// ClassID is the classid carried by every node of container slot.
func ClassID(slot uint16) uint32 { return netlink.MakeHandle(ClassMajor, slot) }

// slotOf returns the slot encoded in a container node's classid.
func slotOf(classid uint32) (uint16, bool) {
	if classid>>16 != uint32(ClassMajor) {
		return 0, false
	}
	s := uint16(classid & 0xffff)
	return s, s >= 1 && s <= MaxSlot
}

// RangeNodeID is the node id of every node that matches aligned range r in
// a 256-port chunk (a bucket hashed on the port's high byte, or one of its
// 16-port sub-buckets). Ranges of 256 ports or more get 0x200+log2(size)
// (0x208..0x210); smaller ranges get their index in the binary heap of all
// aligned sub-ranges of the chunk: (256>>k) + (low byte >> k) for size 2^k
// (2..511). Distinct aligned ranges that meet the same chunk therefore never
// share a node id, so ids can be derived from the range alone, and old and
// new ranges of one container may coexist during an update.
func RangeNodeID(r ephemeral.Range) uint32 {
	k := uint32(bits.TrailingZeros32(uint32(r.Size())))
	if k >= 8 {
		return 0x200 + k
	}
	return (256 >> k) + (uint32(r.Begin&0xff) >> k)
}

// Errors.
var (
	// ErrNotAligned: a range is not an aligned power-of-two block.
	ErrNotAligned = errors.New("range is not aligned (power-of-two size starting at a multiple of its size)")
	// ErrOverlap: the ports are already routed to another container.
	ErrOverlap = errors.New("ports already routed to another container")
	// ErrBadSlot: slot outside 1..MaxSlot.
	ErrBadSlot = errors.New("slot out of range 1..4095")
	// ErrNoFanout: fan-out asked on a demux without a destination address (host lo).
	ErrNoFanout = errors.New("ARP/ICMP fan-out needs the eth0 demux (with a destination address)")
)

func checkSlot(slot uint16) error {
	if slot < 1 || slot > MaxSlot {
		return fmt.Errorf("slot %d: %w", slot, ErrBadSlot)
	}
	return nil
}

func checkRanges(rs []ephemeral.Range) error {
	for i, r := range rs {
		if !r.IsAligned() {
			return fmt.Errorf("range %s: %w", r, ErrNotAligned)
		}
		for _, o := range rs[:i] {
			if r.Overlaps(o) {
				return fmt.Errorf("ranges %s and %s overlap", o, r)
			}
		}
	}
	return nil
}

// ---- selector keys (values and masks in host order; netlink swaps them) ----

func key(off int32, mask, val uint32) nl.TcU32Key {
	return nl.TcU32Key{Mask: mask, Val: val & mask, Off: off}
}

func matchAll() nl.TcU32Key { return nl.TcU32Key{} }

// IPv4 header keys (offsets from the network header).
func protoKey(p uint8) nl.TcU32Key { return key(8, 0x00ff0000, uint32(p)<<16) }
func firstFragKey() nl.TcU32Key    { return key(4, 0x00001fff, 0) } // fragment offset 0
func dstKey(ip net.IP) nl.TcU32Key { return key(16, 0xffffffff, ip4(ip)) }
func dstLoopbackKey() nl.TcU32Key  { return key(16, 0xff000000, 0x7f000000) } // 127.0.0.0/8

// L4 keys (offsets from the L4 header, after an IHL "eat").
func dportKey(r ephemeral.Range) nl.TcU32Key {
	return key(0, uint32(r.Mask()), uint32(r.Begin))
}
func sportKey(r ephemeral.Range) nl.TcU32Key {
	return key(0, uint32(r.Mask())<<16, uint32(r.Begin)<<16)
}
func icmpTypeKey(t uint8) nl.TcU32Key { return key(0, 0xff000000, uint32(t)<<24) }

func ip4(ip net.IP) uint32 {
	v := ip.To4()
	if v == nil {
		return 0
	}
	return uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
}

// sel builds a selector with exactly these keys (netlink copies cap(Keys)
// keys, so the slice must not have spare capacity).
func sel(flags uint8, keys ...nl.TcU32Key) *nl.TcU32Sel {
	if len(keys) == 0 {
		keys = []nl.TcU32Key{matchAll()}
	}
	k := make([]nl.TcU32Key, len(keys))
	copy(k, keys)
	return &nl.TcU32Sel{Flags: flags, Keys: k}
}

// eatIHL makes s skip the IPv4 header using its IHL field, as tc's
// "offset at 0 mask 0x0f00 shift 6 eat": the next table's keys and hash
// are relative to the L4 header, also for packets with IP options.
func eatIHL(s *nl.TcU32Sel) *nl.TcU32Sel {
	s.Flags |= nl.TC_U32_VAROFFSET | nl.TC_U32_EAT
	s.Offoff = 0
	s.Offmask = 0x0f00
	s.Offshift = 6
	s.Off = 0
	return s
}

func hashOn(s *nl.TcU32Sel, hoff int16, hmask uint32) *nl.TcU32Sel {
	s.Hoff = hoff
	s.Hmask = hmask
	return s
}

// ---- actions (always fresh structs; never U32.RedirIndex) ----

func redirect(ifindex int) []netlink.Action {
	return []netlink.Action{&netlink.MirredAction{
		ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_STOLEN},
		MirredAction: netlink.TCA_EGRESS_REDIR,
		Ifindex:      ifindex,
	}}
}

// mirrorContinue copies the packet to ifindex and lets u32 go on with the
// next node (control action TC_ACT_UNSPEC).
func mirrorContinue(ifindex int) []netlink.Action {
	return []netlink.Action{&netlink.MirredAction{
		ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_UNSPEC},
		MirredAction: netlink.TCA_EGRESS_MIRROR,
		Ifindex:      ifindex,
	}}
}

// mirredTarget returns the ifindex of f's first mirred action (0 if none).
func mirredTarget(f *netlink.U32) int {
	for _, a := range f.Actions {
		if m, ok := a.(*netlink.MirredAction); ok {
			return m.Ifindex
		}
	}
	return 0
}

// protocol numbers
const (
	ipprotoICMP = unix.IPPROTO_ICMP
	ipprotoTCP  = unix.IPPROTO_TCP
	ipprotoUDP  = unix.IPPROTO_UDP
)
