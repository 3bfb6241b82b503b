package dataplane

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestRetireOneRequest: the one-request retire (setRetired, which retire
// falls back from silently) sets the link down, gives it its retired name
// and moves it to RetiredGroup.
func TestRetireOneRequest(t *testing.T) {
	e := newEnv(t)
	if err := e.d.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "isdtest0"}, PeerName: "isdtest1"}); err != nil {
		t.Fatal(err)
	}
	l, err := e.d.h.LinkByName("isdtest0")
	if err != nil {
		t.Fatal(err)
	}
	idx := l.Attrs().Index
	t.Cleanup(func() { _ = e.d.h.LinkDel(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}) })
	if err := e.d.h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	if err := e.d.retired.setRetired(e.d, idx); err != nil {
		t.Fatalf("setRetired: %v", err)
	}
	l, err = e.d.h.LinkByIndex(idx)
	if err != nil {
		t.Fatal(err)
	}
	a := l.Attrs()
	if a.Name != retiredName(idx) || a.Group != RetiredGroup || a.Flags&net.FlagUp != 0 {
		t.Errorf("after setRetired: name %q group %#x flags %v; want %q, %#x, down", a.Name, a.Group, a.Flags, retiredName(idx), RetiredGroup)
	}
	if err := e.d.retired.setRetired(e.d, idx+100000); err == nil {
		t.Errorf("setRetired of a missing link: no error")
	}
}
