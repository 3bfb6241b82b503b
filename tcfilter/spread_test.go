package tcfilter

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/isolatord/isolatord/ephemeral/spread"
)

func TestPinKeys(t *testing.T) {
	// a pin's keys read back as its client, for both families, and name
	// the pin's bucket
	for _, f := range []spread.Flow{
		netip.MustParseAddrPort("198.18.0.2:50000"),
		netip.MustParseAddrPort("203.0.113.255:1"),
		netip.MustParseAddrPort("[2001:db8::2]:443"),
		netip.MustParseAddrPort("[2001:db8:ffff::ffff:1]:65535"),
	} {
		keys := pinKeys(f)
		if want := map[bool]int{true: 3, false: 5}[f.Addr().Is4()]; len(keys) != want {
			t.Errorf("%s: %d keys, want %d", f, len(keys), want)
		}
		u := &netlink.U32{Sel: &nl.TcU32Sel{Keys: keys}}
		bkt := uint32(spread.Bucket(f.Port()))
		if got, ok := pinOf(u, bkt); !ok || got != f {
			t.Errorf("pinOf(pinKeys(%s)) = %s, %v", f, got, ok)
		}
		if _, ok := pinOf(u, (bkt+1)%spread.Buckets); ok {
			t.Errorf("%s read back in another bucket", f)
		}
		short := &netlink.U32{Sel: &nl.TcU32Sel{Keys: keys[len(keys)-1:]}}
		if _, ok := pinOf(short, bkt); ok {
			t.Errorf("%s: a source-port-only key read back as a pin", f)
		}
	}
	// node ids: the lowest free one in the bucket
	sp := &sharedPort{}
	a, b := netip.MustParseAddrPort("198.18.0.2:1000"), netip.MustParseAddrPort("198.18.0.3:1000")
	sp.setPin(a, sp.newPinID(a), spread.Holder{Slot: 1, Target: 2})
	if id := sp.newPinID(b); id != 2 {
		t.Errorf("second pin of a bucket got id %d", id)
	}
	sp.dropPin(a)
	if id := sp.newPinID(b); id != 1 {
		t.Errorf("after the drop: id %d", id)
	}
	for _, bad := range []spread.Flow{{}, netip.MustParseAddrPort("[::ffff:198.18.0.2]:1"), netip.MustParseAddrPort("0.0.0.0:1")} {
		if checkFlow(bad) == nil {
			t.Errorf("pin of %s accepted", bad)
		}
	}
}

func TestCheckSpread(t *testing.T) {
	good, _ := spread.Assign(80, spreadHolders(1, 2))
	s := spread.Spread{Buckets: good, Pins: map[spread.Flow]spread.Holder{}}
	if err := checkSpread(80, &s); err != nil {
		t.Fatal(err)
	}
	bad := s.Clone()
	bad.Buckets[7] = spread.Holder{}
	if checkSpread(80, &bad) == nil {
		t.Error("an empty bucket was accepted")
	}
	refuse := s.Clone()
	for b := range refuse.Buckets {
		refuse.Buckets[b] = spread.Refuse
	}
	refuse.Draining = map[uint16]bool{1: true}
	if err := checkSpread(80, &refuse); err != nil {
		t.Errorf("every bucket to the host (every holder drains): %v", err)
	}
	bad = s.Clone()
	bad.Pins[fl(14)] = spread.Holder{Slot: 1, Target: 999}
	if checkSpread(80, &bad) == nil {
		t.Error("a slot with two targets was accepted")
	}
	bad = s.Clone()
	for i := 0; i <= spread.MaxPinsPerBucket; i++ {
		bad.Pins[fl(uint16(6|i<<9))] = spread.Holder{Slot: 1, Target: 101}
	}
	if checkSpread(80, &bad) == nil {
		t.Error("too many pins in one bucket were accepted")
	}
}

func spreadHolders(slots ...uint16) []spread.Holder {
	var out []spread.Holder
	for _, s := range slots {
		out = append(out, spread.Holder{Slot: s, Target: int(s) + 100})
	}
	return out
}

// flowsOf returns a FlowSource from a fixed map of slot -> source ports
// (slots missing from known are unreadable) and records who was asked.
func flowsOf(known map[uint16][]uint16, asked map[uint16]int) spread.FlowSource {
	return func(slot uint16) ([]spread.Flow, bool) {
		if asked != nil {
			asked[slot]++
		}
		ps, ok := known[slot]
		return fls(ps...), ok
	}
}

// testClient is the client of the flows tests give as source ports: the
// sandbox's client namespace.
var testClient = netip.MustParseAddr("198.18.0.2")

// fl is the flow from testClient's source port p.
func fl(p uint16) spread.Flow { return netip.AddrPortFrom(testClient, p) }

func fls(ps ...uint16) []spread.Flow {
	var out []spread.Flow
	for _, p := range ps {
		out = append(out, fl(p))
	}
	return out
}
