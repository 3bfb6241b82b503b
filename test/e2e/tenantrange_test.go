package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// Recovery trusts only what the tenant cannot write. A root tenant sets its
// own ip_local_port_range to whatever it likes, then the state is lost and
// the daemon restarts: the rebuild from the kernel must give every
// container exactly what it owned before (the host side proves it), write
// the block back into the tenant's namespace, and leave the host's ports
// the host's. Block size 1024 over 32768-40959, so the ranges are those of
// the issue: the first block is 32768-33791.

const (
	trHostPort1, trHostPort2 = 22, 25 // host services inside "16 31"
	trClientPort             = 7000   // a server in the client namespace
)

type trFleet struct {
	sb    *sandbox.Sandbox
	d     *Daemon
	ctrs  map[string]*sandbox.Container // id -> its process
	ports map[string]int                // id -> its exclusive port
	names map[int]string                // exclusive port -> server name
	want  []ktContainer
	block map[string]string // id -> "begin end" of its ephemeral block
}

func newTRFleet(t *testing.T) *trFleet {
	t.Helper()
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{BlockSize: 1024})
	f := &trFleet{sb: sb, d: d, ctrs: map[string]*sandbox.Container{}, ports: map[string]int{}, names: map[int]string{}, block: map[string]string{}}
	// the host's own services, on ports a tenant's "16 31" would cover
	for _, p := range []int{trHostPort1, trHostPort2} {
		serveIn(t, sb.Host, "tcp", fmt.Sprintf(":%d", p), "host")
		serveIn(t, sb.Host, "udp", fmt.Sprintf(":%d", p), "host")
	}
	serveIn(t, sb.Client, "tcp", net.JoinHostPort(sb.ClientIP.String(), strconv.Itoa(trClientPort)), "client")
	// a: pinned by isolatord (--pid); b: the runtime's pin;
	// c: isolatord's pin, with a limit
	for i, n := range []string{"a", "b", "c"} {
		port := 31201 + i
		c := startServer(t, sb, n, port)
		id := sb.Name + "-" + n
		f.ctrs[id], f.ports[id], f.names[port] = c, port, n
		args := []string{"prepare", id, "--ports", strconv.Itoa(port)}
		if n == "c" {
			args = append(args, "--ingress-rate-limit", "16Mbit")
		}
		d.Ctl(t, args...)
		if n == "b" { // pinned by its runtime where isolatord pins (Nomad)
			d.Ctl(t, "isolate", id, "--netns", pinAt(t, c.NetNS, d.NetNSDir, id))
		} else {
			d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))
		}
	}
	d.CtlJSON(t, &f.want, "list")
	for _, c := range f.want {
		f.block[c.ContainerID] = fmt.Sprintf("%d %d", c.EphemeralPorts.Begin, c.EphemeralPorts.End)
	}
	f.check(t, "before any fault")
	return f
}

// serveIn serves the named echo on addr in ns until the test ends.
func serveIn(t *testing.T, ns sandbox.NS, network, addr, name string) {
	t.Helper()
	var srv *traffic.Server
	err := ns.Do(func() (err error) {
		if network == "udp" {
			srv, err = traffic.ServeUDP(context.Background(), addr, name)
		} else {
			srv, err = traffic.ServeTCP(context.Background(), addr, name)
		}
		return err
	})
	if err != nil {
		t.Fatalf("serve %s %s in %s: %v", network, addr, ns.Path, err)
	}
	t.Cleanup(func() { srv.Close() })
}

func (f *trFleet) id(n string) string { return f.sb.Name + "-" + n }

// check asserts, with real traffic, that every container owns exactly what
// it owned before and the host its own ports: the listing is unchanged;
// each container's port reaches it (TCP, UDP) from the client; the host's
// ports 22 and 25 reach the host's servers; the host's own outgoing
// connections work; each container's ip_local_port_range is its block and
// it connects out from it; no container can send from the host's port 25.
func (f *trFleet) check(t *testing.T, when string) {
	t.Helper()
	var got []ktContainer
	f.d.CtlJSON(t, &got, "list")
	if !reflect.DeepEqual(got, f.want) {
		t.Fatalf("%s: containers listed\n%+v\nwant\n%+v\nlog:\n%s", when, got, f.want, f.d.Log())
	}
	for port, name := range f.names {
		for _, nw := range []string{"tcp", "udp"} {
			if r, err := echoFromClient(f.sb, nw, port); err != nil || r != name {
				t.Fatalf("%s: %s to host:%d answered by %q, %v; want %s", when, nw, port, r, err, name)
			}
		}
	}
	for _, p := range []int{trHostPort1, trHostPort2} {
		for _, nw := range []string{"tcp", "udp"} {
			if r, err := echoFromClient(f.sb, nw, p); err != nil || r != "host" {
				t.Fatalf("%s: %s to the host's port %d answered by %q, %v; want the host", when, nw, p, r, err)
			}
		}
	}
	clientAddr := net.JoinHostPort(f.sb.ClientIP.String(), strconv.Itoa(trClientPort))
	if r, err := echoFromHost(f.sb, "tcp", clientAddr); err != nil || r != "client" {
		t.Fatalf("%s: the host's outgoing connection got %q, %v", when, r, err)
	}
	for id, c := range f.ctrs {
		v, err := c.Sysctl("net.ipv4.ip_local_port_range")
		if err != nil || strings.Join(strings.Fields(v), " ") != f.block[id] {
			t.Fatalf("%s: %s's ip_local_port_range is %q (%v), want its block %s", when, id, v, err, f.block[id])
		}
		if r, err := echoFrom(c, "", clientAddr); err != nil || r != "client" {
			t.Fatalf("%s: %s's outgoing connection got %q, %v", when, id, r, err)
		}
		src := net.JoinHostPort(f.sb.HostIP.String(), strconv.Itoa(trHostPort2))
		if r, err := echoFrom(c, src, clientAddr); err == nil {
			t.Fatalf("%s: %s sent from the host's port %d and got %q", when, id, trHostPort2, r)
		}
	}
}

