package tcfilter

// Pins of a shared port's spread table match the client's address and
// source port, so a new flow from another client that happens to use a
// pinned source port goes where new flows go (its bucket), never to the
// pin's holder (a draining container, or one that lost the bucket).
//
// The spread table is reached from both classifiers with the offset at the
// L4 header: IPv4 after eating IHL*4, IPv6 after eating the fixed 40-byte
// header (48 for a first fragment). Key offsets are relative to it and
// signed, so the source address is read back behind it:
//
//   - IPv4: version and IHL byte 0x45 at -20 (a fixed 20-byte header), the
//     source address at -8, the source port at 0: three keys. A packet with
//     IP options (IHL > 5) does not match any pin and goes to its bucket's
//     holder like a new flow (a pinned TCP flow that sends one would be
//     reset by that holder). Hosts and routers on the Internet almost never
//     send IP options on TCP or UDP; a flow that does is treated as new.
//   - IPv6: the source address at -32..-17 (four keys), the source port at
//     0: five keys. A first fragment (eaten at 48) does not match a pin: its
//     source address is at -40. Unfragmented TCP and UDP do.
//
// Each pin is one node whatever its keys: a packet meets at most the
// MaxPinsPerBucket pins of its bucket. One table serves both families, so
// a pin of one family is read against packets of the other: an IPv4 pin's
// address key lands on bytes 8..11 of an IPv6 packet's destination (one of
// the host's addresses), an IPv6 pin's first keys on an IPv4 packet's
// Ethernet header (the host's MAC address); neither is the client's to
// choose, and with addresses as deployed (no IPv4 address embedded at
// bytes 8..11 of a host IPv6 address, no MAC equal to a client address)
// they never match.
//
// Node ids: a bucket's pins take the lowest free ids in 1..0x100 (a bucket
// has at most 16 pins, and for a moment during a change 32); the id is
// kept in the index (sharedPort.pinIDs) and read back with the keys.

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
)

const (
	pinOffV4Head = -20 // IPv4 version and IHL: 0x45
	pinOffV4Src  = -8  // IPv4 source address
	pinOffV6Src  = -32 // IPv6 source address, 4 words
	pinMaxID     = 0x100
)

// checkFlow fails unless f is a client a pin can match: an IPv4 or IPv6
// address (not IPv4-mapped, no zone) and a source port.
func checkFlow(f spread.Flow) error {
	a := f.Addr()
	if !a.IsValid() || a.Is4In6() || a.Zone() != "" || a.IsUnspecified() {
		return fmt.Errorf("pin of client %s: not a client address", f)
	}
	return nil
}

// cmpFlow orders pins by source port, then address.
func cmpFlow(a, b spread.Flow) int {
	if a.Port() != b.Port() {
		return int(a.Port()) - int(b.Port())
	}
	return a.Addr().Compare(b.Addr())
}

// pinKeys are the keys of f's pin node.
func pinKeys(f spread.Flow) []nl.TcU32Key {
	sport := sportKey(ephemeral.Range{Begin: f.Port(), End: f.Port()})
	a := f.Addr()
	if a.Is4() {
		b := a.As4()
		return []nl.TcU32Key{
			key(pinOffV4Head, 0xff000000, 0x45000000),
			key(pinOffV4Src, 0xffffffff, be32(b[:])),
			sport,
		}
	}
	b := a.As16()
	keys := make([]nl.TcU32Key, 0, 5)
	for i := 0; i < 4; i++ {
		keys = append(keys, key(pinOffV6Src+int32(4*i), 0xffffffff, be32(b[4*i:])))
	}
	return append(keys, sport)
}

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// pinOf reads the client a pin node in bucket bkt of a spread table
// matches: exactly the keys pinKeys makes.
func pinOf(f *netlink.U32, bkt uint32) (spread.Flow, bool) {
	if f.Sel == nil {
		return spread.Flow{}, false
	}
	byOff := map[int32]nl.TcU32Key{}
	for _, k := range f.Sel.Keys {
		if _, dup := byOff[k.Off]; dup {
			return spread.Flow{}, false
		}
		byOff[k.Off] = k
	}
	sk, ok := byOff[0]
	if !ok || sk.Mask != 0xffff0000 {
		return spread.Flow{}, false
	}
	port := uint16(sk.Val >> 16)
	if uint32(spread.Bucket(port)) != bkt {
		return spread.Flow{}, false
	}
	word := func(off int32) (uint32, bool) {
		k, ok := byOff[off]
		return k.Val, ok && k.Mask == 0xffffffff
	}
	var addr netip.Addr
	switch len(f.Sel.Keys) {
	case 3:
		h, ok := byOff[pinOffV4Head]
		v, ok2 := word(pinOffV4Src)
		if !ok || !ok2 || h.Mask != 0xff000000 || h.Val != 0x45000000 {
			return spread.Flow{}, false
		}
		addr = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	case 5:
		var b [16]byte
		for i := 0; i < 4; i++ {
			v, ok := word(pinOffV6Src + int32(4*i))
			if !ok {
				return spread.Flow{}, false
			}
			b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		}
		addr = netip.AddrFrom16(b)
	default:
		return spread.Flow{}, false
	}
	fl := netip.AddrPortFrom(addr, port)
	if checkFlow(fl) != nil {
		return spread.Flow{}, false
	}
	return fl, true
}

// newPinID is the lowest node id in f's bucket that no pin (or stray node
// waiting for deletion) of sp uses.
func (sp *sharedPort) newPinID(f spread.Flow) uint32 {
	b := spread.Bucket(f.Port())
	used := map[uint32]bool{}
	for p, id := range sp.pinIDs {
		if spread.Bucket(p.Port()) == b {
			used[id] = true
		}
	}
	for _, h := range sp.strays {
		if _, bkt, id := SplitU32Handle(h); int(bkt) == b {
			used[id] = true
		}
	}
	for id := uint32(1); id <= pinMaxID; id++ {
		if !used[id] {
			return id
		}
	}
	return 0 // not reached: a bucket holds at most 2*MaxPinsPerBucket pins
}

// setPin records pin f (node id, holder) in the index.
func (sp *sharedPort) setPin(f spread.Flow, id uint32, h spread.Holder) {
	if sp.pins == nil {
		sp.pins = map[spread.Flow]spread.Holder{}
		sp.pinIDs = map[spread.Flow]uint32{}
	}
	sp.pins[f], sp.pinIDs[f] = h, id
}

// dropPin removes pin f from the index.
func (sp *sharedPort) dropPin(f spread.Flow) {
	delete(sp.pins, f)
	delete(sp.pinIDs, f)
}
