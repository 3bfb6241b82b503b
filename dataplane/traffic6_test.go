package dataplane

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IPv6 twins of the IPv4 traffic tests. They need the host demux to steer
// IPv6 and the veth filters to pass it (ETH_P_IPV6 filters on the host's
// eth0): until the data plane installs those, they skip, saying so.

// steeredEnv6 is a sandbox with IPv6 and a data plane that shares it, or a
// skip when the data plane installs no IPv6 filters.
func steeredEnv6(t *testing.T) *env {
	t.Helper()
	e := newEnvWith(t, IPv6On, sandbox.WithIPv6())
	h, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth0, err := h.LinkByName(e.sb.HostEth0)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := h.FilterList(eth0, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.Attrs().Protocol == unix.ETH_P_IPV6 {
			return e
		}
	}
	t.Skip("the data plane installs no IPv6 (ETH_P_IPV6) filters on the host's eth0: the host demux does not steer IPv6 to containers yet")
	return nil
}

func host6Addr(e *env, port int) string {
	return net.JoinHostPort(e.sb.HostIP6.String(), strconv.Itoa(port))
}

func client6Addr(e *env, port int) string {
	return net.JoinHostPort(e.sb.ClientIP6.String(), strconv.Itoa(port))
}

func lo6Addr(port int) string { return net.JoinHostPort("::1", strconv.Itoa(port)) }

