package tcfilter

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/dataplane/shaping"
	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// Sandbox IPv6 addresses (2001:db8::/32, documentation only).
var (
	host6   = net.ParseIP("2001:db8::1")
	client6 = net.ParseIP("2001:db8::2")
)

// addAddr6 gives ifindex the address ip/64 without duplicate address
// detection.
func addAddr6(t testing.TB, h *netlink.Handle, ifindex int, ip net.IP) {
	t.Helper()
	l, err := h.LinkByIndex(ifindex)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatalf("add %v: %v", ip, err)
	}
	waitLocal6(t, h, ip)
}

// waitLocal6 waits until ip is a local address of h's namespace: even
// without DAD, the kernel makes a new address usable (its local route)
// in deferred work, which a busy machine runs seconds later.
func waitLocal6(t testing.TB, h *netlink.Handle, ip net.IP) {
	t.Helper()
	var rs []netlink.Route
	var err error
	if !wait.Until(10*time.Second, func() bool {
		rs, err = h.RouteGet(ip)
		return err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL
	}) {
		t.Fatalf("%v not a local address after 10s (%v %v)", ip, rs, err)
	}
}

// newWire6 is newWire with IPv6: the host's eth0 has host6, the client's
// client6, and both demuxes have their IPv6 classifier.
func newWire6(t testing.TB) *wire {
	w := newWire(t)
	addAddr6(t, w.h, w.eth0, host6)
	w.addClientAddr6(t, client6)
	if err := w.eth0D.SetIPv6(&IPv6Demux{Addrs: []net.IP{host6}, Sink: w.sink}); err != nil {
		t.Fatal(err)
	}
	if err := w.loD.SetIPv6(&IPv6Demux{}); err != nil {
		t.Fatal(err)
	}
	return w
}

// addClientAddr6 gives the client's eth0 the IPv6 address ip (no DAD).
func (w *wire) addClientAddr6(t testing.TB, ip net.IP) {
	t.Helper()
	ch, err := w.s.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	cl, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addAddr6(t, ch, cl.Attrs().Index, ip)
}

