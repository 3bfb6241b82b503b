package tcfilter

// Encoding u32 requests straight into one buffer.
//
// vishvananda/netlink serializes a request attribute by attribute, each
// into a buffer of its own that its parent then copies: a u32 node with a
// mirred action cost some twenty allocations, and a setup sends about a
// hundred nodes. appendU32 writes the same bytes (TestEncodeMatchesNetlink
// compares the two) into the caller's buffer, with no allocation of its
// own: a burst of setups then leaves the garbage collector less to do
// beside it. Other requests (qdiscs, cls_bpf filters: a few per setup) go
// through the library as before (encodeNL).

import (
	"encoding/binary"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/nlbatch/nlattr"
)

var ne = binary.NativeEndian

var zeros [nl.SizeofTcU32Sel + nl.SizeofTcU32Key]byte

// attrs appends netlink attributes to a message under construction.
type attrs struct{ b []byte }

// pad appends zeros up to the next attribute boundary.
func (a *attrs) pad() { a.b = append(a.b, zeros[:nlattr.Align(len(a.b))-len(a.b)]...) }

// header appends an attribute header of length l.
func (a *attrs) header(typ uint16, l int) {
	a.b = ne.AppendUint16(a.b, uint16(l))
	a.b = ne.AppendUint16(a.b, typ)
}

func (a *attrs) u32(typ uint16, v uint32) {
	a.header(typ, unix.SizeofRtAttr+4)
	a.b = ne.AppendUint32(a.b, v)
}

// str appends a zero-terminated string attribute.
func (a *attrs) str(typ uint16, s string) {
	a.header(typ, unix.SizeofRtAttr+len(s)+1)
	a.b = append(a.b, s...)
	a.b = append(a.b, 0)
	a.pad()
}

// begin opens a nested attribute; end closes it, setting its length.
func (a *attrs) begin(typ uint16) int {
	off := len(a.b)
	a.header(typ, 0)
	return off
}

func (a *attrs) end(off int) { ne.PutUint16(a.b[off:off+2], uint16(len(a.b)-off)) }

// appendTo appends r serialized as encodeNL does: u32 filters here, the
// rest through vishvananda/netlink.
func (r request) appendTo(b []byte) ([]byte, error) {
	f, ok := r.f.(*netlink.U32)
	if r.q != nil || !ok {
		m, err := r.encodeNL()
		return append(b, m...), err
	}
	start := len(b)
	a := attrs{b: b}
	// struct nlmsghdr: the length is set at the end; seq and pid are 0
	// (Conn numbers the requests).
	a.b = ne.AppendUint32(a.b, 0)
	a.b = ne.AppendUint16(a.b, uint16(r.cmd))
	a.b = ne.AppendUint16(a.b, uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK|r.flags))
	a.b = ne.AppendUint32(a.b, 0)
	a.b = ne.AppendUint32(a.b, 0)
	// struct tcmsg
	fa := f.Attrs()
	a.b = append(a.b, nl.FAMILY_ALL, 0, 0, 0)
	a.b = ne.AppendUint32(a.b, uint32(int32(fa.LinkIndex)))
	a.b = ne.AppendUint32(a.b, fa.Handle)
	a.b = ne.AppendUint32(a.b, fa.Parent)
	a.b = ne.AppendUint32(a.b, netlink.MakeHandle(fa.Priority, nl.Swap16(fa.Protocol)))
	a.str(nl.TCA_KIND, f.Type())
	opts := a.begin(nl.TCA_OPTIONS)
	a.u32Sel(f.Sel)
	if f.ClassId != 0 {
		a.u32(nl.TCA_U32_CLASSID, f.ClassId)
	}
	if f.Divisor != 0 {
		a.u32(nl.TCA_U32_DIVISOR, f.Divisor)
	}
	if f.Hash != 0 {
		a.u32(nl.TCA_U32_HASH, f.Hash)
	}
	if f.Link != 0 {
		a.u32(nl.TCA_U32_LINK, f.Link)
	}
	acts := a.begin(nl.TCA_U32_ACT)
	for i, act := range f.Actions {
		m, ok := act.(*netlink.MirredAction)
		if !ok {
			return b, fmt.Errorf("batch: action %s not supported", act.Type())
		}
		tab := a.begin(uint16(nl.TCA_ACT_TAB + i))
		a.str(nl.TCA_ACT_KIND, "mirred")
		aopts := a.begin(nl.TCA_ACT_OPTIONS)
		// struct tc_mirred: struct tc_gen, eaction, ifindex
		parms := len(a.b)
		a.header(nl.TCA_MIRRED_PARMS, unix.SizeofRtAttr+nl.SizeofTcMirred)
		g := m.Attrs()
		a.b = ne.AppendUint32(a.b, uint32(g.Index))
		a.b = ne.AppendUint32(a.b, uint32(g.Capab))
		a.b = ne.AppendUint32(a.b, uint32(int32(g.Action)))
		a.b = ne.AppendUint32(a.b, uint32(int32(g.Refcnt)))
		a.b = ne.AppendUint32(a.b, uint32(int32(g.Bindcnt)))
		a.b = ne.AppendUint32(a.b, uint32(int32(m.MirredAction)))
		a.b = ne.AppendUint32(a.b, uint32(m.Ifindex))
		// vishvananda/netlink sends nl.SizeofTcMirred bytes, two more than
		// the struct (its SizeofTcGen is 22, not 20): zeros, which the
		// kernel does not read.
		a.b = append(a.b, zeros[:unix.SizeofRtAttr+nl.SizeofTcMirred-(len(a.b)-parms)]...)
		a.pad()
		a.end(aopts)
		a.end(tab)
	}
	a.end(acts)
	a.end(opts)
	ne.PutUint32(a.b[start:start+4], uint32(len(a.b)-start))
	return a.b, nil
}

// u32Sel appends TCA_U32_SEL: struct tc_u32_sel, then its keys, masks,
// values and the hash mask in network order (a nil selector matches all).
func (a *attrs) u32Sel(s *nl.TcU32Sel) {
	keys, flags := 1, uint8(nl.TC_U32_TERMINAL)
	if s != nil {
		keys, flags = len(s.Keys), s.Flags
	}
	a.header(nl.TCA_U32_SEL, unix.SizeofRtAttr+nl.SizeofTcU32Sel+keys*nl.SizeofTcU32Key)
	if s == nil {
		a.b = append(a.b, flags, 0, 1, 0)
		a.b = append(a.b, zeros[:nl.SizeofTcU32Sel-4+nl.SizeofTcU32Key]...)
		return
	}
	a.b = append(a.b, flags, s.Offshift, uint8(keys), s.Pad)
	a.b = ne.AppendUint16(a.b, nl.Swap16(s.Offmask))
	a.b = ne.AppendUint16(a.b, s.Off)
	a.b = ne.AppendUint16(a.b, uint16(s.Offoff))
	a.b = ne.AppendUint16(a.b, uint16(s.Hoff))
	a.b = ne.AppendUint32(a.b, nl.Swap32(s.Hmask))
	for _, k := range s.Keys {
		a.b = ne.AppendUint32(a.b, nl.Swap32(k.Mask))
		a.b = ne.AppendUint32(a.b, nl.Swap32(k.Val))
		a.b = ne.AppendUint32(a.b, uint32(k.Off))
		a.b = ne.AppendUint32(a.b, uint32(k.OffMask))
	}
}
