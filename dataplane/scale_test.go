package dataplane

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/vishvananda/netlink"
)

// nsPath names an anonymous namespace through our open descriptor.
func nsPath(ns *nshandle.NS) string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), ns.Fd()) }

// fleetSpec is container i of a fleet: slot first+i, a 16-port ephemeral
// block from 32768 and one static port from 20000 (room for 1,500).
func fleetSpec(id string, ns *nshandle.NS, slot uint16, i int) plane.Container {
	b := uint16(32768 + 16*i)
	return plane.Container{
		ID: id, Slot: slot, NetNS: nsPath(ns),
		Ephemeral: ephemeral.Range{Begin: b, End: b + 15},
		Ports:     ephemeral.NewSet(ephemeral.Range{Begin: uint16(20000 + i), End: uint16(20000 + i)}),
	}
}

// fleetRanges are the host demux ranges of fleet container i.
func fleetRanges(i int) []ephemeral.Range {
	b := uint16(32768 + 16*i)
	return exclusiveRanges(ephemeral.Range{Begin: b, End: b + 15}, ephemeral.MustParseSet(fmt.Sprint(20000+i)))
}

// addFleet plumbs n containers in anonymous namespaces (no processes),
// numbered from index first, and registers their teardown.
func (e *env) addFleet(first, n int) []plane.Container {
	e.t.Helper()
	var cs []plane.Container
	for i := first; i < first+n; i++ {
		ns, err := nshandle.New()
		if err != nil {
			e.t.Fatal(err)
		}
		c := fleetSpec(e.uniqueID(fmt.Sprintf("f%d", i)), ns, uint16(i+1), i)
		if _, err := e.d.Setup(context.Background(), c); err != nil {
			ns.Close()
			e.t.Fatalf("fleet container %d: %v", i, err)
		}
		// The bind mount keeps the namespace; the descriptor can go.
		ns.Close()
		c.NetNS = "" // the descriptor path is gone; the mount remains
		e.cleanupMount(c.ID)
		d := e.d
		e.t.Cleanup(func() { d.Teardown(context.Background(), c) })
		cs = append(cs, c)
	}
	return cs
}

// TestFortyContainersGetARP: 40 containers each resolve the client's MAC
// from scratch (their neighbour caches flushed): no ARP frame reaches a
// container; each asks the daemon (app_solicit), which writes the host's
// entry into it (package neighsync). The client's ping of the host IP
// still gets exactly one reply.
func TestFortyContainersGetARP(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	serveIn(t, e.sb.Client, clientAddr(9000), "client")
	const n = 40
	cs := make([]ctr, n)
	for i := range cs {
		b := 32768 + 256*i
		name := fmt.Sprintf("C%d", i)
		cs[i] = e.start(name, uint16(i+1), fmt.Sprintf("%d-%d", b, b+255), fmt.Sprint(30000+i), "", uint16(30000+i))
	}
	for _, c := range cs {
		h, err := c.proc.Netlink()
		if err != nil {
			t.Fatal(err)
		}
		eth, err := h.LinkByName(ContainerEth0)
		if err != nil {
			t.Fatal(err)
		}
		ns, _ := h.NeighList(eth.Attrs().Index, netlink.FAMILY_V4)
		for _, nb := range ns {
			h.NeighDel(&nb)
		}
		h.Close()
	}
	for _, c := range cs {
		mustEcho(t, c.proc, "udp", clientAddr(9000), "client")
	}
	if st := e.d.NeighStats(); st.Pushed < n {
		t.Errorf("neighbour sync wrote %d entries for %d containers: %+v", st.Pushed, n, st)
	}
	// Every container now has the client in its neighbour table.
	for _, c := range cs {
		h, _ := c.proc.Netlink()
		eth, _ := h.LinkByName(ContainerEth0)
		ns, _ := h.NeighList(eth.Attrs().Index, netlink.FAMILY_V4)
		h.Close()
		found := false
		for _, nb := range ns {
			if nb.IP.Equal(e.sb.ClientIP) && nb.HardwareAddr != nil {
				found = true
			}
		}
		if !found {
			t.Errorf("%s has no neighbour entry for the client: %v", c.c.ID, ns)
		}
	}
	// And the outside reaches each of them.
	for i, c := range cs {
		mustEcho(t, e.sb.Client, "tcp", hostAddr(30000+i), fmt.Sprintf("C%d", i))
		_ = c
	}
	var res traffic.PingResult
	err := e.sb.Client.Do(func() (err error) {
		res, err = traffic.PingStats(context.Background(), e.sb.HostIP, 3, time.Second)
		return err
	})
	if err != nil || !res.ExactlyOnce() {
		t.Errorf("client ping of the host with %d containers: %+v %v", n, res, err)
		out, _ := e.sb.Host.Command("tc", "-s", "filter", "show", "dev", "eth0", "ingress").CombinedOutput()
		t.Logf("host eth0 filters:\n%s", out)
	}
}

