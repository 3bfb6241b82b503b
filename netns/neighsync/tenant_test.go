package neighsync

import (
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// TestTenantFloodDelaysNoOne: a hostile tenant (root in its namespace)
// churns neighbour entries as fast as it can on links of its own (links of its own asking user space for neighbours) and on
// its eth0 (entries added and deleted, and requests for many addresses
// nobody has, its retrans_time lowered). Meanwhile another container's
// requests keep being answered promptly: each resolution of the client's
// MAC (its entry deleted, a datagram to the client, until the entry is
// back) stays within a bound of what it took before the flood. The flood
// reaches neither socket (no drop, no resync, with receive buffers a
// flood would fill in milliseconds), and the tenant's requests beyond its
// budget are counted and not served.
func TestTenantFloodDelaysNoOne(t *testing.T) {
	b, bb := rcvBuf, budgetBurst
	t.Cleanup(func() { rcvBuf, budgetBurst = b, bb }) // after the Syncer's Close
	// a flood that reached a socket would overflow it in milliseconds;
	// the victim may ask as often as the test needs
	rcvBuf, budgetBurst = 256<<10, time.Hour
	sb := sandbox.New(t)
	s, _, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V4)
	addr := net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}
	victim, hv := askingContainer(t, sb, s, "victim", addr, sb.ClientIP)
	waitFor(t, s, "the client's MAC in the victim", func() bool { return hasPermanent(hv, sb.ClientIP, clientMAC) })
	tenant, ht := servedContainer(t, sb, s, "tenant", addr)
	s.mu.Lock()
	s.ctrs["tenant"].budget.left = 0 // no burst: it asks beyond its rate at once
	s.mu.Unlock()
	hns := mustOpenNS(t, sb.Host.Path)
	drops := func() (d uint64) {
		for _, k := range netlinkSockets(t, hns) {
			if k.proto == unix.NETLINK_ROUTE && k.groups != 0 {
				d += k.drops
			}
		}
		return d
	}

	ve, err := hv.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	// resolve is one resolution of the client's MAC by the victim.
	resolve := func() time.Duration {
		if err := hv.NeighDel(&netlink.Neigh{LinkIndex: ve.Attrs().Index, Family: netlink.FAMILY_V4, IP: sb.ClientIP}); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		askFrom(t, victim, sb.ClientIP)
		if !wait.Until(5*time.Second, func() bool { return hasPermanent(hv, sb.ClientIP, clientMAC) }) {
			t.Fatalf("the victim's request was not answered within 5 s (stats %+v)", s.Stats())
		}
		return time.Since(t0)
	}
	var quiet []time.Duration
	for range 10 {
		quiet = append(quiet, resolve())
	}
	bound := max(500*time.Millisecond, 5*slices.Max(quiet))

	fl := tenantLinks(t, tenant, ht)
	if err := sysctl.In(tenant, func(d *sysctl.Dir) error {
		return d.Write("net/ipv4/neigh/eth0/retrans_time_ms", "100")
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var ops atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(20 * time.Second)
	running := func() bool {
		select {
		case <-stop:
			return false
		default:
			return time.Now().Before(deadline) && ops.Load() < 2_000_000
		}
	}
	// entries added and deleted on a link of its own and on eth0
	for i, link := range []int{fl.entries, fl.eth0} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := tenant.Netlink()
			if err != nil {
				t.Error(err)
				return
			}
			defer h.Close()
			for n := 0; running(); n++ {
				e := &netlink.Neigh{LinkIndex: link, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
					IP: net.IPv4(198, 19, byte(i), byte(n)), HardwareAddr: net.HardwareAddr{2, 0, 0, byte(i), 0, byte(n)}}
				if err := h.NeighSet(e); err != nil {
					t.Error(err)
					return
				}
				if err := h.NeighDel(e); err != nil {
					t.Error(err)
					return
				}
				ops.Add(2)
			}
		}()
	}
	// requests: on the tenant's own ARP link and on its eth0, for
	// addresses nobody has, again and again
	base := sb.ClientIP.To4()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for running() {
			err := tenant.Do(func() error {
				for i := range 100 {
					for _, dst := range []net.IP{net.IPv4(198, 19, 200, byte(10+i)), net.IPv4(base[0], base[1], base[2], byte(100+i))} {
						u, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: dst, Port: 9})
						if err != nil {
							return err
						}
						_, _ = u.Write([]byte("x"))
						u.Close()
					}
				}
				return nil
			})
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Millisecond) // the tenant's next round: its entries have failed by then
		}
	}()
	// the flood is under way before the victim asks
	if !wait.Until(5*time.Second, func() bool { return ops.Load() > 1000 }) {
		close(stop)
		wg.Wait()
		t.Fatal("the tenant's flood did not start")
	}
	// 20 resolutions, more until the flood made 10,000 changes (a busy
	// machine, the race detector)
	var flooded []time.Duration
	for i := 0; i < 20 || i < 5000 && ops.Load() < 10_000 && time.Now().Before(deadline); i++ {
		flooded = append(flooded, resolve())
	}
	close(stop)
	wg.Wait()
	t.Logf("victim's resolutions: quiet %v, during the flood (%d) worst %v; %d flood operations; stats %+v",
		quiet, len(flooded), slices.Max(flooded), ops.Load(), s.Stats())
	if worst := slices.Max(flooded); worst > bound {
		t.Errorf("during the flood a resolution took %v, more than %v (5x the worst before it, 0.5 s at least)", worst, bound)
	}
	st := s.Stats()
	if st.Resyncs != 0 {
		t.Errorf("%d resyncs during the flood, want none", st.Resyncs)
	}
	if d := drops(); d != 0 {
		t.Errorf("the syncer's sockets dropped %d notifications", d)
	}
	if st.Throttled == 0 {
		t.Errorf("stats %+v: the tenant's requests beyond its budget were not throttled", st)
	}
	if ops.Load() < 10_000 {
		t.Errorf("only %d flood operations: not a flood", ops.Load())
	}
}

