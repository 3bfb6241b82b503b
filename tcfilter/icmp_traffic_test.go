package tcfilter

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// icmpIn reads one ICMP input counter in the namespace of do.
func icmpIn(t *testing.T, do func(func() error) error, name string) int64 {
	t.Helper()
	var v int64
	if err := do(func() error {
		c, err := traffic.ICMPCounters()
		v = c[name]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// waitFor polls cond until it holds or the deadline passes (test/wait).
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	wait.For(t, d, what, cond)
}

// TestICMPErrorsSteered: an ICMP error to the host IP quoting a flow of
// container A (its source port) reaches A and nobody else; one quoting a
// port nobody owns stays with the host; an echo reply whose identifier is
// in A's ports reaches A only. Each check ends with a marker message to
// every other namespace, sent after the probe on the same path, so "nobody
// else" is read once the probe would have arrived.
func TestICMPErrorsSteered(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	b := w.plumb(t, "cb", 2, rg(33792, 34815))
	var snd *traffic.ICMPSender
	if err := w.s.Client.Do(func() (err error) { snd, err = traffic.OpenICMPSender(); return err }); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	host, client := w.s.HostIP, w.s.ClientIP
	type ns struct {
		name string
		do   func(func() error) error
	}
	all := []ns{{"ca", a.c.Do}, {"cb", b.c.Do}, {"host", w.s.Host.Do}}
	// marker: a time-exceeded quoting a UDP flow of the namespace.
	marker := map[string]uint16{"ca": 33001, "cb": 34001, "host": 50001}

	for _, tc := range []struct {
		what  string
		msg   []byte
		count string
		want  string
	}{
		{"frag-needed quoting A's UDP", traffic.ICMPError(3, 4, 1300, unix.IPPROTO_UDP, host, 33000, client, 9000), "InDestUnreachs", "ca"},
		{"frag-needed quoting A's TCP", traffic.ICMPError(3, 4, 1300, unix.IPPROTO_TCP, host, 32768, client, 80), "InDestUnreachs", "ca"},
		{"port unreachable quoting B's UDP", traffic.ICMPError(3, 3, 0, unix.IPPROTO_UDP, host, 34815, client, 53), "InDestUnreachs", "cb"},
		{"frag-needed quoting the host's own flow", traffic.ICMPError(3, 4, 1300, unix.IPPROTO_TCP, host, 50000, client, 80), "InDestUnreachs", "host"},
		{"echo reply with A's identifier", traffic.EchoReply(33333, 1), "InEchoReps", "ca"},
	} {
		before := map[string]int64{}
		for _, n := range all {
			before[n.name] = icmpIn(t, n.do, tc.count)
		}
		if err := snd.Send(host, tc.msg); err != nil {
			t.Fatal(err)
		}
		var target ns
		for _, n := range all {
			if n.name == tc.want {
				target = n
			}
		}
		waitFor(t, tc.what+" at "+tc.want, 5*time.Second, func() bool {
			return icmpIn(t, target.do, tc.count) == before[tc.want]+1
		})
		for _, n := range all {
			if n.name == tc.want {
				continue
			}
			mb := icmpIn(t, n.do, "InTimeExcds")
			if err := snd.Send(host, traffic.ICMPError(11, 0, 0, unix.IPPROTO_UDP, host, marker[n.name], client, 9000)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "marker at "+n.name, 5*time.Second, func() bool { return icmpIn(t, n.do, "InTimeExcds") >= mb+1 })
			if got := icmpIn(t, n.do, tc.count) - before[n.name]; got != 0 {
				t.Errorf("%s: %s got %d copies, want none (only %s)", tc.what, n.name, got, tc.want)
			}
		}
	}
}

// TestARPStaysWithHost: ARP requests from the LAN, for another address or
// for the host's, and ARP replies to the host reach no container; the host
// answers requests for its own address.
func TestARPStaysWithHost(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	b := w.plumb(t, "cb", 2, rg(33792, 34815))
	var seen [2]atomic.Int64
	for i, c := range []*ctr{a, b} {
		fd := -1
		if err := c.c.Do(func() (err error) {
			fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
		done := make(chan struct{})
		t.Cleanup(func() { close(done); unix.Close(fd) })
		go func() {
			buf := make([]byte, 128)
			for {
				select {
				case <-done:
					return
				default:
				}
				_, from, err := unix.Recvfrom(fd, buf, 0)
				if ll, ok := from.(*unix.SockaddrLinklayer); err == nil && ok && ll.Pkttype != unix.PACKET_OUTGOING {
					seen[i].Add(1)
				}
			}
		}()
	}
	var snd *traffic.FrameSender
	if err := w.s.Client.Do(func() (err error) { snd, err = traffic.OpenFrameSender("eth0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	other := net.IPv4(198, 18, 0, 77)
	frames := [][]byte{
		traffic.ARPFrame(traffic.Broadcast, w.cmac, traffic.ARPRequest, w.s.ClientIP, nil, other),
		traffic.ARPFrame(traffic.Broadcast, w.cmac, traffic.ARPRequest, w.s.ClientIP, nil, w.s.HostIP),
		traffic.ARPFrame(w.mac, w.cmac, traffic.ARPReply, w.s.ClientIP, w.mac, w.s.HostIP),
	}
	hostARPIn := func() int64 {
		var n int64
		w.s.Host.Do(func() error {
			l, err := netlink.LinkByName("eth0")
			if err == nil {
				n = int64(l.Attrs().Statistics.RxPackets)
			}
			return err
		})
		return n
	}
	rx := hostARPIn()
	for i := 0; i < 20; i++ {
		for _, f := range frames {
			if err := snd.Send(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, "60 frames at the host", 5*time.Second, func() bool { return hostARPIn()-rx >= 60 })
	// a marker that does reach container A (an echo reply with its
	// identifier) went the same way after the ARP frames
	var isnd *traffic.ICMPSender
	if err := w.s.Client.Do(func() (err error) { isnd, err = traffic.OpenICMPSender(); return err }); err != nil {
		t.Fatal(err)
	}
	defer isnd.Close()
	before := icmpIn(t, a.c.Do, "InEchoReps")
	isnd.Send(w.s.HostIP, traffic.EchoReply(33000, 1))
	waitFor(t, "marker at ca", 5*time.Second, func() bool { return icmpIn(t, a.c.Do, "InEchoReps") > before })
	for i := range seen {
		if n := seen[i].Load(); n != 0 {
			t.Errorf("container %d saw %d ARP frames, want none", i+1, n)
		}
	}
	// the host answered the requests for its address
	ch, err := w.s.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ns, _ := ch.NeighList(0, netlink.FAMILY_V4)
	found := false
	for _, n := range ns {
		found = found || n.IP.Equal(w.s.HostIP) && n.HardwareAddr.String() == w.mac.String()
	}
	if !found {
		t.Logf("client neighbours: %v (the host's answer may not create an entry: requests were not the client kernel's)", ns)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestPMTUFromContainer: container A talks to a server behind a router
// (the client namespace) whose next link has MTU 1300. The router's
// frag-needed, addressed to the shared host IP, must reach A (and only A)
// for the transfer to complete.
func TestPMTUFromContainer(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	b := w.plumb(t, "cb", 2, rg(33792, 34815))
	far := w.s.StartContainer(t, "far")
	if err := w.s.LinkContainerToClient(far, "198.18.5.1/24", "198.18.5.2/24"); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		do   func() (*netlink.Handle, error)
		name string
	}{{w.s.Client.Netlink, fmt.Sprintf("ct%d", far.Pid)}} {
		// only the router's side: far advertises an MSS for 1500, so A
		// sends full-size segments and learns the path MTU from the
		// router's frag-needed
		h, err := x.do()
		if err != nil {
			t.Fatal(err)
		}
		l, err := h.LinkByName(x.name)
		if err == nil {
			err = h.LinkSetMTU(l, 1300)
		}
		h.Close()
		if err != nil {
			t.Fatalf("mtu of %s: %v", x.name, err)
		}
	}
	if err := w.s.Client.SetSysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	// far: count what arrives, answer the count
	var ln net.Listener
	if err := far.Do(func() (err error) { ln, err = net.Listen("tcp4", "0.0.0.0:7070"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				fmt.Fprintf(c, "%d", n)
			}()
		}
	}()
	beforeB := icmpIn(t, b.c.Do, "InDestUnreachs")
	beforeA := icmpIn(t, a.c.Do, "InDestUnreachs")
	const size = 256 << 10
	var got string
	err := a.c.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp4", "198.18.5.2:7070")
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Write(make([]byte, size)); err != nil {
			return err
		}
		c.(*net.TCPConn).CloseWrite()
		r, err := io.ReadAll(c)
		got = string(r)
		return err
	})
	if err != nil || got != fmt.Sprint(size) {
		t.Fatalf("transfer through the 1300-byte link: %q, %v", got, err)
	}
	if n := icmpIn(t, a.c.Do, "InDestUnreachs") - beforeA; n < 1 {
		t.Errorf("A received %d frag-needed", n)
	}
	if n := icmpIn(t, b.c.Do, "InDestUnreachs") - beforeB; n != 0 {
		t.Errorf("B received %d destination-unreachable messages meant for A", n)
	}
	ch, err := a.c.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	rs, err := ch.RouteGet(net.IPv4(198, 18, 5, 2))
	if err == nil && len(rs) > 0 && rs[0].MTU != 0 && rs[0].MTU != 1300 {
		t.Errorf("A's path MTU to the far server is %d, want 1300", rs[0].MTU)
	}
}

// TestEchoRepliesLearned: a container's ping (raw socket, random
// identifier, in none of its ports) gets its replies exactly once, and no
// other container sees them: eth0 egress learned {identifier, peer}.
func TestEchoRepliesLearned(t *testing.T) {
	w := newWire(t)
	if err := w.eth0D.EchoSteering(); err != nil {
		t.Skipf("echo replies are not steered by learning here: %v", err)
	}
	a := w.plumb(t, "ca", 1, rg(32768, 33791))
	b := w.plumb(t, "cb", 2, rg(33792, 34815))
	beforeB := icmpIn(t, b.c.Do, "InEchoReps")
	var res traffic.PingResult
	if err := a.c.Do(func() (err error) {
		res, err = traffic.PingStats(context.Background(), w.s.ClientIP, 3, 2*time.Second)
		return err
	}); err != nil || !res.ExactlyOnce() {
		t.Fatalf("A's ping of the client: %+v (%v), want exactly one reply each", res, err)
	}
	// an echo request with a known identifier is learned for A's veth
	var asnd *traffic.ICMPSender
	if err := a.c.Do(func() (err error) { asnd, err = traffic.OpenICMPSender(); return err }); err != nil {
		t.Fatal(err)
	}
	defer asnd.Close()
	if err := asnd.Send(w.s.ClientIP, traffic.EchoRequest(4242, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "identifier 4242 learned", 5*time.Second, func() bool { return w.eth0D.echoLearned(4242, w.s.ClientIP) == a.veth })
	// a restarted daemon's demux takes over the programs and what they learned
	d2 := NewHostDemux(w.h, w.eth0, "eth0", w.s.HostIP, nil)
	if err := d2.Init(); err != nil {
		t.Fatal(err)
	}
	if got := d2.echoLearned(4242, w.s.ClientIP); got != a.veth {
		t.Errorf("the second demux's echo map has %d for identifier 4242, want %d", got, a.veth)
	}
	if err := d2.EchoSteering(); err != nil || progID(d2.echo.steer) != progID(w.eth0D.echo.steer) ||
		progID(d2.echo.learn) != progID(w.eth0D.echo.learn) {
		t.Errorf("a second demux did not take over the echo programs: %v", err)
	}
	if err := a.c.Do(func() (err error) {
		res, err = traffic.PingStats(context.Background(), w.s.ClientIP, 2, 2*time.Second)
		return err
	}); err != nil || !res.ExactlyOnce() {
		t.Fatalf("A's ping after the takeover: %+v (%v)", res, err)
	}
	// a fragmented echo reply: its other fragments follow the first to A
	if err := w.eth0D.EchoSteering(); err == nil {
		reasm := func(do func(func() error) error) int64 {
			var v int64
			do(func() error {
				c, err := traffic.SNMPCounters("Ip:")
				v = c["ReasmReqds"]
				return err
			})
			return v
		}
		ra, rb := reasm(a.c.Do), reasm(b.c.Do)
		if err := asnd.Send(w.s.ClientIP, traffic.EchoRequestSized(4343, 1, 3000)); err != nil {
			t.Fatal(err)
		}
		if m, err := asnd.WaitEchoReply(4343, time.Now().Add(3*time.Second)); err != nil || len(m) != 8+3000 {
			t.Errorf("A's 3000-byte echo reply: %d bytes, %v", len(m), err)
		}
		if reasm(a.c.Do) <= ra || reasm(b.c.Do) != rb {
			t.Errorf("fragments reassembled: A %d, B %d; want some at A, none at B", reasm(a.c.Do)-ra, reasm(b.c.Do)-rb)
		}
	}
	// the host's own ping is not learned and gets its replies
	if err := w.s.Host.Do(func() (err error) {
		res, err = traffic.PingStats(context.Background(), w.s.ClientIP, 2, 2*time.Second)
		return err
	}); err != nil || !res.ExactlyOnce() {
		t.Fatalf("host's ping of the client: %+v (%v)", res, err)
	}
	// ... whatever its identifier: one in A's ports (the u32 demux's rule for
	// echo replies) or one learned for A (a raw pinger's random identifier,
	// or the ping socket rover shared by all namespaces, can draw either)
	var hsnd *traffic.ICMPSender
	if err := w.s.Host.Do(func() (err error) { hsnd, err = traffic.OpenICMPSender(); return err }); err != nil {
		t.Fatal(err)
	}
	defer hsnd.Close()
	beforeA := icmpIn(t, a.c.Do, "InEchoReps")
	for _, id := range []uint16{33000, 4242} {
		if err := hsnd.Send(w.s.ClientIP, traffic.EchoRequest(id, 7)); err != nil {
			t.Fatal(err)
		}
		if _, err := hsnd.WaitEchoReply(id, time.Now().Add(3*time.Second)); err != nil {
			t.Errorf("the host's echo request with identifier %d (A's): no reply at the host: %v", id, err)
		}
		if got := w.eth0D.echoLearned(id, w.s.ClientIP); got != 0 {
			t.Errorf("the host's echo request with identifier %d was learned for veth %d", id, got)
		}
	}
	if n := icmpIn(t, a.c.Do, "InEchoReps") - beforeA; n != 0 {
		t.Errorf("A received %d echo replies to the host's requests", n)
	}
	var snd *traffic.ICMPSender
	if err := w.s.Client.Do(func() (err error) { snd, err = traffic.OpenICMPSender(); return err }); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	snd.Send(w.s.HostIP, traffic.EchoReply(34000, 1)) // marker: B's identifier
	waitFor(t, "marker at cb", 5*time.Second, func() bool { return icmpIn(t, b.c.Do, "InEchoReps") >= beforeB+1 })
	if n := icmpIn(t, b.c.Do, "InEchoReps") - beforeB; n != 1 {
		t.Errorf("B received %d echo replies, want only the marker", n)
	}
}
