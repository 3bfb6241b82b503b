package neighsync

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// nlSocket is a line of a namespace's /proc/net/netlink.
type nlSocket struct {
	proto  int
	pid    int64 // port id (0: the kernel's own socket)
	groups uint64
	drops  uint64
}

// netlinkSockets lists the netlink sockets of namespace ns (every
// process's).
func netlinkSockets(t *testing.T, ns *nshandle.NS) []nlSocket {
	t.Helper()
	var out []nlSocket
	err := ns.Do(func() error {
		f, err := os.Open("/proc/thread-self/net/netlink")
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Scan() // header: sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 10 {
				return fmt.Errorf("netlink line %q", sc.Text())
			}
			p, err1 := strconv.Atoi(f[1])
			pid, err4 := strconv.ParseInt(f[2], 10, 64)
			g, err2 := strconv.ParseUint(f[3], 16, 64)
			d, err3 := strconv.ParseUint(f[8], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
				return fmt.Errorf("netlink line %q", sc.Text())
			}
			out = append(out, nlSocket{proto: p, pid: pid, groups: g, drops: d})
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// routeSockets counts ns's NETLINK_ROUTE sockets (not the kernel's), and
// the subscribed ones.
func routeSockets(t *testing.T, ns *nshandle.NS) (all, subscribed int) {
	t.Helper()
	for _, s := range netlinkSockets(t, ns) {
		if s.proto == unix.NETLINK_ROUTE && s.pid != 0 {
			all++
			if s.groups != 0 {
				subscribed++
			}
		}
	}
	return all, subscribed
}

// TestOneSocketServesEveryNamespace: containers in many namespaces ask for
// the client's MAC; the one socket in the host's namespace hears them all
// and each gets its entry. No namespace holds a subscribed socket (the
// kernel walks every subscribed socket for every notification); each holds
// two unsubscribed sockets of the Syncer (writes, reads), released by
// Remove. The
// containers' neighbour settings are in force.
func TestOneSocketServesEveryNamespace(t *testing.T) {
	sb := sandbox.New(t)
	s, _, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V4)
	addr := net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}
	const n = 12
	nss := make([]*nshandle.NS, n)
	hs := make([]*netlink.Handle, n)
	for i := range n {
		nss[i], hs[i] = askingContainer(t, sb, s, fmt.Sprintf("n%d", i), addr, sb.ClientIP)
	}
	for i := range n {
		waitFor(t, s, fmt.Sprintf("the client's MAC in n%d", i), func() bool { return hasPermanent(hs[i], sb.ClientIP, clientMAC) })
	}
	for i, ns := range nss {
		if _, sub := routeSockets(t, ns); sub != 0 {
			t.Errorf("n%d: %d subscribed NETLINK_ROUTE sockets, want none", i, sub)
		}
		for k, want := range map[string]string{"net/ipv4/neigh/eth0/app_solicit": "3", "net/ipv4/neigh/eth0/mcast_solicit": "0"} {
			var v string
			err := sysctl.In(ns, func(d *sysctl.Dir) (err error) { v, err = d.Read(k); return err })
			if err != nil || v != want {
				t.Errorf("n%d: %s = %q (%v), want %s", i, k, v, err, want)
			}
		}
	}
	hns := mustOpenNS(t, sb.Host.Path)
	if _, sub := routeSockets(t, hns); sub != 2 {
		t.Errorf("host: %d subscribed NETLINK_ROUTE sockets, want 2 (every namespace's, the host's)", sub)
	}

	// a namespace nobody else holds a socket in: Add opens two, Remove closes them
	ns := withEth0(t)
	if all, _ := routeSockets(t, ns); all != 0 {
		t.Fatalf("a fresh namespace has %d NETLINK_ROUTE sockets", all)
	}
	if err := s.Add("x", ns, "eth0"); err != nil {
		t.Fatal(err)
	}
	if all, sub := routeSockets(t, ns); all != 2 || sub != 0 {
		t.Errorf("served: %d NETLINK_ROUTE sockets (%d subscribed), want 2 (none)", all, sub)
	}
	// a second id in the same namespace is served too, and stays when the first goes
	if err := s.Add("y", ns, "eth0"); err != nil {
		t.Fatal(err)
	}
	s.Remove("x")
	s.mu.Lock()
	nsid := s.ctrs["y"].nsid
	ys := s.byNSID[nsid]
	s.mu.Unlock()
	if len(ys) != 1 || ys[0].id != "y" {
		t.Errorf("after removing x: namespace %d serves %v, want y", nsid, ys)
	}
	if all, _ := routeSockets(t, ns); all != 2 {
		t.Errorf("y served: %d NETLINK_ROUTE sockets, want 2", all)
	}
	s.Remove("y")
	if all, _ := routeSockets(t, ns); all != 0 {
		t.Errorf("after Remove: %d NETLINK_ROUTE sockets, want none", all)
	}
	s.mu.Lock()
	_, mapped := s.byNSID[nsid]
	s.mu.Unlock()
	if mapped {
		t.Errorf("namespace %d still mapped after its containers were removed", nsid)
	}
}

