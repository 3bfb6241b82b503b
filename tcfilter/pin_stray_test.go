package tcfilter

import (
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
)

// TestPinStrayDropped: a node in a spread table's pin range that is no
// pin (a pin keyed on the source port alone, as an older daemon made
// them) is deleted when a demux starts, and its id is not handed out
// before.
func TestPinStrayDropped(t *testing.T) {
	w := newWire(t)
	const port, src = 9494, 50000
	a := w.plumb(t, "ca", 1, rg(32768, 33023))
	ha := spread.Holder{Slot: a.slot, Target: a.veth}
	if err := w.eth0D.setShared(port, []spread.Holder{ha}); err != nil {
		t.Fatal(err)
	}
	table := w.eth0D.shared[port].table
	old := node{prio: PrioIP, handle: MakeU32Handle(table, uint32(spread.Bucket(src)), 1), classid: ClassID(ha.Slot),
		sel: sel(nl.TC_U32_TERMINAL, sportKey(ephemeral.Range{Begin: src, End: src})), act: actRedirect, target: ha.Target, own: true}
	if err := w.eth0D.d.replace(KindIP, old); err != nil {
		t.Fatal(err)
	}
	fh := "fh " + FormatHandle(old.handle) + " "
	if !strings.Contains(w.tcShow(t, "eth0"), fh) {
		t.Fatalf("no node %s", fh)
	}
	again := NewHostDemux(w.h, w.eth0, "eth0", w.s.HostIP, nil)
	if err := again.Init(); err != nil {
		t.Fatal(err)
	}
	if show := w.tcShow(t, "eth0"); strings.Contains(show, fh) {
		t.Errorf("port-only pin left after a restart:\n%s", show)
	}
	if got, ok := again.Spread(port); !ok || len(got.Pins) != 0 {
		t.Errorf("restarted demux: shared %v, pins %v", ok, got.Pins)
	}
	// newPinID skips a stray's id until it is gone
	sp := &sharedPort{strays: []uint32{old.handle}}
	if id := sp.newPinID(fl(src)); id != 2 {
		t.Errorf("pin id %d next to a stray with id 1", id)
	}
}
