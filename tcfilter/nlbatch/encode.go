package nlbatch

// Encoding tc requests.
//
// vishvananda/netlink serializes a request attribute by attribute, each
// into a buffer of its own that its parent then copies: a u32 node with a
// mirred action cost some twenty allocations, and a setup sends about a
// hundred nodes. appendU32 writes the same bytes (TestEncodeMatchesNetlink
// compares the two) into the caller's buffer, with no allocation of its
// own: a burst of setups then leaves the garbage collector less to do
// beside it. Other requests (qdiscs, cls_bpf filters: a few per setup) go
// through the library as before (encodeNL). Kept by hand because the
// library has no allocation-free encoder (TestEncodeMatchesNetlink checks
// the bytes are the same).

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

// Request is one tc request: a filter (RTM_NEWTFILTER, RTM_DELTFILTER)
// or a qdisc (RTM_NEWQDISC), sent with NLM_F_ACK.
type Request struct {
	Cmd    int // RTM_NEWTFILTER, RTM_DELTFILTER or RTM_NEWQDISC
	Flags  int // NLM_F_CREATE, NLM_F_EXCL
	Filter netlink.Filter
	Qdisc  netlink.Qdisc // set: a qdisc request (Filter is not used)
}

// Encode serializes the request (AppendTo).
func (r Request) Encode() ([]byte, error) { return r.AppendTo(nil) }

// AppendTo appends r serialized as encodeNL does: u32 filters here, the
// rest through vishvananda/netlink.
func (r Request) AppendTo(b []byte) ([]byte, error) {
	f, ok := r.Filter.(*netlink.U32)
	if r.Qdisc != nil || !ok {
		m, err := r.encodeNL()
		return append(b, m...), err
	}
	start := len(b)
	a := attrs{b: b}
	// struct nlmsghdr: the length is set at the end; seq and pid are 0
	// (Conn numbers the requests).
	a.b = ne.AppendUint32(a.b, 0)
	a.b = ne.AppendUint16(a.b, uint16(r.Cmd))
	a.b = ne.AppendUint16(a.b, uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK|r.Flags))
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

// encodeNL serializes the request exactly as vishvananda/netlink's
// filterModify and qdiscModify do for the kinds used here (u32, cls_bpf,
// ingress), with NLM_F_ACK. A copy because the library sends a request
// as it serializes it and a batch needs the bytes.
func (r Request) encodeNL() ([]byte, error) {
	req := &nl.NetlinkRequest{NlMsghdr: unix.NlMsghdr{
		Type:  uint16(r.Cmd),
		Flags: uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK | r.Flags),
	}}
	if r.Qdisc != nil {
		a := r.Qdisc.Attrs()
		req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(a.LinkIndex), Handle: a.Handle, Parent: a.Parent})
		req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated(r.Qdisc.Type())))
		req.AddData(nl.NewRtAttr(nl.TCA_OPTIONS, nil))
		return req.Serialize(), nil
	}
	a := r.Filter.Attrs()
	req.AddData(&nl.TcMsg{
		Family:  nl.FAMILY_ALL,
		Ifindex: int32(a.LinkIndex),
		Handle:  a.Handle,
		Parent:  a.Parent,
		Info:    netlink.MakeHandle(a.Priority, nl.Swap16(a.Protocol)),
	})
	req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated(r.Filter.Type())))
	opts := nl.NewRtAttr(nl.TCA_OPTIONS, nil)
	switch f := r.Filter.(type) {
	case *netlink.U32:
		encodeU32(opts, f)
		if err := netlink.EncodeActions(opts.AddRtAttr(nl.TCA_U32_ACT, nil), f.Actions); err != nil {
			return nil, err
		}
	case *netlink.BpfFilter:
		if f.ClassId != 0 {
			opts.AddRtAttr(nl.TCA_BPF_CLASSID, nl.Uint32Attr(f.ClassId))
		}
		if f.Fd >= 0 {
			opts.AddRtAttr(nl.TCA_BPF_FD, nl.Uint32Attr(uint32(f.Fd)))
		}
		if f.Name != "" {
			opts.AddRtAttr(nl.TCA_BPF_NAME, nl.ZeroTerminated(f.Name))
		}
		var flags uint32
		if f.DirectAction {
			flags |= nl.TCA_BPF_FLAG_ACT_DIRECT
		}
		opts.AddRtAttr(nl.TCA_BPF_FLAGS, nl.Uint32Attr(flags))
	default:
		return nil, fmt.Errorf("batch: filter kind %s not supported", r.Filter.Type())
	}
	req.AddData(opts)
	return req.Serialize(), nil
}

// encodeU32 adds f's u32 options but its actions: the selector (keys
// and masks to network order), class, divisor, hash and link.
func encodeU32(opts *nl.RtAttr, f *netlink.U32) {
	s := f.Sel
	if s == nil { // match all
		s = &nl.TcU32Sel{Flags: nl.TC_U32_TERMINAL, Keys: []nl.TcU32Key{{}}}
	}
	c := *s
	c.Keys = make([]nl.TcU32Key, len(s.Keys))
	for i, k := range s.Keys {
		c.Keys[i] = nl.TcU32Key{Mask: nl.Swap32(k.Mask), Val: nl.Swap32(k.Val), Off: k.Off, OffMask: k.OffMask}
	}
	c.Offmask = nl.Swap16(s.Offmask)
	c.Hmask = nl.Swap32(s.Hmask)
	c.Nkeys = uint8(len(c.Keys))
	opts.AddRtAttr(nl.TCA_U32_SEL, c.Serialize())
	if f.ClassId != 0 {
		opts.AddRtAttr(nl.TCA_U32_CLASSID, nl.Uint32Attr(f.ClassId))
	}
	if f.Divisor != 0 {
		opts.AddRtAttr(nl.TCA_U32_DIVISOR, nl.Uint32Attr(f.Divisor))
	}
	if f.Hash != 0 {
		opts.AddRtAttr(nl.TCA_U32_HASH, nl.Uint32Attr(f.Hash))
	}
	if f.Link != 0 {
		opts.AddRtAttr(nl.TCA_U32_LINK, nl.Uint32Attr(f.Link))
	}
}