// TestTenantsAreApart: a hostile tenant asking for neighbours (the client,
// and many addresses nobody has) gets answers only in its own namespace:
// the other container and a namespace the Syncer does not serve (with an
// id in the host's namespace, so the socket hears it) get nothing from it,
// and the unserved namespace's requests are not answered. Once removed,
// the tenant is served no more; the other container is.
func TestTenantsAreApart(t *testing.T) {
	sb := sandbox.New(t)
	s, hh, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V4)
	addr := net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}
	bns, hb := servedContainer(t, sb, s, "b", addr)
	c := sb.StartContainer(t, "c")
	cns := mustOpenNS(t, c.NetNS)
	ch := containerEth0(t, cns, addr)
	if _, err := s.peerID(cns); err != nil {
		t.Fatal(err)
	}
	askFrom(t, cns, sb.ClientIP)
	tenant, ha := servedContainer(t, sb, s, "a", addr)
	askFrom(t, tenant, sb.ClientIP)
	base := sb.ClientIP.To4()
	for i := range 40 { // on-link addresses nobody has
		askFrom(t, tenant, net.IPv4(base[0], base[1], base[2], byte(100+i)))
	}
	waitFor(t, s, "the client's MAC in the tenant", func() bool { return hasPermanent(ha, sb.ClientIP, clientMAC) })
	// the host resolved the client and tried the 40: every answer so far is in
	entries := func(h *netlink.Handle) []netlink.Neigh {
		e, _ := h.LinkByName("eth0")
		ns, _ := h.NeighList(e.Attrs().Index, netlink.FAMILY_V4)
		var out []netlink.Neigh
		for _, n := range ns {
			if n.State == netlink.NUD_PERMANENT {
				out = append(out, n)
			}
		}
		return out
	}
	if e := entries(hb); len(e) != 0 {
		t.Errorf("container b got %v, asked by another", e)
	}
	if e := entries(ch); len(e) != 0 {
		t.Errorf("an unserved namespace got %v", e)
	}
	s.mu.Lock()
	w := len(s.waiting)
	s.mu.Unlock()
	if w > 40 {
		t.Errorf("waiting for %d addresses after the tenant asked for 40 and the client", w)
	}

	// removed, the tenant is not served: it asks for an address the host knows
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
	s.Remove("a")
	pushed := s.Stats().Pushed
	askFrom(t, tenant, known)
	askFrom(t, bns, known)
	waitFor(t, s, "the known entry in b", func() bool { return hasPermanent(hb, known, "02:00:00:00:00:c9") })
	if hasPermanent(ha, known, "02:00:00:00:00:c9") {
		t.Error("a removed container was served")
	}
	if st := s.Stats(); st.Pushed != pushed+1 {
		t.Errorf("%d entries written after b asked, want 1", st.Pushed-pushed)
	}
}

