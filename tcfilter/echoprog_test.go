package tcfilter

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/isolatord/isolatord/tcfilter/bpfprog"
)

// Verdicts of the programs on crafted frames, run in the kernel
// (BPF_PROG_TEST_RUN) without a device: the checks of the echo programs,
// one by one, and the drop count program's.

const tcActRedirect = 7

// ipv4Frame is Ethernet, an IPv4 header (IHL 5) from src to dst with IP id
// id and flags/offset frag, and payload.
func ipv4Frame(src, dst net.IP, proto uint8, id, frag uint16, payload []byte) []byte {
	f := make([]byte, 14+20, 14+20+len(payload))
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(ip[4:], id)
	binary.BigEndian.PutUint16(ip[6:], frag)
	copy(ip[12:], src.To4())
	copy(ip[16:], dst.To4())
	return append(f, payload...)
}

// icmpEcho is the first 8 bytes of an ICMP (or ICMPv6) message.
func icmpEcho(typ uint8, id uint16) []byte {
	b := make([]byte, 8)
	b[0] = typ
	binary.BigEndian.PutUint16(b[4:], id)
	return b
}

// run runs p on frame and returns its verdict.
func run(t *testing.T, p *ebpf.Program, frame []byte) int32 {
	t.Helper()
	v, err := p.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatal(err)
	}
	return int32(v)
}

func echoKey4(id uint16, peer net.IP) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint16(k, id)
	copy(k[4:], peer.To4())
	return k
}