// TestThousandContainersFiltersRestore adds the host demux entries of 1,000
// containers (two ranges on eth0 and lo each, ARP and ICMP fan-out, and
// every 16th container holding one of 10 shared ports) and removes them again: the host's filter set is back to where it
// started, byte for byte (action indexes aside).
func TestThousandContainersFiltersRestore(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t) // both families' fragments below
	before := e.hostFilters()

	// A real device to point the redirects at.
	h, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "isotgt0"}, PeerName: "isotgt1"}); err != nil {
		t.Fatal(err)
	}
	tgt, err := h.LinkByName("isotgt0")
	if err != nil {
		t.Fatal(err)
	}
	target := tgt.Attrs().Index

	const n = 1000
	start := time.Now()
	shared := map[uint16][]spread.Holder{}
	for i := 0; i < n; i++ {
		slot := uint16(i + 1)
		rs := fleetRanges(i)
		for _, dm := range e.d.demuxes() {
			if err := dm.d.AddRanges(slot, target, rs); err != nil {
				t.Fatalf("slot %d %s: %v", slot, dm.name, err)
			}
		}
		if err := e.d.eth0.AddFanout(slot, target); err != nil {
			t.Fatal(err)
		}
		if i%16 == 0 {
			port := uint16(9000 + i%10)
			shared[port] = holdersWith(shared[port], slot, target)
			want, err := spread.Assign(port, shared[port])
			if err != nil {
				t.Fatal(err)
			}
			for _, dm := range e.d.demuxes() {
				if err := dm.d.SetSpread(port, spread.Spread{Buckets: want}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	added := time.Since(start)
	es, err := e.d.eth0.Entries()
	if err != nil {
		t.Fatal(err)
	}
	if len(es) < 3*n { // ranges (2 per container) + ARP + ICMP
		t.Fatalf("only %d eth0 entries after adding %d containers", len(es), n)
	}
	// A real container among them gets its fragmented datagrams whole,
	// over IPv4 and IPv6 (fragment steering's cost does not grow with the
	// containers).
	f := e.start("F", 2000, "49152-50175", "31000-31009", "", 31000)
	for _, size := range fragSizes {
		mustEchoBig(t, e.sb.Client, "udp4", hostAddr(31000), "F", bigMsg("fleet", size))
		mustEchoBig(t, e.sb.Client, "udp6", host6Addr(e, 31000), "F", bigMsg("fleet6", size))
	}
	if _, err := e.d.Teardown(context.Background(), f.c); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for i := 0; i < n; i++ {
		slot := uint16(i + 1)
		rs := fleetRanges(i)
		for _, dm := range e.d.demuxes() {
			if miss, err := dm.d.DelRanges(slot, rs); err != nil || miss != 0 {
				t.Fatalf("slot %d %s: missing %d, %v", slot, dm.name, miss, err)
			}
		}
		if miss, err := e.d.eth0.DelFanout(slot); err != nil || miss != 0 {
			t.Fatalf("fan-out %d: %d %v", slot, miss, err)
		}
	}
	for port := range shared {
		for _, dm := range e.d.demuxes() {
			if err := dm.d.Unshare(port); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("1,000 containers' host filters: added in %v, removed in %v", added, time.Since(start))
	if after := e.hostFilters(); after != before {
		t.Errorf("host filters differ after adding and removing 1,000 containers:\n%s", lineDiff(before, after))
	}
	if strings.Contains(e.tcShow("eth0"), "isotgt0") {
		t.Error("a redirect to the target survived")
	}
}