// TestTwoContainersTrafficIPv6 is TestTwoContainersTraffic over IPv6: the
// client, the host namespace and two containers sharing the host's IPv6
// address, owning different ports.
func TestTwoContainersTrafficIPv6(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000, 31001, 31009, 8000)
	b := e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	serveIn(t, e.sb.Host, "[::]:8000", "host")
	serveIn(t, e.sb.Client, client6Addr(e, 9000), "client")

	for _, nw := range []string{"tcp", "udp"} {
		t.Run("client-to-container/"+nw, func(t *testing.T) {
			mustEcho(t, e.sb.Client, nw, host6Addr(e, 31000), "A")
			mustEcho(t, e.sb.Client, nw, host6Addr(e, 31009), "A")
			mustEcho(t, e.sb.Client, nw, host6Addr(e, 31010), "B")
		})
		t.Run("container-to-client/"+nw, func(t *testing.T) {
			mustEcho(t, a.proc, nw, client6Addr(e, 9000), "client")
			mustEcho(t, b.proc, nw, client6Addr(e, 9000), "client")
		})
		t.Run("host-to-container/"+nw, func(t *testing.T) {
			mustEcho(t, e.sb.Host, nw, host6Addr(e, 31000), "A")
			mustEcho(t, e.sb.Host, nw, lo6Addr(31001), "A")
			mustEcho(t, e.sb.Host, nw, host6Addr(e, 31010), "B")
			mustEcho(t, e.sb.Host, nw, lo6Addr(31010), "B")
		})
		t.Run("container-to-host/"+nw, func(t *testing.T) {
			mustEcho(t, a.proc, nw, host6Addr(e, 8000), "host")
			mustEcho(t, a.proc, nw, lo6Addr(8000), "host")
			mustEcho(t, b.proc, nw, host6Addr(e, 8000), "host")
			mustEcho(t, b.proc, nw, lo6Addr(8000), "host")
		})
		t.Run("container-to-container/"+nw, func(t *testing.T) {
			mustEcho(t, a.proc, nw, host6Addr(e, 31010), "B")
			mustEcho(t, a.proc, nw, lo6Addr(31010), "B")
			mustEcho(t, b.proc, nw, host6Addr(e, 31000), "A")
			mustEcho(t, b.proc, nw, lo6Addr(31009), "A")
		})
		t.Run("container-to-itself/"+nw, func(t *testing.T) {
			mustEcho(t, a.proc, nw, host6Addr(e, 31000), "A")
			mustEcho(t, a.proc, nw, lo6Addr(31001), "A")
		})
		t.Run("unowned-port-reaches-host/"+nw, func(t *testing.T) {
			mustEcho(t, e.sb.Client, nw, host6Addr(e, 8000), "host")
		})
	}

	t.Run("source-port-outside-ranges-fails", func(t *testing.T) {
		src := func(port int) string { return net.JoinHostPort(e.sb.HostIP6.String(), strconv.Itoa(port)) }
		for _, nw := range []string{"tcp6", "udp6"} {
			for _, p := range []int{50000, 31015, 61500} {
				if got, err := echo(a.proc, nw, client6Addr(e, 9000), traffic.WithSource(src(p)), traffic.WithTimeout(700*time.Millisecond)); err == nil {
					t.Errorf("%s from port %d reached %s: the container is not confined to its ports", nw, p, got)
				}
			}
			mustEcho(t, a.proc, nw, client6Addr(e, 9000), "client", traffic.WithSource(src(31005)))
		}
	})

	t.Run("ping6", func(t *testing.T) {
		ctx := context.Background()
		for _, p := range []ctr{a, b} {
			for _, dst := range []net.IP{e.sb.ClientIP6, e.sb.HostIP6} {
				var res traffic.PingResult
				err := p.proc.Do(func() (err error) {
					res, err = traffic.PingStats(ctx, dst, 3, time.Second)
					return err
				})
				if err != nil || !res.ExactlyOnce() {
					t.Errorf("ping6 %s from %s: %+v %v (want exactly one reply each)", dst, p.c.ID, res, err)
				}
			}
		}
		var res traffic.PingResult
		err := e.sb.Client.Do(func() (err error) {
			res, err = traffic.PingStats(ctx, e.sb.HostIP6, 3, time.Second)
			return err
		})
		if err != nil || !res.ExactlyOnce() {
			t.Errorf("client ping6 of the host address with 2 containers: %+v %v (want exactly one reply each)", res, err)
		}
	})

	if n := e.errs.Load(); n != 0 {
		t.Errorf("%d filter operations failed", n)
	}

	t.Run("teardown-leaves-nothing", func(t *testing.T) {
		veth := plane.VethName(a.c.ID)
		if _, err := e.d.Teardown(context.Background(), a.c); err != nil {
			t.Fatal(err)
		}
		if e.hasLink(veth) {
			t.Errorf("veth %s survived teardown", veth)
		}
		if f := e.hostFilters(); slotRE(1).MatchString(f) || strings.Contains(f, veth) {
			t.Errorf("host filters still reference A (slot 1 / %s):\n%s", veth, f)
		}
		if got, err := echo(e.sb.Client, "tcp", host6Addr(e, 31000)); err == nil {
			t.Errorf("A's port answered over IPv6 by %s after teardown", got)
		}
		mustEcho(t, e.sb.Client, "tcp", host6Addr(e, 31010), "B")
	})
}

// TestFortyContainersNDPAndPing6: 40 containers need the client's
// neighbour entry and ping6 it at the same time, then ping6 the host: each
// gets exactly one reply per request, and the client sees the host's
// solicitations only (a handful), not one per container.
func TestFortyContainersNDPAndPing6(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	const n = 40
	cs := make([]ctr, n)
	for i := range cs {
		b := 32768 + 256*i
		cs[i] = e.start(fmt.Sprintf("P%d", i), uint16(i+1), fmt.Sprintf("%d-%d", b, b+255), fmt.Sprint(30000+i), "", uint16(30000+i))
	}
	// The host forgets the client: every container's first packet needs it.
	h, err := e.sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth0, _ := h.LinkByName(e.sb.HostEth0)
	h.NeighDel(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, Family: netlink.FAMILY_V6, IP: e.sb.ClientIP6})
	before := clientSolicits(t, e)
	pingAllAtOnce(t, cs, "client", e.sb.ClientIP6)
	pingAllAtOnce(t, cs, "host", e.sb.HostIP6)
	if got := clientSolicits(t, e) - before; got > 6 {
		t.Errorf("the client received %d neighbour solicitations for 40 containers, want the host's few", got)
	}
}