// TestOverflowResync: while the reader is held up, a flood of host
// neighbour changes overflows the host's socket, and a container's
// requests (for addresses nobody has, then for the client) overflow the
// other one: the request for the client is lost (it asks once in 10 s:
// retrans_time). The reader sees both overflows and reads the tables
// again: the container is served, the host's entries added during the
// flood are known and the one deleted is not.
func TestOverflowResync(t *testing.T) {
	b, g := rcvBuf, resyncGap
	t.Cleanup(func() { rcvBuf, resyncGap = b, g }) // after the Syncer's Close
	rcvBuf, resyncGap = 4096, 10*time.Millisecond
	sb := sandbox.New(t)
	s, hh, clientMAC := hostSyncer(t, sb, netlink.FAMILY_V4)
	addr := net.IPNet{IP: sb.HostIP, Mask: net.CIDRMask(sandbox.PrefixLen, 32)}
	ns, h := servedContainer(t, sb, s, "n1", addr)
	if err := sysctl.In(ns, func(d *sysctl.Dir) error { return d.Write("net/ipv4/neigh/eth0/retrans_time_ms", "10000") }); err != nil {
		t.Fatal(err)
	}
	base := sb.ClientIP.To4()
	entry := func(i int) *netlink.Neigh {
		return &netlink.Neigh{LinkIndex: s.eth0, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.IPv4(base[0], base[1], 0xf2, byte(i)), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0xf2, byte(i)}}
	}
	gone := entry(255)
	if err := hh.NeighSet(gone); err != nil {
		t.Fatal(err)
	}
	isKnown := func(n *netlink.Neigh) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.known[mustKey(n.IP)] != nil
	}
	waitFor(t, s, "the host's entry known", func() bool { return isKnown(gone) })
	hns := mustOpenNS(t, sb.Host.Path)
	drops := func() (d uint64) {
		for _, k := range netlinkSockets(t, hns) {
			if k.proto == unix.NETLINK_ROUTE && k.groups != 0 {
				d += k.drops
			}
		}
		return d
	}
	before := drops()
	s.mu.Lock() // the reader waits
	locked := true
	defer func() {
		if locked {
			s.mu.Unlock()
		}
	}()
	if err := hh.NeighDel(gone); err != nil {
		t.Fatal(err)
	}
	const flood = 200
	for i := range flood {
		if err := hh.NeighSet(entry(i)); err != nil {
			t.Fatal(err)
		}
	}
	if drops() == before {
		t.Fatal("the flood did not overflow the socket")
	}
	for i := range 20 {
		askFrom(t, ns, net.IPv4(base[0], base[1], base[2], byte(100+i)))
	}
	askFrom(t, ns, sb.ClientIP)
	if !wait.Until(5*time.Second, func() bool { return drops() > before+flood/2+10 && incomplete(h, sb.ClientIP) }) {
		t.Fatal("the container's request was not made or not lost")
	}
	s.mu.Unlock()
	locked = false
	waitFor(t, s, "the client's MAC in n1", func() bool { return hasPermanent(h, sb.ClientIP, clientMAC) })
	if st := s.Stats(); st.Resyncs < 2 {
		t.Errorf("stats %+v: want a resync of each socket", st)
	}
	for i := range flood {
		if !isKnown(entry(i)) {
			t.Fatalf("the host's entry %v, added during the flood, is not known", entry(i).IP)
		}
	}
	if isKnown(gone) {
		t.Error("the host's entry deleted during the flood is still known")
	}
}

// incomplete reports whether h's eth0 has an INCOMPLETE entry for ip.
func incomplete(h *netlink.Handle, ip net.IP) bool {
	e, _ := h.LinkByName("eth0")
	ns, _ := h.NeighList(e.Attrs().Index, netlink.FAMILY_V4)
	for _, n := range ns {
		if n.IP.Equal(ip) && n.State == netlink.NUD_INCOMPLETE {
			return true
		}
	}
	return false
}