// echoFrom echoes to addr from c's namespace, from source src ("" = any).
func echoFrom(c *sandbox.Container, src, addr string) (string, error) {
	var reply string
	err := c.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		opts := []traffic.Option{traffic.WithTimeout(time.Second)}
		if src != "" {
			opts = append(opts, traffic.WithSource(src))
		}
		r, err := traffic.Echo(ctx, "tcp", addr, "hi", opts...)
		reply = r
		return err
	})
	return traffic.ReplyName(reply), err
}

// stateLosses are the ways the state is lost; each is followed by a
// restart that rebuilds from the kernel alone.
func stateLosses(dbPath string, rng *rand.Rand) []struct {
	name string
	do   func() error
} {
	return []struct {
		name string
		do   func() error
	}{
		{"deleted", func() error { return os.Remove(dbPath) }},
		{"emptied", func() error { return os.Truncate(dbPath, 0) }},
		{"truncated", func() error { return os.Truncate(dbPath, 100) }},
		{"corrupt", func() error {
			b := make([]byte, 32<<10)
			rng.Read(b)
			return os.WriteFile(dbPath, b, 0o600)
		}},
	}
}

// TestTenantRangeNeverWidensRights: for each range a hostile root tenant
// may set (the host's privileged ports, the host's ephemeral range, an
// unaligned range, a sub-block, another container's block), in an
// isolatord-pinned and a runtime-pinned namespace at once, and each way
// of losing the state: after the restart every container owns exactly what
// it owned before, its block is written back, the host's ports stay the
// host's, nothing is reported unattributed, and a new container gets a
// block and slot nobody holds.
func TestTenantRangeNeverWidensRights(t *testing.T) {
	f := newTRFleet(t)
	a, b, c := f.id("a"), f.id("b"), f.id("c")
	ranges := []struct {
		name   string
		tenant map[string]string // id -> the range it sets
	}{
		{"the host's privileged ports", map[string]string{a: "16 31", b: "16 31"}},
		{"the host's ephemeral range", map[string]string{a: "49152 65535", b: "49152 65535"}},
		{"unaligned", map[string]string{a: "32768 33790", b: "32768 33790"}},
		{"sub-block", map[string]string{a: "32768 33279", b: "32768 33279"}},
		{"another container's block", map[string]string{a: f.block[c], b: f.block[a]}},
	}
	dbPath := filepath.Join(f.d.StateDir, "isolatord.db")
	rng := rand.New(rand.NewSource(1))
	losses := stateLosses(dbPath, rng)
	ctx := context.Background()
	for _, r := range ranges {
		for _, loss := range losses {
			when := fmt.Sprintf("tenant range %s, state %s", r.name, loss.name)
			for id, v := range r.tenant {
				// (the kernel wants the range above the privileged ports: a
				// root tenant lowers that bound first)
				must(t, f.ctrs[id].SetSysctl("net.ipv4.ip_unprivileged_port_start", "0"))
				must(t, f.ctrs[id].SetSysctl("net.ipv4.ip_local_port_range", v))
			}
			f.d.Kill()
			must(t, loss.do())
			f.d.Start()
			f.check(t, when)
			st, err := f.d.Client.Status(ctx, &pb.StatusRequest{})
			must(t, err)
			if len(st.GetUnattributed()) != 0 || len(st.GetRebuilt()) != 3 {
				t.Fatalf("%s: unattributed %v, rebuilt %v (want all 3)\n%s", when, st.GetUnattributed(), st.GetRebuilt(), f.d.Log())
			}
			if got := strings.Count(f.d.Log(), "its block, as the host side proves it, was written back"); got != len(r.tenant) {
				t.Fatalf("%s: %d write-backs logged, want %d:\n%s", when, got, len(r.tenant), f.d.Log())
			}
			// nothing is handed out twice: a new container's block, slot
			// and port are nobody's
			p := f.id("p")
			resp, err := f.d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: p, Ports: []*pb.PortRange{{Begin: 31299, End: 31299}}})
			must(t, err)
			nb := resp.GetContainer().GetEphemeralPorts()
			for _, w := range f.want {
				if int(nb.GetBegin()) <= w.EphemeralPorts.End && w.EphemeralPorts.Begin <= int(nb.GetEnd()) {
					t.Fatalf("%s: new container got block %d-%d, overlapping %s's %d-%d", when, nb.GetBegin(), nb.GetEnd(), w.ContainerID, w.EphemeralPorts.Begin, w.EphemeralPorts.End)
				}
			}
			// an existing container's port is refused to it
			if _, err := f.d.Client.Update(ctx, &pb.UpdateRequest{ContainerId: p, Ports: []*pb.PortRange{{Begin: 31201, End: 31201}}}); err == nil {
				t.Fatalf("%s: container a's port 31201 handed to a new container", when)
			}
			_, err = f.d.Client.Cleanup(ctx, &pb.CleanupRequest{ContainerId: p})
			must(t, err)
		}
	}
	t.Logf("%d tenant ranges x %d state losses: every container kept exactly its rights", len(ranges), len(losses))
}

