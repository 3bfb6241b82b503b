package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// IPv6 through the real daemon and its gRPC API, with live IPv6 traffic:
// a kill -9 and restart, a rebuild from the kernel alone, a cleanup that
// leaves nothing of IPv6 behind, and --ipv6=false. Each sandbox is
// dual-stack (sandbox.WithIPv6: a /64 of 2001:db8::/32 of its own).

const (
	v6Port1, v6Port2 = 31201, 31202
	v6ClientPort     = 31290 // a server in the client namespace
)

// v6Fleet is two isolated containers serving TCP and UDP over IPv6 (one
// isolated by pid, one by namespace path), and a server on the client for
// their outbound IPv6 traffic.
type v6Fleet struct {
	sb    *sandbox.Sandbox
	d     *Daemon
	ids   []string
	ctrs  []*sandbox.Container
	names map[int]string // port -> server name
	addr6 string         // the host's IPv6 address and prefix, as containers carry it
	// hostFilters is how many IPv6 filters the daemon had installed
	// before the first container (the host demuxes').
	hostFilters int
}

func newV6Fleet(t *testing.T) *v6Fleet {
	t.Helper()
	return newV6FleetWith(t, sandbox.New(t, sandbox.WithIPv6()), func() {})
}

// newV6FleetWith starts the daemon and the fleet in sb, a sandbox with
// IPv6, calling started once the daemon serves, before any container.
func newV6FleetWith(t *testing.T, sb *sandbox.Sandbox, started func()) *v6Fleet {
	t.Helper()
	d := StartDaemon(t, sb, DaemonOptions{})
	started()
	f := &v6Fleet{sb: sb, d: d,
		names:       map[int]string{v6Port1: "v1", v6Port2: "v2"},
		addr6:       (&net.IPNet{IP: sb.HostIP6, Mask: net.CIDRMask(sandbox.Prefix6Len, 128)}).String(),
		hostFilters: ipv6Filters(t, sb),
	}
	if f.hostFilters == 0 {
		t.Fatalf("IPv6 is on but the daemon installed no IPv6 filter at start-up:\n%s", d.Log())
	}
	serveOnClient6(t, sb, v6ClientPort, "client6")
	c1 := startServer(t, sb, "v1", v6Port1)
	c2 := startServer(t, sb, "v2", v6Port2)
	f.ids = []string{sb.Name + "-v1", sb.Name + "-v2"}
	f.ctrs = []*sandbox.Container{c1, c2}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, port := range []int{v6Port1, v6Port2} {
		if _, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: f.ids[i],
			Ports: []*pb.PortRange{{Begin: uint32(port), End: uint32(port)}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Client.Isolate(ctx, &pb.IsolateRequest{ContainerId: f.ids[0], Target: &pb.IsolateRequest_Pid{Pid: int32(c1.Pid)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.Isolate(ctx, &pb.IsolateRequest{ContainerId: f.ids[1], Target: &pb.IsolateRequest_NetnsPath{NetnsPath: c2.NetNS}}); err != nil {
		t.Fatal(err)
	}
	f.carryIPv6(t, "isolated")
	if !hostSteersIPv6(t, sb) {
		t.Fatalf("IPv6 is on but the host's eth0 has no ETH_P_IPV6 filters:\n%s", d.Log())
	}
	var last error
	if !wait.Until(10*time.Second, func() bool { last = f.check(); return last == nil }) {
		t.Fatalf("IPv6 traffic of the isolated containers: %v", last)
	}
	return f
}

// serveOnClient6 serves TCP echo on the client's IPv6 address.
func serveOnClient6(t *testing.T, sb *sandbox.Sandbox, port int, name string) {
	t.Helper()
	var srv *traffic.Server
	err := sb.Client.Do(func() (err error) {
		srv, err = traffic.ServeTCP(context.Background(), net.JoinHostPort(sb.ClientIP6.String(), strconv.Itoa(port)), name)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
}

// carryIPv6 fails unless every container's eth0 has the host's IPv6 address.
func (f *v6Fleet) carryIPv6(t *testing.T, when string) {
	t.Helper()
	for i, c := range f.ctrs {
		if got := containerIPv6(t, c); !slices.Contains(got, f.addr6) {
			t.Fatalf("%s: %s's eth0 IPv6 addresses %v, want %s", when, f.ids[i], got, f.addr6)
		}
	}
}

// check is one round of IPv6 traffic: TCP and UDP from the client to each
// container's port on the host's IPv6 address, and TCP from the first
// container to the client's IPv6 address.
func (f *v6Fleet) check() error {
	for _, port := range []int{v6Port1, v6Port2} {
		for _, nw := range []string{"tcp", "udp"} {
			if got, err := echo6FromClient(f.sb, nw, port); err != nil || got != f.names[port] {
				return fmt.Errorf("%s to [%s]:%d from the client answered by %q, %v; want %s", nw, f.sb.HostIP6, port, got, err, f.names[port])
			}
		}
	}
	var reply string
	to := net.JoinHostPort(f.sb.ClientIP6.String(), strconv.Itoa(v6ClientPort))
	err := f.ctrs[0].Do(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		reply, err = traffic.Echo(ctx, "tcp", to, "hi", traffic.WithTimeout(2*time.Second))
		return err
	})
	if got := traffic.ReplyName(reply); err != nil || got != "client6" {
		return fmt.Errorf("tcp from %s to %s answered by %q, %v", f.ids[0], to, got, err)
	}
	return nil
}

// list is the containers as the daemon lists them.
func (f *v6Fleet) list(t *testing.T) []ctlContainer {
	t.Helper()
	var got []ctlContainer
	f.d.CtlJSON(t, &got, "list")
	return got
}

// hostLinks opens a netlink handle in the sandbox host (the caller closes
// it) and lists its links.
func hostLinks(t *testing.T, sb *sandbox.Sandbox) (*netlink.Handle, []netlink.Link) {
	t.Helper()
	h, err := sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	links, err := h.LinkList()
	if err != nil {
		h.Close()
		t.Fatal(err)
	}
	return h, links
}

// ipv6Filters counts the ETH_P_IPV6 tc filters (every u32 node and hash
// table) on the ingress and egress of every link of the sandbox host.
func ipv6Filters(t *testing.T, sb *sandbox.Sandbox) int {
	t.Helper()
	h, links := hostLinks(t, sb)
	defer h.Close()
	n := 0
	for _, l := range links {
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := h.FilterList(l, parent)
			if err != nil {
				continue // no clsact on this link
			}
			for _, f := range fs {
				if f.Attrs().Protocol == unix.ETH_P_IPV6 {
					n++
				}
			}
		}
	}
	return n
}

// waitIPv6Filters waits until the sandbox host holds want IPv6 filters (an
// emptied u32 hash table goes a little after its last link).
func waitIPv6Filters(t *testing.T, sb *sandbox.Sandbox, want int, when string) {
	t.Helper()
	var got int
	if !wait.Until(5*time.Second, func() bool { got = ipv6Filters(t, sb); return got == want }) {
		t.Fatalf("%s: %d IPv6 filters in the host namespace, want %d", when, got, want)
	}
}

// host6 is the IPv6 state of the sandbox host namespace that must come back
// as it was: every link's IPv6 addresses ("link addr/len"), and the unicast
// IPv6 neighbour entries nobody learnt by resolution (permanent, proxy).
// The kernel's own entries for multicast groups are left out.
type host6 struct {
	addrs  []string
	pinned []string
}

func readHost6(t *testing.T, sb *sandbox.Sandbox) host6 {
	t.Helper()
	h, links := hostLinks(t, sb)
	defer h.Close()
	var s host6
	for _, l := range links {
		addrs, err := h.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			s.addrs = append(s.addrs, l.Attrs().Name+" "+a.IPNet.String())
		}
		neighs, err := h.NeighList(l.Attrs().Index, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range neighs {
			if n.IP.IsMulticast() {
				continue
			}
			if n.State&netlink.NUD_PERMANENT != 0 || n.Flags&netlink.NTF_PROXY != 0 {
				s.pinned = append(s.pinned, fmt.Sprintf("%s %s %s state %#x", l.Attrs().Name, n.IP, n.HardwareAddr, n.State))
			}
		}
		proxies, err := h.NeighProxyList(l.Attrs().Index, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range proxies {
			s.pinned = append(s.pinned, fmt.Sprintf("%s proxy %s", l.Attrs().Name, n.IP))
		}
	}
	sort.Strings(s.addrs)
	sort.Strings(s.pinned)
	return s
}

// TestDaemonIPv6KillRestart: kill -9 of the daemon and a restart while IPv6
// traffic flows both ways: a prober sees no failure, the containers keep
// the host's IPv6 address, the host holds the same IPv6 filters, and the
// host still answers an echo request to its IPv6 address exactly once.
func TestDaemonIPv6KillRestart(t *testing.T) {
	f := newV6Fleet(t)
	filters := ipv6Filters(t, f.sb)
	want := f.list(t)

	stop := startProbe(t, f.check)
	f.d.Kill()
	if err := f.check(); err != nil { // one full round while the daemon is down
		stop()
		t.Fatalf("daemon down: %v", err)
	}
	f.d.Start()
	stop()

	if got := f.list(t); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the restart: containers listed\n%+v\nwant\n%+v", got, want)
	}
	f.carryIPv6(t, "after the restart")
	checkStatusIPv6(t, f.d, []string{f.addr6})
	waitIPv6Filters(t, f.sb, filters, "after the restart")
	if err := f.check(); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	pingHost6Once(t, f.sb, "after the restart")
}

// pingHost6Once: the host answers ICMPv6 echo requests from the client to
// its IPv6 address, each exactly once.
func pingHost6Once(t *testing.T, sb *sandbox.Sandbox, when string) {
	t.Helper()
	var r traffic.PingResult
	err := sb.Client.Do(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err = traffic.PingStats(ctx, sb.HostIP6, 3, 2*time.Second)
		return err
	})
	if err != nil || !r.ExactlyOnce() {
		t.Fatalf("%s: ping6 %s from the client: %+v, %v; want one reply to each request", when, sb.HostIP6, r, err)
	}
}

// TestDaemonIPv6RebuildFromKernel: kill -9, the state file deleted: the
// daemon rebuilds both containers from the kernel alone while IPv6 traffic
// flows (no failure), attributes every IPv6 filter (nothing unattributed
// reported), and the host holds the same IPv6 filters.
func TestDaemonIPv6RebuildFromKernel(t *testing.T) {
	f := newV6Fleet(t)
	filters := ipv6Filters(t, f.sb)
	want := f.list(t)

	stop := startProbe(t, f.check)
	f.d.Kill()
	must(t, os.Remove(filepath.Join(f.d.StateDir, "isolatord.db")))
	f.d.Start()
	stop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := f.d.Client.Status(ctx, &pb.StatusRequest{})
	must(t, err)
	if len(st.GetUnattributed()) != 0 {
		t.Fatalf("unattributed after the rebuild: %v\n%s", st.GetUnattributed(), f.d.Log())
	}
	if got := slices.Sorted(slices.Values(st.GetRebuilt())); !slices.Equal(got, f.ids) {
		t.Fatalf("rebuilt %v, want %v", got, f.ids)
	}
	if got := f.list(t); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the rebuild: containers listed\n%+v\nwant\n%+v", got, want)
	}
	f.carryIPv6(t, "after the rebuild")
	waitIPv6Filters(t, f.sb, filters, "after the rebuild")
	if err := f.check(); err != nil {
		t.Fatalf("after the rebuild: %v", err)
	}
}

// TestDaemonIPv6CleanupLeavesNothing: Cleanup of every container through
// the API, then the daemon stopped: the host namespace holds what it held
// before the first container: no IPv6 filter of a container (only the host
// demuxes', which the daemon installs at start-up and keeps for its next
// start), no other IPv6 address, no permanent or proxy IPv6 neighbour
// entry; the containers' ports are the host's again over IPv6.
func TestDaemonIPv6CleanupLeavesNothing(t *testing.T) {
	sb := sandbox.New(t, sandbox.WithIPv6())
	if n := ipv6Filters(t, sb); n != 0 {
		t.Fatalf("a new sandbox host has %d IPv6 filters", n)
	}
	var before host6
	f := newV6FleetWith(t, sb, func() { before = readHost6(t, sb) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, id := range f.ids {
		if _, err := f.d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id}); err != nil {
			t.Fatalf("cleanup %s: %v", id, err)
		}
	}
	if got := f.list(t); len(got) != 0 {
		t.Fatalf("after cleanup: %+v", got)
	}
	waitIPv6Filters(t, sb, f.hostFilters, "after cleanup")
	if got := readHost6(t, sb); !reflect.DeepEqual(got, before) {
		t.Fatalf("after cleanup the host holds\n%+v\nheld\n%+v", got, before)
	}
	for _, port := range []int{v6Port1, v6Port2} {
		if got, err := echo6FromClient(sb, "tcp", port); err == nil {
			t.Fatalf("tcp to [%s]:%d still answered by %q after cleanup", sb.HostIP6, port, got)
		}
	}
	f.d.Stop()
	waitIPv6Filters(t, sb, f.hostFilters, "daemon stopped")
	if got := readHost6(t, sb); !reflect.DeepEqual(got, before) {
		t.Fatalf("daemon stopped: the host holds\n%+v\nheld\n%+v", got, before)
	}
	if left := readHostState(t, sb, f.d.NetNSDir); len(left.veths) != 0 || len(left.mounts) != 0 {
		t.Fatalf("daemon stopped: veths %v, namespace pins %v left", left.veths, left.mounts)
	}
	pingHost6Once(t, sb, "daemon stopped")
}

// TestDaemonIPv6Off: with --ipv6=false a container gets no IPv6 (its eth0
// has none, IPv6 is disabled in it), the daemon installs no IPv6 filter,
// and the host's own IPv6 traffic is untouched: a host server on the
// host's IPv6 address answers TCP and UDP, the host answers echo requests
// once, and IPv6 to the container's port reaches the host (which refuses
// it: nothing listens there) instead of the container.
func TestDaemonIPv6Off(t *testing.T) {
	sb := sandbox.New(t, sandbox.WithIPv6())
	const port, hostPort = v6Port1, 9000 // hostPort: a port the daemon does not manage
	hostAddr := net.JoinHostPort(sb.HostIP6.String(), strconv.Itoa(hostPort))
	err := sb.Host.Do(func() error {
		tcp, err := traffic.ServeTCP(context.Background(), hostAddr, "host6")
		if err != nil {
			return err
		}
		t.Cleanup(func() { tcp.Close() })
		udp, err := traffic.ServeUDP(context.Background(), hostAddr, "host6")
		if err != nil {
			return err
		}
		t.Cleanup(func() { udp.Close() })
		return nil
	})
	must(t, err)
	hostUntouched := func(when string) {
		t.Helper()
		for _, nw := range []string{"tcp", "udp"} {
			if got, err := echo6FromClient(sb, nw, hostPort); err != nil || got != "host6" {
				t.Fatalf("%s: %s to %s from the client answered by %q, %v; want the host's server", when, nw, hostAddr, got, err)
			}
		}
		pingHost6Once(t, sb, when)
	}
	hostUntouched("no daemon")

	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--ipv6=false"}})
	c := startServer(t, sb, "v4", port)
	id := sb.Name + "-v4"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: id, Ports: []*pb.PortRange{{Begin: port, End: port}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.Isolate(ctx, &pb.IsolateRequest{ContainerId: id, Target: &pb.IsolateRequest_Pid{Pid: int32(c.Pid)}}); err != nil {
		t.Fatal(err)
	}
	if got := containerIPv6(t, c); len(got) != 0 {
		t.Fatalf("--ipv6=false: the container's eth0 has IPv6 addresses %v", got)
	}
	if v, err := c.Sysctl("net/ipv6/conf/eth0/disable_ipv6"); err != nil || v != "1" {
		t.Fatalf("--ipv6=false: the container's eth0 disable_ipv6 = %q, %v; want 1", v, err)
	}
	if n := ipv6Filters(t, sb); n != 0 {
		t.Fatalf("--ipv6=false: %d IPv6 filters in the host namespace", n)
	}
	mustEcho(t, sb, "tcp", port, "v4")
	mustEcho(t, sb, "udp", port, "v4")
	if got, err := echo6FromClient(sb, "tcp", port); !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("--ipv6=false: tcp to [%s]:%d answered by %q, %v; want the host's refusal", sb.HostIP6, port, got, err)
	}
	hostUntouched("container isolated")

	d.Kill()
	d.Start()
	hostUntouched("after a kill -9 and restart")
	if _, err := d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	hostUntouched("after cleanup")
}
