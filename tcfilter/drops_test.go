package tcfilter

import (
	"maps"
	"net"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/test/traffic"
)

// TestDropsCountedAndSinkDown: a datagram from a source port the container
// does not own is dropped and counted under DropPort; still dropped (not
// counted) while its sink is down (the degraded mode of a kernel without
// cls_bpf: mirred drops what is redirected to a down device); a sink
// deleted and re-created by EnsureDropSinks (a restarted daemon) gets the
// host's action pointed at it without touching the veth, and the counts
// survive it (the map is adopted from the other sinks' programs);
// Release hands a veth's counts over and forgets them.
func TestDropsCountedAndSinkDown(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	serve(t, w.s.Client.Do, "client", 9000)
	client := net.JoinHostPort(w.s.ClientIP.String(), "9000")
	if got, err := echo(a.c.Do, "udp", client); err != nil || got != "client" {
		t.Fatalf("owned port: %q %v", got, err)
	}
	try := func(what string, counted bool) {
		t.Helper()
		before, err := a.vf.Drops()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := echo(a.c.Do, "udp", client, traffic.WithSource("0.0.0.0:40000")); err == nil {
			t.Fatalf("%s: a datagram from an unowned port got out", what)
		}
		after, err := a.vf.Drops()
		if err != nil {
			t.Fatal(err)
		}
		if rose := after[DropPort] > before[DropPort]; rose != counted {
			t.Errorf("%s: port drops %d -> %d", what, before[DropPort], after[DropPort])
		}
		for _, r := range DropReasons {
			if _, ok := after[r]; !ok {
				t.Errorf("reason %s missing from %v", r, after)
			}
		}
	}
	try("sink up", true)
	counts, err := a.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}

	sink, err := w.h.LinkByName(DropSinkName(DropPort))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.h.LinkSetDown(sink); err != nil {
		t.Fatal(err)
	}
	try("sink down", false)

	// A deleted and re-created sink (another ifindex): the host's action
	// follows it; the veth's filters are not touched.
	if err := w.h.LinkDel(sink); err != nil {
		t.Fatal(err)
	}
	show := w.tcShow(t, "vc1")
	sinks := ensureDropSinks(t, w.s)
	if sinks.Index(DropPort) == sink.Attrs().Index {
		t.Fatalf("re-created sink kept ifindex %d", sink.Attrs().Index)
	}
	if m, err := sinks.Counts(a.veth); err != nil || !maps.Equal(m, counts) {
		t.Errorf("counts after the sinks were ensured again: %v (%v), want %v", m, err, counts)
	}
	a.vf.Sinks = sinks
	try("re-created sink", true)
	if got, err := echo(a.c.Do, "udp", client); err != nil || got != "client" {
		t.Fatalf("owned port after the sink changed: %q %v", got, err)
	}
	if now := w.tcShow(t, "vc1"); strings.Count(now, "index") != strings.Count(show, "index") {
		t.Errorf("the veth's filters changed with the sink:\n%s\nnow:\n%s", show, now)
	}

	// Release: the counts, then nothing left of the veth in the map.
	counts, _ = sinks.Counts(a.veth)
	got, err := sinks.Release(a.veth)
	if err != nil || !maps.Equal(got, counts) || got[DropPort] < 2 {
		t.Errorf("Release = %v (%v), want %v", got, err, counts)
	}
	all, err := sinks.All()
	if err != nil || all[a.veth] != nil {
		t.Errorf("entries of veth %d left after Release: %v (%v)", a.veth, all[a.veth], err)
	}
	if m, _ := sinks.Counts(a.veth); m[DropPort] != 0 {
		t.Errorf("counts after Release: %v", m)
	}
}