// plumb6 is plumb with IPv6: the container's eth0 gets host6 (no DAD, no
// link-local address, no router solicitations), lo ::1, a neighbour entry
// for client6, and its filters the host's IPv6 address.
func (w *wire) plumb6(t testing.TB, name string, slot uint16, ranges ...ephemeral.Range) *ctr {
	t.Helper()
	c := w.plumb(t, name, slot, ranges...)
	if err := w.s.Host.Do(func() error {
		return sysctls(map[string]string{fmt.Sprintf("net/ipv6/conf/vc%d/disable_ipv6", slot): "1"})
	}); err != nil {
		t.Fatal(err)
	}
	ch, err := c.c.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ceth, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	clo, err := ch.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.c.Do(func() error {
		for _, kv := range [][2]string{
			{"net/ipv6/conf/eth0/addr_gen_mode", "1"},
			{"net/ipv6/conf/eth0/accept_ra", "0"},
			{"net/ipv6/conf/eth0/router_solicitations", "0"},
			{"net/ipv6/conf/all/disable_ipv6", "0"},
			{"net/ipv6/conf/eth0/disable_ipv6", "0"},
			{"net/ipv6/conf/lo/disable_ipv6", "0"},
		} {
			if err := sysctls(map[string]string{kv[0]: kv[1]}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	addAddr6(t, ch, ceth.Attrs().Index, host6)
	if err := ch.NeighSet(&netlink.Neigh{LinkIndex: ceth.Attrs().Index, Family: netlink.FAMILY_V6,
		State: netlink.NUD_PERMANENT, IP: client6, HardwareAddr: w.cmac}); err != nil {
		t.Fatal(err)
	}
	cf := ContainerFilters{H: ch, Lo: clo.Attrs().Index, Eth0: ceth.Attrs().Index, HostIP: w.s.HostIP, HostIP6: []net.IP{host6}}
	if err := cf.Install(ranges); err != nil {
		t.Fatal(err)
	}
	c.vf.HostIP6 = []net.IP{host6}
	if err := c.vf.Install(ranges); err != nil {
		t.Fatal(err)
	}
	return c
}

// serve6 starts dual-stack TCP and UDP echo servers named name on
// [::]:port for each port, in the namespace of do.
func serve6(t testing.TB, do func(func() error) error, name string, ports ...int) {
	t.Helper()
	serveOn(t, do, name, "::", ports...)
}

func TestTrafficDemuxIPv6(t *testing.T) {
	w := newWire6(t)
	a := w.plumb6(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	b := w.plumb6(t, "cb", 2, rg(33792, 34047), rg(8080, 8080))
	serve6(t, a.c.Do, "ca", 33000, 20005, 9090)
	serve6(t, b.c.Do, "cb", 33800, 8080, 9090)
	serve6(t, w.s.Host.Do, "host", 7000, 20016)
	serve6(t, w.s.Client.Do, "client", 9000)
	at := func(p int) string { return net.JoinHostPort(host6.String(), fmt.Sprint(p)) }
	lo := func(p int) string { return net.JoinHostPort("::1", fmt.Sprint(p)) }

	cases := []struct {
		from string
		do   func(func() error) error
		addr string
		want string
	}{
		{"client", w.s.Client.Do, at(20005), "ca"},                           // 16-port range (H2)
		{"client", w.s.Client.Do, at(33000), "ca"},                           // 1024-port range (H1)
		{"client", w.s.Client.Do, at(33800), "cb"},                           // 256-port range (H1)
		{"client", w.s.Client.Do, at(8080), "cb"},                            // single port (H2)
		{"client", w.s.Client.Do, at(7000), "host"},                          // nobody's port: the host
		{"client", w.s.Client.Do, at(20016), "host"},                         // next to a container range
		{"host", w.s.Host.Do, at(8080), "cb"},                                // host process -> container (lo demux)
		{"host", w.s.Host.Do, lo(20005), "ca"},                               // ... over ::1
		{"ca", a.c.Do, at(7000), "host"},                                     // container -> host process
		{"ca", a.c.Do, at(8080), "cb"},                                       // container -> container via host lo
		{"ca", a.c.Do, lo(8080), "cb"},                                       // ... via ::1
		{"ca", a.c.Do, at(20005), "ca"},                                      // container -> itself
		{"cb", b.c.Do, net.JoinHostPort(client6.String(), "9000"), "client"}, // container -> outside
	}
	for _, network := range []string{"tcp", "udp"} {
		for _, tc := range cases {
			got, err := echo(tc.do, network, tc.addr)
			if err != nil || got != tc.want {
				t.Errorf("%s %s -> %s: answered by %q (%v), want %q", network, tc.from, tc.addr, got, err, tc.want)
			}
		}
	}

	// A source port the container does not own is dropped on the veth,
	// and counted.
	before, err := a.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := echo(a.c.Do, "udp", net.JoinHostPort(client6.String(), "9000"), traffic.WithSource("[::]:40000"), traffic.WithTimeout(500*time.Millisecond)); err == nil {
		t.Error("a datagram from an unowned source port got out")
	}
	after, err := a.vf.Drops()
	if err != nil {
		t.Fatal(err)
	}
	if after[DropPort] <= before[DropPort] {
		t.Errorf("port drops %d -> %d, want a rise", before[DropPort], after[DropPort])
	}

	t.Run("fragments-to-host", func(t *testing.T) {
		// A datagram larger than the MTU leaves the client in fragments
		// (a fragment header): they are not demultiplexed, the host
		// gets them (and counts them), ca's server never sees them.
		n0, err := w.eth0D.IPv6ToHost()
		if err != nil {
			t.Fatal(err)
		}
		err = w.s.Client.Do(func() error {
			c, err := net.Dial("udp", at(20005))
			if err != nil {
				return err
			}
			defer c.Close()
			big := make([]byte, 3000)
			big[len(big)-1] = '\n'
			if _, err := c.Write(big); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := c.Read(make([]byte, 4000)); err == nil {
				return fmt.Errorf("a reply came to the fragmented datagram")
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		waitFor(t, "fragments counted", 2*time.Second, func() bool {
			n, err := w.eth0D.IPv6ToHost()
			return err == nil && n >= n0+2
		})
	})

	t.Run("fragments-from-container", func(t *testing.T) {
		// A datagram larger than the MTU from an owned port leaves the
		// container in fragments: they pass the veth (first fragment by
		// its port, later ones by destination) and the client
		// reassembles them. (Toward the host address, IPv4 and IPv6
		// alike, the container's stack sends the datagram whole over its
		// lo, whose MTU is 64 KiB, and the redirect to eth0 drops it as
		// too big: not a filter matter.)
		for _, dst := range []struct {
			name string
			do   func(func() error) error
			ip   net.IP
		}{{"client", w.s.Client.Do, client6}} {
			var l net.PacketConn
			if err := dst.do(func() error {
				var err error
				l, err = net.ListenPacket("udp", net.JoinHostPort(dst.ip.String(), "9100"))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			err := a.c.Do(func() error {
				c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv6unspecified, Port: 20007}, &net.UDPAddr{IP: dst.ip, Port: 9100})
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write(make([]byte, 3000))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			l.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, _, err := l.ReadFrom(make([]byte, 4000))
			l.Close()
			if err != nil || n != 3000 {
				t.Errorf("3000-byte datagram from ca to the %s: read %d bytes (%v)", dst.name, n, err)
			}
		}
	})

	t.Run("shared", func(t *testing.T) {
		shareBetween(t, w, a, b, at(9090))
		if err := w.eth0D.setShared(9090, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("off", func(t *testing.T) {
		// Turning the IPv6 demux off hands every IPv6 port to the host.
		if err := w.eth0D.SetIPv6(nil); err != nil {
			t.Fatal(err)
		}
		if show := w.tcShow(t, w.s.HostEth0); strings.Contains(show, "protocol ipv6") {
			t.Errorf("IPv6 classifier left on eth0:\n%s", show)
		}
		serve6(t, w.s.Host.Do, "host", 8080)
		if got, err := echo(w.s.Client.Do, "tcp", at(8080)); err != nil || got != "host" {
			t.Errorf("without the IPv6 demux, 8080 answered by %q (%v), want host", got, err)
		}
		if err := w.eth0D.SetIPv6(&IPv6Demux{Addrs: []net.IP{host6}, Sink: w.sink}); err != nil {
			t.Fatal(err)
		}
		if got, err := echo(w.s.Client.Do, "tcp", at(8080)); err != nil || got != "cb" {
			t.Errorf("with the IPv6 demux back, 8080 answered by %q (%v), want cb", got, err)
		}
	})
}

// TestShaperIPv6Paths: a container with an egress limit reaches every
// IPv6 destination through its shaper pair (the exit forwards IPv6 as
// the veth would have), and the shaper counts it.
func TestShaperIPv6Paths(t *testing.T) {
	w := newWire6(t)
	a := w.plumb6(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	serve6(t, w.s.Host.Do, "host", 7000)
	serve6(t, w.s.Client.Do, "client", 9000)
	serve6(t, a.c.Do, "ca", 20005)
	hostNS, err := netns.GetFromPath(w.s.Host.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer hostNS.Close()
	entry, exit := w.shaperPair(t, 1)
	sh := shaping.Shaper{H: w.h, NS: int(hostNS), Link: entry, Leaf: shaping.LeafFIFO}
	if err := sh.Apply(rate.Limit{Rate: 50_000_000}); err != nil {
		t.Fatal(err)
	}
	if err := (ShaperExit{H: w.h, Dev: exit, Eth0: w.eth0, Lo: w.lo, HostIP: w.s.HostIP, HostIP6: []net.IP{host6}, Slot: 1}).Install(); err != nil {
		t.Fatal(err)
	}
	vf := a.vf
	vf.Via = entry
	if err := vf.Retarget(a.ranges); err != nil {
		t.Fatal(err)
	}
	at := func(ip string, p int) string { return net.JoinHostPort(ip, fmt.Sprint(p)) }
	for _, network := range []string{"tcp", "udp"} {
		for _, c := range []struct{ addr, want string }{
			{at(host6.String(), 7000), "host"},
			{at("::1", 7000), "host"},
			{at(host6.String(), 20005), "ca"},
			{at(client6.String(), 9000), "client"},
		} {
			if got, err := echo(a.c.Do, network, c.addr); err != nil || got != c.want {
				t.Errorf("limited container -> %s %s: %q, %v; want %s", network, c.addr, got, err, c.want)
			}
		}
	}
	if st, _ := sh.Read(); st.Packets == 0 {
		t.Errorf("shaper counters %+v: want packets", st)
	}
}

// BenchmarkRoundTripIPv6 times UDP request/response round trips from the
// client to a container through the host demux (one datagram each way:
// the eth0 demux, the veth's rule), over IPv4 and IPv6, with the
// container alone and with 1000 other containers' ranges present: the
// per-packet cost of the IPv6 path and whether it grows with N.
func BenchmarkRoundTripIPv6(b *testing.B) {
	w := newWire6(b)
	a := w.plumb6(b, "ca", 1, rg(20000, 20015))
	serveOn(b, a.c.Do, "ca", "::", 20005)
	rr := func(b *testing.B, ip net.IP) {
		var c net.Conn
		if err := w.s.Client.Do(func() error {
			var err error
			c, err = net.Dial("udp", net.JoinHostPort(ip.String(), "20005"))
			return err
		}); err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, 64)
		msg := []byte("x\n")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Read(buf); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rr/s")
	}
	for _, others := range []int{0, 1000} {
		for i := 2; i <= others+1 && others > 0; i++ {
			lo := uint16(32768 + (i-2)*32)
			if err := w.eth0D.AddRanges(uint16(i), a.veth, []ephemeral.Range{rg(lo, lo+31)}); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("others=%d/ipv4", others), func(b *testing.B) { rr(b, w.s.HostIP) })
		b.Run(fmt.Sprintf("others=%d/ipv6", others), func(b *testing.B) { rr(b, host6) })
	}
}
