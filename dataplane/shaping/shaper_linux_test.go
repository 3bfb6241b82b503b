package shaping

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/test/sandbox"
)

// inSync reports whether the device enforces exactly l (the zero Limit:
// no HTB root of ours) with the leaf kind s.Leaf.
func (s Shaper) inSync(l rate.Limit) (bool, error) {
	st, err := s.Read()
	if err != nil {
		return false, err
	}
	if l.IsZero() {
		return !st.Root, nil
	}
	return st.Present && sameClass(st.Class, class(l, s.Link)) && st.Leaf == s.Leaf.String(), nil
}

func TestLimitClass(t *testing.T) {
	l := rate.Limit{Rate: 2_000_000}
	c := class(l, 7)
	if c.Rate != 2_000_000 || c.Ceil != 2_000_000 || c.Buffer != c.Cbuffer || c.Buffer == 0 {
		t.Errorf("no ceil: class %+v, want ceil = rate and cburst = burst", c)
	}
	p := class(rate.Limit{Rate: 2_000_000, Ceil: 8_000_000}, 7)
	if p.Ceil != 8_000_000 || p.Cbuffer >= p.Buffer {
		t.Errorf("ceil: class %+v, want ceil 8MB/s with a small cburst", p)
	}
	// the burst read back from the kernel's buffer time is the burst set
	st := State{Class: class(rate.Limit{Rate: 2_000_000, Burst: 300_000}, 1)}
	if got := st.Limit(); got.Rate != 2_000_000 || got.Ceil != 0 || got.Burst < 299_000 || got.Burst > 301_000 {
		t.Errorf("read back %+v, want rate 2MB/s burst ~300000", got)
	}
}

// shapeEnv is a sandbox host with a veth pair (tgt0, tgt0p) to shape.
func shapeEnv(t *testing.T) (*sandbox.Sandbox, *netlink.Handle, Shaper) {
	s := sandbox.New(t) // skips unless root
	h, err := s.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "tgt0"}, PeerName: "tgt0p"}); err != nil {
		t.Fatalf("add veth tgt0: %v", err)
	}
	for _, n := range []string{"tgt0", "tgt0p"} {
		l, err := h.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	l, err := h.LinkByName("tgt0")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := netns.GetFromPath(s.Host.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fd.Close() })
	return s, h, Shaper{H: h, NS: int(fd), Link: l.Attrs().Index, Leaf: LeafFIFO}
}

