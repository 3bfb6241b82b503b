package tcfilter

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/ephemeral/spread"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// wire is a sandbox whose host namespace runs the host demux on eth0 and lo,
// with containers plumbed by hand the way the data plane does it (veth with
// the host's MAC, container eth0 with the host's IP and MAC, lo with the
// host's MAC), so that the filters can be tested with real traffic.
type wire struct {
	*kernelEnv
	mac   net.HardwareAddr
	cmac  net.HardwareAddr // the client's eth0 MAC (containers' neighbour entry)
	eth0D *HostDemux
	loD   *HostDemux
	// loopPorts are the veths' loopback ports (as the data plane's
	// default: every port from 1024)
	loopPorts []ephemeral.Range
}

type ctr struct {
	vf     VethFilters
	name   string
	c      *sandbox.Container
	slot   uint16
	veth   int
	ranges []ephemeral.Range
}

func newWire(t testing.TB) *wire {
	e := newKernelEnv(t, 0)
	w := &wire{kernelEnv: e, mac: e.s.HostMAC, loopPorts: ephemeral.Split(ephemeral.MustParseSet("1024-65535"))}
	lo, err := e.h.LinkByIndex(e.lo)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.h.LinkSetHardwareAddr(lo, w.mac); err != nil {
		t.Fatalf("host lo MAC: %v", err)
	}
	if err := e.s.Host.Do(func() error {
		return sysctls(map[string]string{"net/ipv4/conf/lo/route_localnet": "1", "net/ipv4/conf/all/accept_local": "1"})
	}); err != nil {
		t.Fatal(err)
	}
	ch, err := e.s.Client.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	cl, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	w.cmac = cl.Attrs().HardwareAddr
	w.eth0D = NewHostDemux(e.h, e.eth0, "eth0", e.s.HostIP, nil)
	t.Cleanup(w.eth0D.ReleaseEcho) // the echo maps and their sweepers
	w.loD = NewHostDemux(e.h, e.lo, "lo", nil, nil)
	hc := e.openConn(t)
	w.eth0D.SetConn(hc)
	w.loD.SetConn(hc)
	for _, d := range []*HostDemux{w.eth0D, w.loD} {
		if err := d.Init(); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func sysctls(kv map[string]string) error {
	for k, v := range kv {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	return nil
}

// plumb builds a container: a namespace, a veth (host end "vc<slot>"), the
// container's addresses and sysctls, and all filters for ranges (ranges[0]
// is its ip_local_port_range).
func (w *wire) plumb(t testing.TB, name string, slot uint16, ranges ...ephemeral.Range) *ctr {
	t.Helper()
	c := w.s.StartContainer(t, name)
	fd, err := netns.GetFromPath(c.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	vname := fmt.Sprintf("vc%d", slot)
	if err := w.h.LinkAdd(&netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: vname, HardwareAddr: w.mac},
		PeerName:  "eth0", PeerHardwareAddr: w.mac, PeerNamespace: netlink.NsFd(int(fd)),
	}); err != nil {
		t.Fatalf("veth %s: %v", vname, err)
	}
	veth := w.index(t, vname)
	vl, _ := w.h.LinkByIndex(veth)
	if err := w.h.LinkSetUp(vl); err != nil {
		t.Fatal(err)
	}
	ch, err := c.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch.Close)
	clo, err := ch.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	ceth, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	must(ch.LinkSetHardwareAddr(clo, w.mac))
	must(ch.LinkSetUp(clo))
	must(ch.AddrAdd(ceth, &netlink.Addr{IPNet: &net.IPNet{IP: w.s.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}}))
	must(ch.LinkSetUp(ceth))
	must(ch.RouteAdd(&netlink.Route{LinkIndex: ceth.Attrs().Index, Gw: w.s.ClientIP}))
	// No ARP reaches a container: the data plane writes its neighbours
	// (package neighsync); here the one it needs is written by hand.
	must(ch.NeighSet(&netlink.Neigh{LinkIndex: ceth.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: w.s.ClientIP, HardwareAddr: w.cmac}))
	must(c.Do(func() error {
		return sysctls(map[string]string{
			"net/ipv4/ip_local_port_range":       fmt.Sprintf("%d %d", ranges[0].Begin, ranges[0].End),
			"net/ipv4/conf/eth0/accept_local":    "1",
			"net/ipv4/conf/lo/accept_local":      "1",
			"net/ipv4/conf/lo/route_localnet":    "1",
			"net/ipv4/conf/all/route_localnet":   "1",
			"net/ipv6/conf/all/disable_ipv6":     "1",
			"net/ipv4/icmp_echo_ignore_all":      "0", // the filters alone must prevent duplicate echo replies
			"net/ipv4/conf/eth0/rp_filter":       "0",
			"net/ipv4/conf/all/rp_filter":        "0",
			"net/ipv4/conf/default/accept_local": "1",
		})
	}))
	// as the data plane does: batches, the veth's from a new device
	must(ContainerFilters{H: ch, C: connIn(t, c.Do), Lo: clo.Attrs().Index, Eth0: ceth.Attrs().Index, HostIP: w.s.HostIP}.Install(ranges))
	vf := VethFilters{H: w.h, C: connIn(t, w.s.Host.Do), Veth: veth, Eth0: w.eth0, Lo: w.lo, Sinks: w.sinks, VLAN: true,
		HostIP: w.s.HostIP, MAC: w.mac, Slot: slot, New: true, LoopPorts: w.loopPorts}
	must(vf.Install(ranges))
	vf.New = false
	must(w.eth0D.AddRanges(slot, veth, ranges))
	must(w.loD.AddRanges(slot, veth, ranges))
	must(w.eth0D.AddFanout(slot, veth))
	must(w.eth0D.SetEchoOrigin(veth, veth))
	return &ctr{vf: vf, name: name, c: c, slot: slot, veth: veth, ranges: ranges}
}

// serve starts TCP and UDP echo servers named name on 0.0.0.0:port for
// each port, in the namespace of do.
func serve(t *testing.T, do func(func() error) error, name string, ports ...int) {
	t.Helper()
	serveOn(t, do, name, "0.0.0.0", ports...)
}

// serveOn is serve on address ip (IPv4 or IPv6).
func serveOn(t testing.TB, do func(func() error) error, name, ip string, ports ...int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := do(func() error {
		for _, p := range ports {
			addr := net.JoinHostPort(ip, fmt.Sprint(p))
			ts, err := traffic.ServeTCP(ctx, addr, name, traffic.WithReusePort())
			if err != nil {
				return err
			}
			t.Cleanup(func() { ts.Close() })
			us, err := traffic.ServeUDP(ctx, addr, name, traffic.WithReusePort())
			if err != nil {
				return err
			}
			t.Cleanup(func() { us.Close() })
		}
		return nil
	}); err != nil {
		t.Fatalf("serve %s: %v", name, err)
	}
}

// echo sends one request from the namespace of do and returns the name of
// the server that answered.
func echo(do func(func() error) error, network, addr string, opts ...traffic.Option) (string, error) {
	var reply string
	err := do(func() error {
		var err error
		reply, err = traffic.Echo(context.Background(), network, addr, "hi", append(opts, traffic.WithTimeout(3*time.Second))...)
		return err
	})
	return traffic.ReplyName(reply), err
}

func TestTrafficDemux(t *testing.T) {
	w := newWire(t)
	a := w.plumb(t, "ca", 1, rg(32768, 33791), rg(20000, 20015))
	b := w.plumb(t, "cb", 2, rg(33792, 34047), rg(8080, 8080))
	serve(t, a.c.Do, "ca", 33000, 20005, 9090)
	serve(t, b.c.Do, "cb", 33800, 8080, 9090)
	serve(t, w.s.Host.Do, "host", 7000, 20016)
	serve(t, w.s.Client.Do, "client", 9000)
	hostIP := w.s.HostIP.String()
	at := func(p int) string { return net.JoinHostPort(hostIP, fmt.Sprint(p)) }

	cases := []struct {
		from string
		do   func(func() error) error
		addr string
		want string
	}{
		{"client", w.s.Client.Do, at(20005), "ca"},   // 16-port range (H2)
		{"client", w.s.Client.Do, at(33000), "ca"},   // 1024-port range (H1)
		{"client", w.s.Client.Do, at(33800), "cb"},   // 256-port range (H1)
		{"client", w.s.Client.Do, at(8080), "cb"},    // single port (H2)
		{"client", w.s.Client.Do, at(7000), "host"},  // nobody's port: the host
		{"client", w.s.Client.Do, at(20016), "host"}, // next to a container range
		{"host", w.s.Host.Do, at(8080), "cb"},        // host process -> container (lo demux)
		{"host", w.s.Host.Do, "127.0.0.1:20005", "ca"},
		{"ca", a.c.Do, at(7000), "host"},                                          // container -> host process
		{"ca", a.c.Do, at(8080), "cb"},                                            // container -> container via host lo
		{"ca", a.c.Do, "127.0.0.1:8080", "cb"},                                    // ... via 127.0.0.1
		{"ca", a.c.Do, at(20005), "ca"},                                           // container -> itself
		{"cb", b.c.Do, net.JoinHostPort(w.s.ClientIP.String(), "9000"), "client"}, // container -> outside
	}
	for _, network := range []string{"tcp", "udp"} {
		for _, tc := range cases {
			got, err := echo(tc.do, network, tc.addr)
			if err != nil || got != tc.want {
				t.Errorf("%s %s -> %s: answered by %q (%v), want %q", network, tc.from, tc.addr, got, err, tc.want)
			}
		}
	}

	// A source port the container does not own is dropped on the veth.
	if _, err := echo(a.c.Do, "udp", net.JoinHostPort(w.s.ClientIP.String(), "9000"), traffic.WithSource("0.0.0.0:40000")); err == nil {
		t.Error("a datagram from an unowned source port got out")
	}

	// Removing a range hands its ports back to the host.
	if _, err := w.eth0D.DelRanges(2, []ephemeral.Range{rg(8080, 8080)}); err != nil {
		t.Fatal(err)
	}
	serve(t, w.s.Host.Do, "host", 8080)
	if got, err := echo(w.s.Client.Do, "tcp", at(8080)); err != nil || got != "host" {
		t.Errorf("after DelRanges, 8080 answered by %q (%v), want host", got, err)
	}
	if err := w.eth0D.AddRanges(2, b.veth, []ephemeral.Range{rg(8080, 8080)}); err != nil {
		t.Fatal(err)
	}
	if got, err := echo(w.s.Client.Do, "tcp", at(8080)); err != nil || got != "cb" {
		t.Errorf("after AddRanges, 8080 answered by %q (%v), want cb", got, err)
	}

	t.Run("ip-options", func(t *testing.T) {
		probe := serveOptsProbe(t, a.c.Do, "ca-probe", 20006)
		for _, tc := range []struct {
			port int
			want string
		}{{20005, "ca"}, {33000, "ca"}, {8080, "cb"}, {7000, "host"}, {20006, "ca-probe"}} {
			for _, network := range []string{"tcp", "udp"} {
				if tc.port == 20006 && network == "tcp" {
					continue
				}
				got, err := echoWithIPOptions(w, network, at(tc.port))
				if err != nil || got != tc.want {
					t.Errorf("%s with IP options -> %d: answered by %q (%v), want %q", network, tc.port, got, err, tc.want)
				}
			}
		}
		if got := probe.lastOpts(); string(got) != string(nops) {
			t.Errorf("the container received IP options %x, want %x", got, nops)
		}
	})

	t.Run("ping", func(t *testing.T) {
		// The outside pings the host: only the host answers (the echo
		// request never reaches a container).
		var res traffic.PingResult
		if err := w.s.Client.Do(func() error {
			var err error
			res, err = traffic.PingStats(context.Background(), w.s.HostIP, 3, time.Second)
			return err
		}); err != nil || !res.ExactlyOnce() {
			t.Errorf("client -> host ping: %+v (%v), want exactly one reply each", res, err)
		}
		// A container pings the outside: the echo reply is fanned out to
		// every container (and the host); the pinger gets it once.
		if err := a.c.Do(func() error {
			var err error
			res, err = traffic.PingStats(context.Background(), w.s.ClientIP, 3, time.Second)
			return err
		}); err != nil || !res.ExactlyOnce() {
			t.Errorf("container -> client ping: %+v (%v), want exactly one reply each", res, err)
		}
	})

	t.Run("shared", func(t *testing.T) {
		shareBetween(t, w, a, b, at(9090))
		// the same source port always lands on the same holder
		first := ""
		for i := 0; i < 5; i++ {
			got, err := echo(w.s.Client.Do, "udp", at(9090), traffic.WithSource("0.0.0.0:45678"))
			if err != nil {
				t.Fatal(err)
			}
			if first == "" {
				first = got
			} else if got != first {
				t.Errorf("source port 45678 went to %s then %s", first, got)
			}
		}
		if err := w.eth0D.setShared(9090, []spread.Holder{{Slot: b.slot, Target: b.veth}}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 10; i++ {
			if got, err := echo(w.s.Client.Do, "tcp", at(9090)); err != nil || got != "cb" {
				t.Fatalf("shared port with one holder answered by %q (%v)", got, err)
			}
		}
		if err := w.eth0D.setShared(9090, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// shareBetween makes port 9090 shared by a and b (holders may send from
// it) and checks that 40 TCP connections from the client to addr are
// answered by both containers and nobody else.
func shareBetween(t *testing.T, w *wire, a, b *ctr, addr string) {
	t.Helper()
	for _, c := range []*ctr{a, b} {
		if err := c.vf.SetRanges(c.ranges, append(c.ranges, rg(9090, 9090))); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.eth0D.setShared(9090, []spread.Holder{{Slot: a.slot, Target: a.veth}, {Slot: b.slot, Target: b.veth}}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for i := 0; i < 40; i++ {
		got, err := echo(w.s.Client.Do, "tcp", addr)
		if err != nil {
			t.Fatalf("shared port connection %d: %v", i, err)
		}
		seen[got]++
	}
	if seen["ca"] == 0 || seen["cb"] == 0 || seen["ca"]+seen["cb"] != 40 {
		t.Errorf("shared port answered by %v, want both containers", seen)
	}
}

// nops are 4 IP NOP options: they make IHL 6, so every L4 offset moves.
var nops = []byte{1, 1, 1, 1}

// echoWithIPOptions sends one request with IP options from the client
// namespace and returns the name of the server that answered. It checks
// that the socket really carries the options.
func echoWithIPOptions(w *wire, network, addr string) (string, error) {
	var reply string
	err := w.s.Client.Do(func() error {
		d := net.Dialer{Timeout: 3 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IP, unix.IP_OPTIONS, string(nops))
			}); err != nil {
				return err
			}
			return serr
		}}
		c, err := d.Dial(network, addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		var opts []byte
		rc, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			return err
		}
		rc.Control(func(fd uintptr) { opts, err = getsockoptBytes(int(fd), unix.IPPROTO_IP, unix.IP_OPTIONS, 40) })
		if err != nil || len(opts) != len(nops) {
			return fmt.Errorf("socket IP options %x (%v), want %x", opts, err, nops)
		}
		if _, err := c.Write([]byte("hi\n")); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		reply = strings.TrimSpace(string(buf[:n]))
		return nil
	})
	return traffic.ReplyName(reply), err
}

func getsockoptBytes(fd, level, opt, size int) ([]byte, error) {
	buf := make([]byte, size)
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return nil, e
	}
	return buf[:l], nil
}

// optsProbe is a UDP echo server that records the IP options of the last
// datagram it received (IP_RECVOPTS), to prove that packets with options
// really reached it.
type optsProbe struct {
	mu   sync.Mutex
	last []byte
}

func (p *optsProbe) lastOpts() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

func serveOptsProbe(t *testing.T, do func(func() error) error, name string, port int) *optsProbe {
	t.Helper()
	p := &optsProbe{}
	var conn *net.UDPConn
	if err := do(func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		if err != nil {
			return err
		}
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVOPTS, 1) })
		conn = c
		return serr
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf, oob := make([]byte, 1500), make([]byte, 256)
		for {
			n, oobn, _, from, err := conn.ReadMsgUDP(buf, oob)
			if err != nil {
				return
			}
			var opts []byte
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					// Linux reports received options as IP_RECVOPTS
					if m.Header.Level == unix.IPPROTO_IP && (m.Header.Type == unix.IP_RECVOPTS || m.Header.Type == unix.IP_OPTIONS) {
						opts = append([]byte(nil), m.Data...)
					}
				}
			}
			p.mu.Lock()
			p.last = opts
			p.mu.Unlock()
			conn.WriteToUDP([]byte(name+" "+strings.TrimSpace(string(buf[:n]))+"\n"), from)
		}
	}()
	return p
}
