package tcfilter

import (
	"net"
	"testing"

	"github.com/isolatord/isolatord/test/traffic"
)

// TestDropsCountedAndSinkDown: a datagram from a source port the container
// does not own is dropped and counted under DropPort, also while the sink
// is down (the degraded mode of a kernel without cls_bpf: mirred drops
// what is redirected to a down device), and Install puts a veth's drop
// nodes back on a re-created sink.
func TestDropsCountedAndSinkDown(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	serve(t, w.s.Client.Do, "client", 9000)
	client := net.JoinHostPort(w.s.ClientIP.String(), "9000")
	if got, err := echo(a.c.Do, "udp", client); err != nil || got != "client" {
		t.Fatalf("owned port: %q %v", got, err)
	}
	try := func(what string) {
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
		if after[DropPort] <= before[DropPort] {
			t.Errorf("%s: port drops %d -> %d", what, before[DropPort], after[DropPort])
		}
		for _, r := range DropReasons {
			if _, ok := after[r]; !ok {
				t.Errorf("reason %s missing from %v", r, after)
			}
		}
	}
	try("sink up")

	sink, err := w.h.LinkByIndex(w.sink)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.h.LinkSetDown(sink); err != nil {
		t.Fatal(err)
	}
	try("sink down")

	// A deleted and re-created sink: Install re-points the drop nodes.
	if err := w.h.LinkDel(sink); err != nil {
		t.Fatal(err)
	}
	sk, bpfErr, err := EnsureSink(w.h, SinkName)
	if err != nil || bpfErr != nil || sk.Index == w.sink {
		t.Fatalf("re-created sink: %+v %v %v", sk, bpfErr, err)
	}
	a.vf.Sink = sk.Index
	if err := a.vf.Install(a.ranges); err != nil {
		t.Fatal(err)
	}
	try("re-created sink")
	if got, err := echo(a.c.Do, "udp", client); err != nil || got != "client" {
		t.Fatalf("owned port after the sink changed: %q %v", got, err)
	}
}
