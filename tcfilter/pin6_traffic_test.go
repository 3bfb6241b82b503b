package tcfilter

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestTrafficDrainPinIPv6: the pins of a draining holder match IPv6
// clients by address and port (the source address read 32..17 bytes
// behind the L4 header): A's live IPv6 connection keeps reaching A, a new
// connection from another client address with the same source port and
// one from the same address with another port reach B, as does one from
// the source port of an IPv4 client's pin; a restarted demux reads the
// pins back.
func TestTrafficDrainPinIPv6(t *testing.T) {
	w := newWire6(t)
	const port = 9393
	a := w.plumb6(t, "ca", 1, rg(32768, 33023))
	b := w.plumb6(t, "cb", 2, rg(33024, 33279))
	other6 := net.ParseIP("2001:db8::77")
	w.addClientAddr6(t, other6)
	for _, x := range []*ctr{a, b} {
		if err := x.vf.SetRanges(x.ranges, append(x.ranges, rg(port, port))); err != nil {
			t.Fatal(err)
		}
		serve6(t, x.c.Do, x.name, port)
		xh, err := x.c.Netlink()
		if err != nil {
			t.Fatal(err)
		}
		ceth, err := xh.LinkByName("eth0")
		if err == nil {
			err = xh.NeighSet(&netlink.Neigh{LinkIndex: ceth.Attrs().Index, Family: netlink.FAMILY_V6,
				State: netlink.NUD_PERMANENT, IP: other6, HardwareAddr: w.cmac})
		}
		xh.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	ha, hb := spread.Holder{Slot: a.slot, Target: a.veth}, spread.Holder{Slot: b.slot, Target: b.veth}
	if err := w.eth0D.setShared(port, []spread.Holder{ha}); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(host6.String(), fmt.Sprint(port))
	const src = 50002
	var c net.Conn
	if err := w.s.Client.Do(func() (err error) {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: client6, Port: src},
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
				return serr
			}}
		c, err = d.Dial("tcp6", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	live := &liveConn{src: src, c: c, r: bufio.NewReader(c)}
	if got, err := live.ask("hello"); err != nil || got != "ca" {
		t.Fatalf("IPv6 connection before the drain answered by %q (%v)", got, err)
	}

	cur, _ := w.eth0D.Spread(port)
	mine := netip.AddrPortFrom(netip.MustParseAddr(client6.String()), src)
	v4 := netip.AddrPortFrom(netip.MustParseAddr(w.s.ClientIP.String()), src+2) // an IPv4 pin of the same table
	flows := func(slot uint16) ([]spread.Flow, bool) {
		if slot == a.slot {
			return []spread.Flow{mine, v4}, true
		}
		return nil, true
	}
	plan, err := spread.PlanFacts(port, []spread.Holder{ha, hb}, &cur, spread.Facts{Flows: flows, Draining: map[uint16]bool{a.slot: true}})
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := plan.Pins[mine]; !ok || h != ha || plan.Pins[v4] != ha {
		t.Fatalf("plan pins %v, want %s to A", plan.Pins, mine)
	}
	if err := w.eth0D.SetSpread(port, plan); err != nil {
		t.Fatal(err)
	}
	newConn := func(ip net.IP, p int) (string, error) {
		var reply string
		err := w.s.Client.Do(func() (err error) {
			reply, err = traffic.Echo(context.Background(), "tcp", addr, "x",
				traffic.WithSource(net.JoinHostPort(ip.String(), fmt.Sprint(p))), traffic.WithTimeout(3*time.Second))
			return err
		})
		return traffic.ReplyName(reply), err
	}
	if got, err := newConn(other6, src); err != nil || got != "cb" {
		t.Errorf("new IPv6 connection from [%s]:%d (A's pinned port) answered by %q (%v), want cb", other6, src, got, err)
	}
	if got, err := newConn(client6, src+512); err != nil || got != "cb" {
		t.Errorf("new IPv6 connection from the pinned client's other port answered by %q (%v), want cb", got, err)
	}
	if got, err := newConn(client6, src+2); err != nil || got != "cb" {
		t.Errorf("new IPv6 connection from the port of an IPv4 pin answered by %q (%v), want cb", got, err)
	}
	if got, err := live.ask("again"); err != nil || got != "ca" {
		t.Errorf("A's pinned IPv6 connection answered by %q (%v) while A drains", got, err)
	}

	again := NewHostDemux(w.h, w.eth0, "eth0", w.s.HostIP, nil)
	if err := again.Init(); err != nil {
		t.Fatal(err)
	}
	if got, ok := again.Spread(port); !ok || !got.Equal(&plan) {
		t.Fatalf("restarted demux: shared %v, pins %v; want %v", ok, got.Pins, plan.Pins)
	}
}
