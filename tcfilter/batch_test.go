package tcfilter

import (
	"errors"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/tcfilter/nlbatch"
)

// openConn opens a batch socket in the sandbox host namespace.
func (e *kernelEnv) openConn(t testing.TB) *nlbatch.Conn { return connIn(t, e.s.Host.Do) }

// connIn opens a batch socket in the namespace of do, closed when the
// test ends.
func connIn(t testing.TB, do func(func() error) error) *nlbatch.Conn {
	t.Helper()
	var c *nlbatch.Conn
	if err := do(func() (err error) { c, err = nlbatch.Open(); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestBatchFailureInMiddle sends, in one batch, a table and 200 nodes in
// it (more than one sendmsg's worth), the 131st with a redirect to a device
// that does not exist: the batch reports that node and the kernel's
// reason, every other node is in place and counted, and the device's
// handle path (no Conn) gives the same answers and the same filters.
func TestBatchFailureInMiddle(t *testing.T) {
	e := newKernelEnv(t, 2)
	c := e.openConn(t)
	const nodes, bad = 200, 130
	badHandle := MakeU32Handle(0x10, bad&0xff, 1+bad>>8)
	shows := map[string]string{}
	for i, conn := range []*nlbatch.Conn{c, nil} {
		var log opLog
		d := dev{h: e.h, ifindex: e.targets[i], label: "veth", obs: log.observe}
		b := batch{c: conn}
		b.addIngress(d)
		b.addTable(d, KindIP, PrioIP, 0x10, 256)
		for j := 0; j < nodes; j++ {
			target := e.lo
			if j == bad {
				target = 99999
			}
			b.add(d, KindIP, node{prio: PrioIP, handle: MakeU32Handle(0x10, uint32(j&0xff), uint32(1+j>>8)), classid: ClassID(7),
				sel: sel(nl.TC_U32_TERMINAL, key(0, 0xffff, uint32(j))), act: actRedirect, target: target})
		}
		res, err := b.run()
		if err == nil {
			t.Fatalf("conn %v: batch with a bad request succeeded", conn != nil)
		}
		if !strings.Contains(err.Error(), "add ip node "+FormatHandle(badHandle)) || !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENODEV) {
			t.Errorf("conn %v: error %q does not name node %s", conn != nil, err, FormatHandle(badHandle))
		}
		if len(res) != nodes+2 {
			t.Fatalf("conn %v: %d results for %d requests", conn != nil, len(res), nodes+2)
		}
		for j, r := range res {
			if (r.err != nil) != (j == bad+2) {
				t.Errorf("conn %v: request %d: %v", conn != nil, j, r.err)
			}
		}
		if n := log.count(OpAdd, ResultOK); n != nodes {
			t.Errorf("conn %v: %d adds counted ok, want %d (table and %d nodes)", conn != nil, n, nodes, nodes-1)
		}
		if n := log.count(OpAdd, ResultError); n != 1 {
			t.Errorf("conn %v: %d adds counted failed, want 1", conn != nil, n)
		}
		show := e.tcShow(t, "tgt"+string(rune('0'+i)))
		hs := handles(show)
		if len(hs) != nodes-1 || strings.Contains(show, "fh "+FormatHandle(badHandle)+" ") {
			t.Fatalf("conn %v: %d nodes in place, want %d without %s", conn != nil, len(hs), nodes-1, FormatHandle(badHandle))
		}
		shows[string(rune('0'+i))] = show
	}
	if shows["0"] != shows["1"] {
		t.Errorf("batch and one-by-one installs differ:\n%s\n---\n%s", shows["0"], shows["1"])
	}
	if conn := c; conn != nil {
		// the socket is still in step: a second batch on it works
		d := dev{h: e.h, ifindex: e.targets[0], label: "veth"}
		b := batch{c: conn}
		b.del(d, KindIP, PrioIP, badHandle, true)
		b.del(d, KindIP, PrioIP, MakeU32Handle(0x10, 0, 1), false)
		res, err := b.run()
		if err != nil || res[0].raw == nil || !errors.Is(res[0].raw, unix.ENOENT) {
			t.Fatalf("second batch: %v %+v", err, res)
		}
	}
}

// normalize drops what differs between two devices' identical filters:
// device names, action indexes and program ids.
var showNoise = regexp.MustCompile(`(\sindex \d+|\sid \d+|\stag [0-9a-f]+|tgt\d+p?)`)

// TestBatchInstallSameAsOneByOne installs the veth and container filters
// (IPv4 and IPv6) through a Conn and through the handle only, on two
// devices each: what the kernel holds is the same.
func TestBatchInstallSameAsOneByOne(t *testing.T) {
	e := newKernelEnv(t, 4)
	c := e.openConn(t)
	host6 := []net.IP{net.ParseIP("2001:db8:5::1"), net.ParseIP("fe80::1")}
	rs := []ephemeral.Range{rg(32768, 33791), rg(8080, 8080), rg(9000, 9001)}
	var shows [2]string
	for i, conn := range []*nlbatch.Conn{c, nil} {
		v := VethFilters{H: e.h, Veth: e.targets[i], Eth0: e.eth0, Lo: e.lo, Sinks: e.sinks, VLAN: true, HostIP: e.s.HostIP,
			HostIP6: host6, MAC: e.s.HostMAC, Slot: 42, New: true, C: conn}
		if err := v.Install(rs); err != nil {
			t.Fatalf("conn %v: %v", conn != nil, err)
		}
		dev := "tgt" + string(rune('0'+i))
		shows[i] = showNoise.ReplaceAllString(e.tcShow(t, dev), "")
		if len(handles(shows[i])) < 100 {
			t.Fatalf("conn %v: only %d nodes on the veth", conn != nil, len(handles(shows[i])))
		}
	}
	if shows[0] != shows[1] {
		t.Errorf("veth filters differ:\n%s\n---\n%s", shows[0], shows[1])
	}
	for i, conn := range []*nlbatch.Conn{c, nil} {
		lo, eth := e.targets[2+i], e.index(t, "tgt"+string(rune('2'+i))+"p")
		cf := ContainerFilters{H: e.h, Lo: lo, Eth0: eth, HostIP: e.s.HostIP, HostIP6: host6, C: conn}
		if err := cf.Install(rs); err != nil {
			t.Fatalf("conn %v: %v", conn != nil, err)
		}
		if err := cf.Install(rs); err != nil { // re-run: from a dump
			t.Fatalf("conn %v: re-run: %v", conn != nil, err)
		}
		shows[i] = showNoise.ReplaceAllString(e.tcShow(t, "tgt"+string(rune('2'+i)))+e.tcShow(t, "tgt"+string(rune('2'+i))+"p"), "")
	}
	if shows[0] != shows[1] {
		t.Errorf("container filters differ:\n%s\n---\n%s", shows[0], shows[1])
	}
}