func TestEchoProgramVerdicts(t *testing.T) {
	if err := BPFAvailable(); err != nil {
		t.Skipf("no cls_bpf: %v", err)
	}
	host, peer, other := net.IPv4(198, 18, 0, 1), net.IPv4(198, 18, 0, 2), net.IPv4(198, 18, 0, 3)
	e, err := newEchoSteer(host, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	own := func(id uint16, owner uint32) {
		t.Helper()
		v := bpfprog.EchoEchoEntry{Owner: owner, Last: monotonicNow()}
		if err := e.echo.Update(echoKey4(id, peer), v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	own(1, 7) // a container's, veth 7
	own(2, 0) // the host's
	reply := func(id uint16) []byte { return icmpEcho(0, id) }
	// an ICMP error from other about a request from the host to peer
	errorAbout := func(typ, quotedType uint8, id uint16) []byte {
		quoted := ipv4Frame(host, peer, 1, 9, 0, icmpEcho(quotedType, id))[14:]
		return append(icmpEcho(typ, 0), quoted...)
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		want  int32
	}{
		{"a container's reply", ipv4Frame(peer, host, 1, 1, 0, reply(1)), tcActRedirect},
		{"the host's reply", ipv4Frame(peer, host, 1, 1, 0, reply(2)), tcActOK},
		{"a reply nobody learned", ipv4Frame(peer, host, 1, 1, 0, reply(3)), tcActUnspec},
		{"a reply from another peer", ipv4Frame(other, host, 1, 1, 0, reply(1)), tcActUnspec},
		{"a reply to another address", ipv4Frame(peer, other, 1, 1, 0, reply(1)), tcActUnspec},
		{"a request", ipv4Frame(peer, host, 1, 1, 0, icmpEcho(8, 1)), tcActUnspec},
		{"UDP", ipv4Frame(peer, host, 17, 1, 0, reply(1)), tcActUnspec},
		{"IP options", func() []byte { f := ipv4Frame(peer, host, 1, 1, 0, reply(1)); f[14] = 0x46; return f }(), tcActUnspec},
		{"too short", ipv4Frame(peer, host, 1, 1, 0, reply(1))[:41], tcActUnspec},
		{"unreachable about a container's request", ipv4Frame(other, host, 1, 1, 0, errorAbout(3, 8, 1)), tcActRedirect},
		{"time exceeded about the host's request", ipv4Frame(other, host, 1, 1, 0, errorAbout(11, 8, 2)), tcActOK},
		{"unreachable about a reply", ipv4Frame(other, host, 1, 1, 0, errorAbout(3, 0, 1)), tcActUnspec},
		{"redirect about a container's request", ipv4Frame(other, host, 1, 1, 0, errorAbout(5, 8, 1)), tcActUnspec},
		{"a later fragment of an unknown datagram", ipv4Frame(peer, host, 1, 77, 10, []byte("fragment")), tcActUnspec},
	} {
		if got := run(t, e.steer, tc.frame); got != tc.want {
			t.Errorf("steer, %s: verdict %d, want %d", tc.name, got, tc.want)
		}
	}

	// a fragmented reply: the first fragment (MF) records where it went,
	// the later ones follow it
	if got := run(t, e.steer, ipv4Frame(peer, host, 1, 55, 0x2000, reply(1))); got != tcActRedirect {
		t.Fatalf("steer, a first fragment: verdict %d", got)
	}
	var to uint32
	fk := append(append([]byte{}, peer.To4()...), 0, 55, 0, 0)
	if err := e.frag.Lookup(fk, &to); err != nil || to != 7 {
		t.Fatalf("fragment entry: %d %v, want 7", to, err)
	}
	if got := run(t, e.steer, ipv4Frame(peer, host, 1, 55, 1, []byte("fragment"))); got != tcActRedirect {
		t.Errorf("steer, a later fragment: verdict %d, want the first's redirect", got)
	}
	if got := run(t, e.steer, ipv4Frame(peer, host, 1, 56, 0, reply(1))); got != tcActRedirect {
		t.Fatal("steer, an unfragmented reply")
	}
	if err := e.frag.Lookup(append(append([]byte{}, peer.To4()...), 0, 56, 0, 0), &to); err == nil {
		t.Error("an unfragmented reply recorded a fragment entry")
	}

	// learn: the host's own requests (skb_iif 0 in a test run) are
	// learned as the host's and take a container's live entry
	for _, id := range []uint16{1, 3} {
		if got := run(t, e.learn, ipv4Frame(host, peer, 1, 1, 0, icmpEcho(8, id))); got != tcActUnspec {
			t.Errorf("learn, the host's request %d: verdict %d", id, got)
		}
		var v bpfprog.EchoEchoEntry
		if err := e.echo.Lookup(echoKey4(id, peer), &v); err != nil || v.Owner != 0 {
			t.Errorf("learn, the host's request %d: entry %+v %v, want the host's", id, v, err)
		}
	}
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"a reply", ipv4Frame(host, peer, 1, 1, 0, icmpEcho(0, 4))},
		{"a later fragment", ipv4Frame(host, peer, 1, 1, 1, icmpEcho(8, 4))},
		{"UDP", ipv4Frame(host, peer, 17, 1, 0, icmpEcho(8, 4))},
	} {
		run(t, e.learn, tc.frame)
		var v bpfprog.EchoEchoEntry
		if err := e.echo.Lookup(echoKey4(4, peer), &v); err == nil {
			t.Errorf("learn, %s: learned %+v", tc.name, v)
		}
	}
}

// ipv6Frame is Ethernet, an IPv6 header from src to dst with next header
// next, and payload.
func ipv6Frame(src, dst net.IP, next uint8, payload []byte) []byte {
	f := make([]byte, 14+40, 14+40+len(payload))
	binary.BigEndian.PutUint16(f[12:], 0x86dd)
	ip := f[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(payload)))
	ip[6], ip[7] = next, 64
	copy(ip[8:], src.To16())
	copy(ip[24:], dst.To16())
	return append(f, payload...)
}