// floodLinks are the ifindexes of a tenant's links.
type floodLinks struct{ entries, arp, eth0 int }

// tenantLinks gives the tenant's namespace ns (handle h) two links of its
// own (veth pairs: this kernel has no dummy links): one for entries, one
// with 198.19.200.1/24 that asks user space for its neighbours, as a
// served eth0 does.
func tenantLinks(t *testing.T, ns *nshandle.NS, h *netlink.Handle) floodLinks {
	t.Helper()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "flood0"}, PeerName: "flood9"}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "flood1"}, PeerName: "flood2"}); err != nil {
		t.Fatal(err)
	}
	var fl floodLinks
	for _, n := range []string{"flood0", "flood1", "flood2", "eth0"} {
		l, err := h.LinkByName(n)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatal(err)
		}
		switch n {
		case "flood0":
			fl.entries = l.Attrs().Index
		case "flood1":
			fl.arp = l.Attrs().Index
			a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 19, 200, 1), Mask: net.CIDRMask(24, 32)}}
			if err := h.AddrAdd(l, a); err != nil {
				t.Fatal(err)
			}
			if err := ns.Do(func() error { return setProbes(fl.arp, false) }); err != nil {
				t.Fatal(err)
			}
		case "eth0":
			fl.eth0 = l.Attrs().Index
		}
	}
	return fl
}

// TestServedIfindexes: the container filter keeps requests on every served
// eth0's ifindex: a container whose eth0 has another ifindex than the
// others' (its namespace had links before) is served as well; the filter
// follows Add and Remove.
func TestServedIfindexes(t *testing.T) {
	sb := sandbox.New(t)
	s, hh, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V4)
	addr := net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}
	_, h2 := askingContainer(t, sb, s, "n2", addr, sb.ClientIP)
	c := sb.StartContainer(t, "n57")
	ns := mustOpenNS(t, c.NetNS)
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", Index: 57}, PeerName: "x0"}); err != nil {
		t.Fatal(err)
	}
	if e := eth0Up(t, h, addr); e.Attrs().Index != 57 {
		t.Fatalf("eth0 is ifindex %d, want 57", e.Attrs().Index)
	}
	if err := s.Add("n57", ns, "eth0"); err != nil {
		t.Fatal(err)
	}
	served := func() []int {
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []int
		for i := range s.rx.served {
			out = append(out, i)
		}
		slices.Sort(out)
		return out
	}
	s.mu.Lock()
	i2 := s.ctrs["n2"].eth0
	s.mu.Unlock()
	if got := served(); !slices.Equal(got, []int{i2, 57}) {
		t.Errorf("filter ifindexes %v, want [%d 57]", got, i2)
	}
	waitFor(t, s, "the client's MAC in n2", func() bool { return hasPermanent(h2, sb.ClientIP, clientMAC) })
	// an entry the host gets after Add: n57 has it only if its request is heard
	base := sb.ClientIP.To4()
	known := net.IPv4(base[0], base[1], base[2], 201)
	if err := hh.NeighSet(&netlink.Neigh{LinkIndex: s.eth0, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: known, HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 201}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "the host's entry known", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.known[mustKey(known)] != nil
	})
	askFrom(t, ns, known)
	waitFor(t, s, "the host's entry in n57", func() bool { return hasPermanent(h, known, "02:00:00:00:00:c9") })
	s.Remove("n57")
	if got := served(); !slices.Equal(got, []int{i2}) {
		t.Errorf("after Remove: filter ifindexes %v, want [%d]", got, i2)
	}
}
