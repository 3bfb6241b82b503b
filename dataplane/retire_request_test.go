package dataplane

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/tcfilter"
)

// TestRetireOneRequest: the one-write retire (setRetired) of a container's
// veth mutes it and moves it to RetiredGroup, leaving it up and named as
// it was; the fallback without a mute filter sets a link down in the same
// request as the group; a missing link is an error.
func TestRetireOneRequest(t *testing.T) {
	e := newEnv(t)
	a := e.start("A", 1, "40960-41023", "31000", "", 31000)
	l, err := e.d.h.LinkByName(plane.VethName(a.c.ID))
	if err != nil {
		t.Fatal(err)
	}
	idx := l.Attrs().Index
	if muteErr, err := e.d.retired.setRetired(e.d, idx, cutMute); muteErr != nil || err != nil {
		t.Fatalf("setRetired(mute): %v %v", muteErr, err)
	}
	if l, err = e.d.h.LinkByIndex(idx); err != nil {
		t.Fatal(err)
	}
	if at := l.Attrs(); at.Name != plane.VethName(a.c.ID) || at.Group != RetiredGroup || at.Flags&net.FlagUp == 0 || !ourRetired(at) {
		t.Errorf("after setRetired(mute): name %q group %#x flags %v ours %v; want %q, %#x, up, ours", at.Name, at.Group, at.Flags, ourRetired(at), plane.VethName(a.c.ID), RetiredGroup)
	}
	if muted, err := tcfilter.Muted(e.d.h, idx); err != nil || !muted {
		t.Errorf("veth not muted: %v %v", muted, err)
	}
	// Muting again (a teardown done again) is not an error.
	if muteErr, err := e.d.retired.setRetired(e.d, idx, cutMute); muteErr != nil || err != nil {
		t.Errorf("setRetired(mute) again: %v %v", muteErr, err)
	}

	if err := e.d.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "isdtest0"}, PeerName: "isdtest1"}); err != nil {
		t.Fatal(err)
	}
	l, err = e.d.h.LinkByName("isdtest0")
	if err != nil {
		t.Fatal(err)
	}
	plain := l.Attrs().Index
	t.Cleanup(func() { _ = e.d.h.LinkDel(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: plain}}) })
	if err := e.d.h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.retired.setRetired(e.d, plain, cutDown); err != nil {
		t.Fatalf("setRetired(down): %v", err)
	}
	if l, err = e.d.h.LinkByIndex(plain); err != nil {
		t.Fatal(err)
	}
	if at := l.Attrs(); at.Group != RetiredGroup || at.Flags&net.FlagUp != 0 || ourRetired(at) {
		t.Errorf("after setRetired(down): group %#x flags %v ours %v; want %#x, down, not ours (not our name)", at.Group, at.Flags, ourRetired(at), RetiredGroup)
	}
	if _, err := e.d.retired.setRetired(e.d, plain+100000, cutNone); err == nil {
		t.Errorf("setRetired of a missing link: no error")
	}
}
