package nlbatch

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// randomU32 is a u32 node with every field the encoder writes drawn at
// random (zero or not), with up to two mirred actions.
func randomU32(r *rand.Rand) *netlink.U32 {
	maybe := func(v uint32) uint32 {
		if r.IntN(3) == 0 {
			return 0
		}
		return v
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: r.IntN(1 << 20),
			Handle:    r.Uint32(),
			Parent:    r.Uint32(),
			Priority:  uint16(r.Uint32()),
			Protocol:  uint16(r.Uint32()),
		},
		ClassId: maybe(r.Uint32()),
		Divisor: maybe(r.Uint32()),
		Hash:    maybe(r.Uint32()),
		Link:    maybe(r.Uint32()),
	}
	if r.IntN(4) != 0 {
		s := &nl.TcU32Sel{
			Flags: uint8(r.Uint32()), Offshift: uint8(r.Uint32()), Pad: uint8(r.Uint32()),
			Offmask: uint16(r.Uint32()), Off: uint16(r.Uint32()), Offoff: int16(r.Uint32()),
			Hoff: int16(r.Uint32()), Hmask: r.Uint32(),
		}
		for range r.IntN(5) {
			s.Keys = append(s.Keys, nl.TcU32Key{Mask: r.Uint32(), Val: r.Uint32(), Off: int32(r.Uint32()), OffMask: int32(r.Uint32())})
		}
		f.Sel = s
	}
	for range r.IntN(3) {
		m := netlink.NewMirredAction(r.IntN(1 << 20))
		m.MirredAction = netlink.MirredAct(r.IntN(5))
		m.Index = int(r.Uint32() >> 1)
		m.Action = netlink.TcAct(r.IntN(8) - 1)
		m.Capab, m.Refcnt, m.Bindcnt = r.IntN(3), r.IntN(3), r.IntN(3)
		f.Actions = append(f.Actions, m)
	}
	return f
}

// TestEncodeMatchesNetlink: AppendTo writes, byte for byte, what
// vishvananda/netlink's serialization (encodeNL) does, for u32 nodes of
// every shape, after whatever the buffer already holds; other requests
// (cls_bpf, qdiscs) go through the library itself.
func TestEncodeMatchesNetlink(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cmds := []int{unix.RTM_NEWTFILTER, unix.RTM_DELTFILTER}
	flags := []int{0, unix.NLM_F_CREATE, unix.NLM_F_CREATE | unix.NLM_F_EXCL}
	var reqs []Request
	for range 2000 {
		reqs = append(reqs, Request{Cmd: cmds[r.IntN(2)], Flags: flags[r.IntN(3)], Filter: randomU32(r)})
	}
	// the match-all node and a deletion by handle alone
	reqs = append(reqs, Request{Cmd: unix.RTM_NEWTFILTER, Filter: &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: 3, Handle: 0x800001, Priority: 2, Protocol: unix.ETH_P_IP}}},
		Request{Cmd: unix.RTM_DELTFILTER, Filter: &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: 3, Handle: 0x800001}, Sel: &nl.TcU32Sel{}}})
	reqs = append(reqs,
		Request{Cmd: unix.RTM_NEWTFILTER, Flags: unix.NLM_F_CREATE, Filter: &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: 7, Handle: 1, Parent: netlink.HANDLE_MIN_INGRESS, Priority: 1, Protocol: unix.ETH_P_ALL},
			Fd:          9, Name: "prog", DirectAction: true, ClassId: 5}},
		Request{Cmd: unix.RTM_NEWQDISC, Flags: unix.NLM_F_CREATE, Qdisc: &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: 7, Parent: netlink.HANDLE_INGRESS, Handle: netlink.MakeHandle(0xffff, 0)}}})
	var buf []byte
	for i, q := range reqs {
		want, err := q.encodeNL()
		if err != nil {
			t.Fatalf("request %d: encodeNL: %v", i, err)
		}
		before := len(buf)
		buf, err = q.AppendTo(buf)
		if err != nil {
			t.Fatalf("request %d: appendTo: %v", i, err)
		}
		if got := buf[before:]; !bytes.Equal(got, want) {
			t.Fatalf("request %d (%+v): encoded\n% x\nwant (vishvananda/netlink)\n% x", i, q.Filter, got, want)
		}
	}
	// an action the encoder does not know is refused, the buffer as it was
	f := randomU32(r)
	f.Actions = []netlink.Action{&netlink.GenericAction{ActionAttrs: netlink.ActionAttrs{Action: netlink.TC_ACT_SHOT}}}
	n := len(buf)
	if out, err := (Request{Cmd: unix.RTM_NEWTFILTER, Filter: f}).AppendTo(buf); err == nil || len(out) != n {
		t.Errorf("a generic action: %d bytes, %v; want an error and the buffer as it was", len(out)-n, err)
	}
}

// BenchmarkEncode compares the allocations of a typical node: a redirect
// with two keys, through AppendTo and through vishvananda/netlink.
func BenchmarkEncode(b *testing.B) {
	m := netlink.NewMirredAction(12)
	m.Index = 0x40000000 | 12 // tcfilter's redirect index of ifindex 12
	q := Request{Cmd: unix.RTM_NEWTFILTER, Flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, Filter: &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: 3, Handle: 0x123456, Parent: netlink.HANDLE_MIN_INGRESS, Priority: 2, Protocol: unix.ETH_P_IP},
		ClassId:     netlink.MakeHandle(1, 7),
		Sel:         &nl.TcU32Sel{Flags: nl.TC_U32_TERMINAL, Keys: []nl.TcU32Key{{Mask: 0xfff0, Val: 0x4000}, {Mask: 0xff0000, Val: 0x60000, Off: 8}}},
		Actions:     []netlink.Action{m},
	}}
	b.Run("AppendTo", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 512)
		for range b.N {
			buf, _ = q.AppendTo(buf[:0])
		}
	})
	b.Run("netlink", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_, _ = q.encodeNL()
		}
	})
}
