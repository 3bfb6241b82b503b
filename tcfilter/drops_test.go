package tcfilter

import (
	"maps"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

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

// TestInstallUpgradesOldLayout: Install (what a restarted daemon's Adopt
// runs) brings a veth of the previous layout (ARP at priority 1, a default
// "stop" node that handed unmatched packets to the veth's stack) to the
// current one, and the container keeps working.
func TestInstallUpgradesOldLayout(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	serve(t, w.s.Client.Do, "client", 9000)
	d := a.vf.dev()
	// back to the old shape: no VLAN check, ARP at priority 1, a stop node
	if err := w.h.FilterDel(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
		LinkIndex: a.veth, Parent: netlink.HANDLE_MIN_INGRESS, Priority: PrioVethVLAN, Protocol: unix.ETH_P_ALL, Handle: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := d.delPrio(KindARP, PrioVethARP); err != nil {
		t.Fatal(err)
	}
	if err := d.add(KindARP, node{prio: PrioARP, handle: 1, classid: ClassID(1), sel: sel(nl.TC_U32_TERMINAL), act: actRedirect, target: w.eth0}); err != nil {
		t.Fatal(err)
	}
	if err := d.add(KindIP, node{prio: PrioIP, handle: 8, classid: ClassStop, sel: sel(nl.TC_U32_TERMINAL, firstFragKey())}); err != nil {
		t.Fatal(err)
	}
	// layout 2: the catch-all at priority 4 (where IPv6 goes now)
	if err := d.delPrio(KindIP, PrioVethOther); err != nil {
		t.Fatal(err)
	}
	catchAll := d.build(a.vf.drop(node{prio: PrioIP6, handle: 2, sel: sel(0)}, DropEthertype))
	catchAll.Protocol = unix.ETH_P_ALL
	if err := w.h.FilterAdd(catchAll); err != nil {
		t.Fatal(err)
	}
	rootNode8 := regexp.MustCompile(`fh 8[0-9a-f]{2}::8 `)
	old := w.tcShow(t, "vc1")
	if !strings.Contains(old, "protocol arp pref 1 u32") || !rootNode8.MatchString(old) || !strings.Contains(old, "protocol all pref 4 u32") {
		t.Fatalf("old layout not built:\n%s", old)
	}
	if err := a.vf.Install(a.ranges); err != nil {
		t.Fatal(err)
	}
	now := w.tcShow(t, "vc1")
	for _, s := range []string{"protocol all pref 1 bpf", "direct-action", "protocol arp pref 3 u32", "protocol all pref 5 u32"} {
		if !strings.Contains(now, s) {
			t.Errorf("upgraded veth lacks %q", s)
		}
	}
	if strings.Contains(now, "protocol arp pref 1") || rootNode8.MatchString(now) || strings.Contains(now, "pref 4") {
		t.Errorf("old nodes left:\n%s", now)
	}
	client := net.JoinHostPort(w.s.ClientIP.String(), "9000")
	if got, err := echo(a.c.Do, "udp", client); err != nil || got != "client" {
		t.Fatalf("owned port after the upgrade: %q %v", got, err)
	}
	before, _ := a.vf.Drops()
	if _, err := echo(a.c.Do, "udp", client, traffic.WithSource("0.0.0.0:40000")); err == nil {
		t.Fatal("unowned port got out after the upgrade")
	}
	if after, _ := a.vf.Drops(); after[DropPort] <= before[DropPort] {
		t.Errorf("port drops %d -> %d", before[DropPort], after[DropPort])
	}
}
