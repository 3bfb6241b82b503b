// Package nlattr reads and writes netlink attributes in place: struct
// rtattr or struct nlattr (a 16-bit length counting the 4-byte header, a
// 16-bit type), then the value, padded to 4 bytes. vishvananda/netlink's
// parser makes a slice of every attribute of a message and its writer a
// buffer per attribute; the paths that read many messages (a dump of every
// host link, socket diagnostics) or answers (acks) use these instead.
package nlattr

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// HeaderLen is the size of an attribute's header.
const HeaderLen = unix.SizeofRtAttr

// Align rounds n up to the 4-byte boundary of attributes and messages
// (RTA_ALIGN, NLA_ALIGN, NLMSG_ALIGN).
func Align(n int) int { return (n + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1) }

// Walk calls fn with the type (NLA_F_NESTED and NLA_F_NET_BYTEORDER
// cleared) and the value of each attribute of b in turn, until fn returns
// false. It reports false when an attribute's length does not fit in b
// (fn has seen the attributes before it); bytes after the last attribute
// too few for a header are ignored.
func Walk(b []byte, fn func(typ uint16, v []byte) bool) bool {
	ne := binary.NativeEndian
	for len(b) >= HeaderLen {
		l := int(ne.Uint16(b[0:2]))
		if l < HeaderLen || l > len(b) {
			return false
		}
		if !fn(ne.Uint16(b[2:4])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[HeaderLen:l]) {
			return true
		}
		b = b[min(Align(l), len(b)):]
	}
	return true
}

// Get returns the value of the first attribute of type typ in b, or nil
// (none before the end or before an attribute that does not fit).
func Get(b []byte, typ uint16) []byte {
	var out []byte
	Walk(b, func(t uint16, v []byte) bool {
		if t == typ {
			out = v
			return false
		}
		return true
	})
	return out
}

// Append appends the attribute typ with value v to b, padded.
func Append(b []byte, typ uint16, v []byte) []byte {
	n := HeaderLen + len(v)
	b = binary.NativeEndian.AppendUint16(b, uint16(n))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	var pad [unix.RTA_ALIGNTO]byte
	return append(b, pad[:Align(n)-n]...)
}