func TestShaperKernel(t *testing.T) {
	sb, h, s := shapeEnv(t)
	show := func() string {
		return sb.Host.Run(t, "tc", "qdisc", "show", "dev", "tgt0") + sb.Host.Run(t, "tc", "class", "show", "dev", "tgt0")
	}
	if ok, err := s.inSync(rate.Limit{}); err != nil || !ok {
		t.Fatalf("fresh device: inSync(none) = %v, %v", ok, err)
	}
	l := rate.Limit{Rate: 2_000_000}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	out := show()
	for _, want := range []string{
		"qdisc htb 1: root", "default 0x1",
		"qdisc bfifo 10: parent 1:1 limit 200000b",
		"class htb 1:1 root leaf 10: prio 0 rate 16Mbit ceil 16Mbit burst 64Kb cburst 64Kb",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("after Apply(2MB/s), tc shows no %q:\n%s", want, out)
		}
	}
	if ok, err := s.inSync(l); err != nil || !ok {
		t.Errorf("inSync(applied) = %v, %v", ok, err)
	}
	if ok, _ := s.inSync(rate.Limit{Rate: 4_000_000}); ok {
		t.Error("inSync(other rate) = true")
	}
	st, err := s.Read()
	if err != nil || !st.Present || st.Leaf != "bfifo" || st.Limit().Rate != 2_000_000 {
		t.Errorf("Read = %+v, %v", st, err)
	}

	// Push packets through, then change: counters survive (the qdisc is
	// not recreated) and the leaf is resized in place.
	send := func(n int) {
		t.Helper()
		if err := sb.Host.Do(func() error {
			c, err := net.Dial("udp", "198.18.5.5:9") // nothing answers; routed out of tgt0 below
			if err != nil {
				return err
			}
			defer c.Close()
			for i := 0; i < n; i++ {
				c.Write(make([]byte, 1000))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	tl, _ := h.LinkByIndex(s.Link)
	if err := h.RouteAdd(&netlink.Route{LinkIndex: s.Link, Dst: &net.IPNet{IP: net.IPv4(198, 18, 5, 0), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	h.NeighAdd(&netlink.Neigh{LinkIndex: s.Link, State: netlink.NUD_PERMANENT, IP: net.IPv4(198, 18, 5, 5), HardwareAddr: tl.Attrs().HardwareAddr})
	send(20)
	before, _ := s.Read()
	if before.Packets < 20 {
		t.Fatalf("qdisc counted %d packets, want >= 20", before.Packets)
	}
	l2 := rate.Limit{Rate: 4_000_000, Ceil: 8_000_000, Burst: 100_000}
	if err := s.Apply(l2); err != nil {
		t.Fatal(err)
	}
	after, _ := s.Read()
	if after.Packets < before.Packets {
		t.Errorf("class change reset the qdisc counters (%d -> %d packets): it was recreated", before.Packets, after.Packets)
	}
	out = show()
	for _, want := range []string{"bfifo 10: parent 1:1 limit 800000b", "rate 32Mbit ceil 64Mbit burst 100000b"} {
		if !strings.Contains(out, want) {
			t.Errorf("after Apply(%+v), tc shows no %q:\n%s", l2, want, out)
		}
	}
	if ok, err := s.inSync(l2); err != nil || !ok {
		t.Errorf("inSync after change = %v, %v", ok, err)
	}
	if got := after.Limit(); got.Rate != l2.Rate || got.Ceil != l2.Ceil || got.Burst/1000 != l2.Burst/1000 {
		t.Errorf("Limit read back %+v, want %+v", got, l2)
	}

	// Apply again: nothing to change.
	if err := s.Apply(l2); err != nil {
		t.Fatal(err)
	}

	// Drain and remove.
	if err := s.Drain(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}
	if out := show(); strings.Contains(out, "htb") || strings.Contains(out, "bfifo") {
		t.Errorf("after Remove:\n%s", out)
	}
	if ok, err := s.inSync(rate.Limit{}); err != nil || !ok {
		t.Errorf("after Remove: inSync(none) = %v, %v", ok, err)
	}
	if err := s.Remove(); err != nil {
		t.Errorf("second Remove: %v", err)
	}

	// Zero limit through Apply removes; invalid limits change nothing.
	if err := s.Apply(rate.Limit{Rate: 10}); !errors.Is(err, rate.ErrBadLimit) {
		t.Errorf("Apply(10 B/s) = %v, want ErrBadLimit", err)
	}
	if out := show(); strings.Contains(out, "htb") {
		t.Errorf("a refused limit changed the device:\n%s", out)
	}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(rate.Limit{}); err != nil {
		t.Fatal(err)
	}
	if out := show(); strings.Contains(out, "htb") {
		t.Errorf("Apply(none) left:\n%s", out)
	}
}

// A half-built shaping (root without class, a foreign leaf) is repaired.
func TestShaperRepairs(t *testing.T) {
	_, h, s := shapeEnv(t)
	q := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: rootHandle})
	q.Defcls = 1
	if err := h.QdiscAdd(q); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Read(); !st.Root || st.Present {
		t.Fatalf("root without class: %+v", st)
	}
	l := rate.Limit{Rate: 3_000_000}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.inSync(l); !ok || err != nil {
		t.Errorf("repaired: inSync = %v, %v", ok, err)
	}
	// another default class: recreated
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}
	q = netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: rootHandle})
	q.Defcls = 0x20
	if err := h.QdiscAdd(q); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.inSync(l); !ok || err != nil {
		t.Errorf("default class fixed: inSync = %v, %v", ok, err)
	}
	// a foreign root qdisc is replaced
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := h.QdiscAdd(&netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: s.Link, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(5, 0)},
		Rate: 1 << 20, Limit: 1 << 16, Buffer: 1 << 14}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(l); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.inSync(l); !ok || err != nil {
		t.Errorf("foreign root replaced: inSync = %v, %v", ok, err)
	}
}