func TestEcho6ProgramVerdicts(t *testing.T) {
	if err := BPFAvailable(); err != nil {
		t.Skipf("no cls_bpf: %v", err)
	}
	e4, err := newEchoSteer(net.IPv4(198, 18, 0, 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e4.close()
	e, err := newEcho6Steer(e4.origin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	host, peer := net.ParseIP("2001:db8::1"), net.ParseIP("2001:db8::2")
	key := func(id uint16) []byte {
		k := make([]byte, 20)
		binary.BigEndian.PutUint16(k, id)
		copy(k[4:], peer)
		return k
	}
	for id, owner := range map[uint16]uint32{1: 7, 2: 0} {
		if err := e.m.Update(key(id), bpfprog.Echo6EchoEntry{Owner: owner, Last: monotonicNow()}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	errorAbout := func(typ, quotedType uint8, id uint16) []byte {
		return append(icmpEcho(typ, 0), ipv6Frame(host, peer, 58, icmpEcho(quotedType, id))[14:]...)
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		want  int32
	}{
		{"a container's reply", ipv6Frame(peer, host, 58, icmpEcho(129, 1)), tcActRedirect},
		{"the host's reply", ipv6Frame(peer, host, 58, icmpEcho(129, 2)), tcActOK},
		{"a reply nobody learned", ipv6Frame(peer, host, 58, icmpEcho(129, 3)), tcActUnspec},
		{"a request", ipv6Frame(peer, host, 58, icmpEcho(128, 1)), tcActUnspec},
		{"behind an extension header", ipv6Frame(peer, host, 60, icmpEcho(129, 1)), tcActUnspec},
		{"unreachable about a container's request", ipv6Frame(peer, host, 58, errorAbout(1, 128, 1)), tcActRedirect},
		{"packet too big about the host's request", ipv6Frame(peer, host, 58, errorAbout(2, 128, 2)), tcActOK},
		{"unreachable about a reply", ipv6Frame(peer, host, 58, errorAbout(1, 129, 1)), tcActUnspec},
		{"a neighbour solicitation", ipv6Frame(peer, host, 58, icmpEcho(135, 1)), tcActUnspec},
	} {
		if got := run(t, e.steer, tc.frame); got != tc.want {
			t.Errorf("steer6, %s: verdict %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := run(t, e.learn, ipv6Frame(host, peer, 58, icmpEcho(128, 1))); got != tcActUnspec {
		t.Errorf("learn6, the host's request: verdict %d", got)
	}
	var v bpfprog.Echo6EchoEntry
	if err := e.m.Lookup(key(1), &v); err != nil || v.Owner != 0 {
		t.Errorf("learn6, the host's request: entry %+v %v, want the host's", v, err)
	}
}

func TestDropCountProgram(t *testing.T) {
	if err := BPFAvailable(); err != nil {
		t.Skipf("no cls_bpf: %v", err)
	}
	s := &DropSinks{}
	defer s.Close()
	for r := 0; r < 2; r++ {
		var o bpfprog.CountObjects
		var replace map[string]*ebpf.Map
		if s.counts != nil {
			replace = map[string]*ebpf.Map{bpfprog.CountMapIsoDrops: s.counts}
		}
		if err := loadObjects(bpfprog.LoadCount, &o, map[string]any{bpfprog.CountVarDropReason: uint32(r)}, replace); err != nil {
			t.Fatal(err)
		}
		if s.counts == nil {
			s.counts = o.IsoDrops
		} else {
			o.IsoDrops.Close()
		}
		for i := 0; i <= r; i++ {
			if got := run(t, o.IsoDropCount, ipv4Frame(net.IPv4(1, 2, 3, 4), net.IPv4(5, 6, 7, 8), 17, 0, 0, make([]byte, 8))); got != tcActShot {
				t.Errorf("count program of reason %d: verdict %d, want TC_ACT_SHOT", r, got)
			}
		}
		o.IsoDropCount.Close()
	}
	// a test run's skb_iif is 0
	m, err := s.Counts(0)
	if err != nil || m[DropReasons[0]] != 1 || m[DropReasons[1]] != 2 {
		t.Errorf("counts %v (%v), want 1 %s and 2 %s", m, err, DropReasons[0], DropReasons[1])
	}
}

// TestEchoMapSizes: the C sources size the maps as the Go side counts
// (own.h's and echo.c's constants are copies of echoown.go's and echo.go's).
func TestEchoMapSizes(t *testing.T) {
	spec, err := bpfprog.LoadEcho()
	if err != nil {
		t.Fatal(err)
	}
	spec6, err := bpfprog.LoadEcho6()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		m    *ebpf.MapSpec
		want uint32
	}{
		{spec.Maps[bpfprog.EchoMapIsoEcho], echoEntries},
		{spec6.Maps[bpfprog.Echo6MapIsoEcho6], echoEntries},
		{spec.Maps[bpfprog.EchoMapIsoEchoQuota], originMax + 1},
		{spec6.Maps[bpfprog.Echo6MapIsoEcho6Quota], originMax + 1},
		{spec.Maps[bpfprog.EchoMapIsoEchoOrigin], originMax},
		{spec.Maps[bpfprog.EchoMapIsoEchoFrag], fragEntries},
		{spec.Maps[bpfprog.EchoMapIsoDrops], dropCountEntries},
	} {
		if c.m.MaxEntries != c.want {
			t.Errorf("map %s: %d entries, want %d", c.m.Name, c.m.MaxEntries, c.want)
		}
	}
}
