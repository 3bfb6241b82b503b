package dataplane

import (
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// TestLinkNameGroupAlias: a link message's index, name, group and alias,
// read in place among other attributes; a message whose attribute lengths
// do not fit is refused.
func TestLinkNameGroupAlias(t *testing.T) {
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = 42
	b := msg.Serialize()
	for _, a := range []*nl.RtAttr{
		nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(1500)),
		nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated("isoabc")),
		nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(RetiredGroup)),
		nl.NewRtAttr(unix.IFLA_ADDRESS, []byte{1, 2, 3, 4, 5, 6}), // padded
		nl.NewRtAttr(unix.IFLA_IFALIAS, nl.ZeroTerminated("isolatord c1")),
	} {
		b = append(b, a.Serialize()...)
	}
	got, ok := linkNameGroupAlias(b)
	if !ok || got.Index != 42 || got.Name != "isoabc" || got.Group != RetiredGroup || got.Alias != "isolatord c1" {
		t.Errorf("linkNameGroupAlias = %+v, %v", got, ok)
	}
	bad := append([]byte(nil), b...)
	bad[unix.SizeofIfInfomsg] = 200 // the first attribute's length runs past the end
	if _, ok := linkNameGroupAlias(bad); ok {
		t.Error("a message whose attribute overruns it was read")
	}
	if _, ok := linkNameGroupAlias(b[:unix.SizeofIfInfomsg-1]); ok {
		t.Error("a message shorter than ifinfomsg was read")
	}
}
