package dataplane

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// ipv6UDP is an IPv6 packet carrying a UDP datagram (no checksum).
func ipv6UDP(src, dst net.IP, sport, dport uint16, m []byte) []byte {
	l4 := udp(sport, dport, m)
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(l4)))
	h[6] = unix.IPPROTO_UDP
	h[7] = 64
	copy(h[8:], src.To16())
	copy(h[24:], dst.To16())
	return append(h, l4...)
}

// ingressDrops is the drop count of the ingress qdisc of host link idx.
func ingressDrops(t *testing.T, h *netlink.Handle, idx int) uint32 {
	t.Helper()
	qs, err := h.QdiscList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: idx}})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if a := q.Attrs(); a.Parent == netlink.HANDLE_INGRESS && a.Statistics != nil && a.Statistics.Queue != nil {
			return a.Statistics.Queue.Drops
		}
	}
	return 0
}

// TestTornDownTenantSendsNothing: a hostile root tenant still alive in its
// namespace after its Teardown returns (its eth0 stays until the retired
// veth is deleted in the background) gets nothing onto the host side, to
// another container or to the client, whatever it sends with a packet
// socket: its former ports, any source port, ARP in the host's name, ICMP,
// IPv6, or an ordinary socket. The mute filter drops and counts it all.
// A container set up at once on its ports and slot gets their traffic.
func TestTornDownTenantSendsNothing(t *testing.T) {
	checkRootUnchanged(t)
	x := newAttackBed(t)
	hostEth0 := traffic.StartCapture(t, x.e.sb.Host.Do, x.e.sb.HostEth0, "host eth0")
	hm := x.hostMAC
	l, err := x.e.d.h.LinkByName(plane.VethName(x.a.c.ID))
	if err != nil {
		t.Fatal(err)
	}
	vethA := l.Attrs().Index

	// Control: before the teardown a raw frame of A's own port gets out.
	m0 := newMarker(t, "before")
	if err := x.raw.Send(x.udpFrame(x.clientMAC, x.hostIP, bedOwnPort, x.clientIP, bedClientPort, m0, ipOpts{})); err != nil {
		t.Fatal(err)
	}
	if !x.client.WaitFor(m0, 5*time.Second) || !hostEth0.WaitFor(m0, 5*time.Second) {
		t.Fatal("a legitimate raw frame did not reach the client through host eth0: the test would prove nothing")
	}

	// The retired veth is kept while the tenant attacks through it.
	x.e.d.retired.held.Add(1)
	var once sync.Once
	release := func() { once.Do(func() { x.e.d.retired.held.Add(-1); x.e.d.retired.kick() }) }
	defer release()
	if _, err := x.e.d.Teardown(context.Background(), x.a.c); err != nil {
		t.Fatal(err)
	}
	// Not deleted yet: the tenant's eth0 is there, and so is the veth,
	// up, retired and muted.
	l, err = x.e.d.h.LinkByIndex(vethA)
	if err != nil {
		t.Fatalf("the retired veth is deleted while held: %v", err)
	}
	if !isRetired(l.Attrs()) {
		t.Fatalf("veth %s after its teardown: group %#x, want %#x", l.Attrs().Name, l.Attrs().Group, RetiredGroup)
	}
	if muted, err := tcfilter.Muted(x.e.d.h, vethA); err != nil || !muted {
		t.Fatalf("retired veth not muted: %v %v", muted, err)
	}
	before := ingressDrops(t, x.e.d.h, vethA)

	m := newMarker(t, "torndown")
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	quoted := ipv4(x.clientIP, x.hostIP, unix.IPPROTO_UDP, udp(5555, bedOwnPort, m), ipOpts{})
	frames := [][]byte{
		// its former port, to the client, the host and B
		x.udpFrame(x.clientMAC, x.hostIP, bedOwnPort, x.clientIP, bedClientPort, m, ipOpts{}),
		x.udpFrame(hm, x.hostIP, bedOwnPort, x.hostIP, bedHostPort, m, ipOpts{}),
		x.udpFrame(hm, x.hostIP, bedOwnPort, x.hostIP, bedBPort, m, ipOpts{}),
		// any source port, any source address
		x.udpFrame(x.clientMAC, x.hostIP, 12345, x.clientIP, bedClientPort, m, ipOpts{}),
		x.udpFrame(x.clientMAC, x.ip77, bedOwnPort, x.clientIP, bedClientPort, m, ipOpts{}),
		eth(x.clientMAC, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_TCP, tcpSyn(bedOwnPort, bedClientPort, m), ipOpts{})),
		// ARP in the host's name, and a reply claiming the host IP
		eth(bcast, hm, unix.ETH_P_ARP, arpBody(1, hm, x.hostIP, make(net.HardwareAddr, 6), x.clientIP), m),
		eth(x.clientMAC, hm, unix.ETH_P_ARP, arpBody(2, hm, x.hostIP, x.clientMAC, x.clientIP), m),
		// ICMP: an echo request, an error about its former port
		eth(x.clientMAC, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(8, 0, append([]byte{0, 1, 0, 1}, m...)), ipOpts{})),
		eth(x.clientMAC, hm, unix.ETH_P_IP, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_ICMP, icmpMsg(3, 3, append(make([]byte, 4), quoted...)), ipOpts{})),
		// IPv6
		eth(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, hm, unix.ETH_P_IPV6, ipv6UDP(net.ParseIP("fe80::1"), net.ParseIP("ff02::1"), bedOwnPort, bedClientPort, m)),
		eth(x.clientMAC, hm, unix.ETH_P_IPV6, ipv6UDP(net.ParseIP("2001:db8::1"), net.ParseIP("2001:db8::2"), bedOwnPort, bedClientPort, m)),
		// another ethertype, a VLAN tag
		eth(x.clientMAC, hm, 0x88cc, m),
		eth(x.clientMAC, hm, unix.ETH_P_8021Q, []byte{0, 1, 0x08, 0x00}, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_UDP, udp(bedOwnPort, bedClientPort, m), ipOpts{})),
		// priority-tagged (VLAN 0, priority 7), and 802.1ad over 802.1Q
		eth(x.clientMAC, hm, unix.ETH_P_8021Q, []byte{0xe0, 0, 0x08, 0x00}, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_UDP, udp(bedOwnPort, bedClientPort, m), ipOpts{})),
		eth(x.clientMAC, hm, unix.ETH_P_8021AD, []byte{0, 5, 0x81, 0x00, 0, 6, 0x08, 0x00}, ipv4(x.hostIP, x.clientIP, unix.IPPROTO_UDP, udp(bedOwnPort, bedClientPort, m), ipOpts{})),
	}
	for i, f := range frames {
		if err := x.raw.Send(f); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	// And through its stack, with ordinary sockets (its routes are still
	// there).
	for _, d := range []string{clientAddr(bedClientPort), hostAddr(bedHostPort), hostAddr(bedBPort)} {
		x.sendUDP(t, nil, d, m)
	}
	sent := uint32(len(frames) + 3)

	// Every frame was dropped by the mute filter, and counted.
	var now uint32
	wait.Until(5*time.Second, func() bool { now = ingressDrops(t, x.e.d.h, vethA); return now-before >= sent })
	if now-before < sent {
		state := "gone"
		if l, err := x.e.d.h.LinkByIndex(vethA); err == nil {
			state = fmt.Sprintf("flags %v group %#x", l.Attrs().Flags, l.Attrs().Group)
		}
		t.Errorf("the retired veth's ingress counted %d drops, want at least %d (veth %s)", now-before, sent, state)
	}

	// A container set up at once on A's ports and slot gets their traffic
	// (and, through B, a canary shows the captures work).
	c := x.e.start("C", 1, "40960-41983", "31000-31009", "", bedOwnPort)
	// (TCP first: its retransmissions cover C's first neighbour
	// resolution, which a lone datagram's answer may wait for on a loaded
	// machine)
	mustEcho(t, x.e.sb.Client, "tcp", hostAddr(bedOwnPort), "C", traffic.WithTimeout(5*time.Second))
	mustEcho(t, x.e.sb.Client, "udp", hostAddr(bedOwnPort), "C")
	// A still serves 31001, now C's port: it is never answered by A.
	notAnsweredBy(t, x.e.sb.Client, hostAddr(bedOwnPort+1), "A")
	notAnsweredBy(t, x.e.sb.Host, hostAddr(bedOwnPort+1), "A")
	canary := newMarker(t, "canaryB")
	err = x.b.proc.Do(func() error {
		for _, d := range []string{clientAddr(bedClientPort), hostAddr(bedHostPort)} {
			conn, err := net.Dial("udp4", d)
			if err != nil {
				return err
			}
			_, err = conn.Write(canary)
			conn.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, cp := range []*traffic.Capture{x.client, hostEth0, x.hostLo} {
		if !cp.WaitFor(canary, 5*time.Second) {
			t.Fatalf("B's canary never reached %s", cp.Name)
		}
	}
	for _, cp := range []*traffic.Capture{x.client, hostEth0, x.hostLo, x.inB} {
		if n := cp.Count(m); n > 0 {
			t.Errorf("%d frame(s) of the torn-down tenant reached %s", n, cp.Name)
		}
	}
	if n := x.hostUDP.count(m); n > 0 {
		t.Errorf("%d datagram(s) of the torn-down tenant reached a host socket", n)
	}
	release()
	if _, err := x.e.d.Teardown(context.Background(), c.c); err != nil {
		t.Fatal(err)
	}
	x.e.waitNoRetired(x.e.d)
}