// setVethAlias rewrites id's host veth alias in the sandbox host with edit
// (as a setup cut short before it wrote the alias leaves it, say).
func setVethAlias(t *testing.T, sb *sandbox.Sandbox, id string, edit func(m map[string]any)) map[string]any {
	t.Helper()
	h, err := sb.Host.Netlink()
	must(t, err)
	defer h.Close()
	l, err := h.LinkByName(plane.VethName(id))
	must(t, err)
	m := map[string]any{}
	must(t, json.Unmarshal([]byte(l.Attrs().Alias), &m))
	if edit != nil {
		edit(m)
		b, err := json.Marshal(m)
		must(t, err)
		must(t, h.LinkSetAlias(l, string(b)))
	}
	return m
}

// TestRebuildHoldsWhatTheKernelRoutes: a veth alias without the block is
// rebuilt with the block the host demux routes, and the alias is brought
// up to date; a container that cannot be rebuilt (its
// runtime's pin gone with the state) keeps its traffic, is reported, and
// what the host still routes to it (static port, block) is never handed
// out, until the operator removes it.
func TestRebuildHoldsWhatTheKernelRoutes(t *testing.T) {
	f := newTRFleet(t)
	a, b := f.id("a"), f.id("b")
	ctx := context.Background()
	dbPath := filepath.Join(f.d.StateDir, "isolatord.db")

	setVethAlias(t, f.sb, a, func(m map[string]any) { delete(m, "eph") })
	must(t, f.ctrs[a].SetSysctl("net.ipv4.ip_local_port_range", "40000 40959"))
	f.d.Kill()
	must(t, os.Remove(dbPath))
	f.d.Start()
	f.check(t, "alias without the block")
	if m := setVethAlias(t, f.sb, a, nil); m["eph"] != strings.ReplaceAll(f.block[a], " ", "-") {
		t.Fatalf("alias not brought up to date: %v", m)
	}

	// b's pin (its runtime's) goes with the state: b cannot be rebuilt
	bBlock := f.want[1].EphemeralPorts
	if f.want[1].ContainerID != b {
		t.Fatalf("listing order: %+v", f.want)
	}
	f.d.Kill()
	if _, _, err := nspin.Unmount(f.d.NetNSDir, b); err != nil {
		t.Fatal(err)
	}
	must(t, os.Remove(dbPath))
	f.d.Start()
	if r, err := echoFromClient(f.sb, "tcp", 31202); err != nil || r != "b" {
		t.Fatalf("b's traffic after it could not be rebuilt: %q, %v", r, err)
	}
	st, err := f.d.Client.Status(ctx, &pb.StatusRequest{})
	must(t, err)
	if !slices.ContainsFunc(st.GetUnattributed(), func(u string) bool { return strings.Contains(u, b) }) {
		t.Fatalf("b not reported: %v", st.GetUnattributed())
	}
	if _, err := f.d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: f.id("x"), Ports: []*pb.PortRange{{Begin: 31202, End: 31202}}}); err == nil {
		t.Fatal("b's port, still routed to it, handed to a new container")
	}
	// every free block handed out: none is b's
	got := 0
	for i := 0; i < 8; i++ {
		resp, err := f.d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: fmt.Sprintf("%s-y%d", f.sb.Name, i)})
		if err != nil {
			break
		}
		got++
		if e := resp.GetContainer().GetEphemeralPorts(); int(e.GetBegin()) == bBlock.Begin {
			t.Fatalf("b's block %d-%d, still routed to it, handed to a new container", bBlock.Begin, bBlock.End)
		}
	}
	if got == 0 {
		t.Fatal("no new container could be prepared: the block check checked nothing")
	}
	// the operator removes it: its port is free again
	_, err = f.d.Client.RemoveUnattributed(ctx, &pb.RemoveUnattributedRequest{})
	must(t, err)
	if _, err := f.d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: f.id("x"), Ports: []*pb.PortRange{{Begin: 31202, End: 31202}}}); err != nil {
		t.Fatalf("b's port after remove-unattributed: %v", err)
	}
}