// clientSolicits is the client namespace's Icmp6InNeighborSolicits.
func clientSolicits(t *testing.T, e *env) int64 {
	t.Helper()
	return snmp6(t, e.sb.Client, "Icmp6InNeighborSolicits")
}

// snmp6 reads one counter of /proc/net/snmp6 inside ns.
func snmp6(t *testing.T, ns doer, name string) int64 {
	t.Helper()
	var v int64 = -1
	err := ns.Do(func() error {
		f, err := os.Open("/proc/thread-self/net/snmp6") // /proc/net is the main thread's namespace
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) == 2 && fs[0] == name {
				v, err = strconv.ParseInt(fs[1], 10, 64)
				return err
			}
		}
		return sc.Err()
	})
	if err != nil || v < 0 {
		t.Fatalf("%s: %d %v", name, v, err)
	}
	return v
}

// TestSharedPortIPv6 is TestSharedPort over IPv6: flows to a shared port
// spread over its holders, the host and a container reach it too, and it
// falls back to the host's listener when they leave.
func TestSharedPortIPv6(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	a := e.start("A", 1, "40960-41983", "31000", "9000", 9000)
	b := e.start("B", 2, "41984-43007", "31010", "9000", 9000)
	serveIn(t, e.sb.Host, "[::]:9000", "host")
	ctx := context.Background()
	spread := func() map[string]int {
		seen := map[string]int{}
		for i := 0; i < 32; i++ {
			src := client6Addr(e, 45000+2*i)
			got, err := echo(e.sb.Client, "tcp6", host6Addr(e, 9000), traffic.WithSource(src))
			if err != nil {
				t.Errorf("shared port from %s: %v", src, err)
				continue
			}
			seen[got]++
		}
		return seen
	}
	if seen := spread(); seen["A"] == 0 || seen["B"] == 0 || seen["host"] != 0 {
		t.Errorf("32 IPv6 connections to shared port 9000 were answered by %v, want both A and B", seen)
	}
	if got, err := echo(e.sb.Host, "tcp", lo6Addr(9000)); err != nil || (got != "A" && got != "B") {
		t.Errorf("host -> [::1]:9000: %q %v", got, err)
	}
	if got, err := echo(a.proc, "tcp", host6Addr(e, 9000)); err != nil || (got != "A" && got != "B") {
		t.Errorf("A -> [host]:9000: %q %v", got, err)
	}
	if err := e.d.SetPorts(ctx, b.c, ephemeral.MustParseSet("31010"), ephemeral.Set{}); err != nil {
		t.Fatal(err)
	}
	if seen := spread(); seen["A"] != 32 {
		t.Errorf("after B left 9000: %v, want all 32 on A", seen)
	}
	if _, err := e.d.Teardown(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	mustEcho(t, e.sb.Client, "tcp", host6Addr(e, 9000), "host")
}

// TestRestartKeepsIPv6Traffic: a container's IPv6 traffic flows while its
// data plane is gone and after a restarted one adopted it.
func TestRestartKeepsIPv6Traffic(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	serveIn(t, e.sb.Client, client6Addr(e, 9000), "client")
	check := func(when string) {
		t.Helper()
		for _, nw := range []string{"tcp", "udp"} {
			if got, err := echo(e.sb.Client, nw, host6Addr(e, 31000)); err != nil || got != "A" {
				t.Errorf("%s: client -> A over IPv6 (%s): %q %v", when, nw, got, err)
			}
			if got, err := echo(a.proc, nw, client6Addr(e, 9000)); err != nil || got != "client" {
				t.Errorf("%s: A -> client over IPv6 (%s): %q %v", when, nw, got, err)
			}
		}
	}
	check("running")
	e.d.Close()
	check("data plane gone")
	ctx := context.Background()
	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.Strays(ctx, []plane.Container{a.c}); err != nil {
		t.Fatal(err)
	}
	check("adopted")
	if miss, err := d2.Check(ctx, a.c); err != nil || len(miss) != 0 {
		t.Errorf("Check after Adopt: %v %v", miss, err)
	}
}
