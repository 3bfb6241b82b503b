package e2e

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// TestDaemonFollowsHostRenumbering: the daemon's host is renumbered (a
// new address and gateway added, the old address removed) and its MTU
// lowered while a container it plumbed through CNI serves a port: status
// reports the new address, the client reaches the container on it, and
// a container added afterwards gets a CNI result with the new address,
// gateway and MTU, the same as its namespace holds; the first
// container's namespace holds them too.
func TestDaemonFollowsHostRenumbering(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	nw := newCNINet(t, Binaries(t), d.Socket, "isolator", "1.1.0", "")
	web := startServer(t, sb, "web", 31001)
	rt := cniRuntime(sb.Name+"-web", web.NetNS, cniPortMappings(31001))
	if _, err := nw.CNI.AddNetworkList(cniCtx(t), nw.List, rt); err != nil {
		t.Fatalf("ADD: %v\n%s", err, d.Log())
	}
	t.Cleanup(func() { nw.CNI.DelNetworkList(context.Background(), nw.List, rt) })
	echo := func(addr string) (string, error) {
		var reply string
		err := sb.Client.Do(func() (err error) {
			reply, err = traffic.Echo(context.Background(), "tcp", addr, "hi", traffic.WithTimeout(time.Second))
			return err
		})
		return traffic.ReplyName(reply), err
	}
	if got, err := echo("198.18.0.1:31001"); err != nil || got != "web" {
		t.Fatalf("before the change: %q %v", got, err)
	}
	for _, args := range [][]string{
		{"-n", "client", "addr", "add", "198.18.5.2/24", "dev", "eth0"},
		{"-n", "host", "addr", "add", "198.18.5.1/24", "dev", "eth0"},
		{"-n", "host", "route", "replace", "default", "via", "198.18.5.2", "dev", "eth0"},
		{"-n", "host", "addr", "del", "198.18.0.1/24", "dev", "eth0"},
		{"-n", "host", "link", "set", "eth0", "mtu", "1400"},
	} {
		ns := sb.Host
		if args[1] == "client" {
			ns = sb.Client
		}
		if out, err := ns.Command("ip", args[2:]...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args[2:], " "), err, out)
		}
	}
	start := time.Now()
	wait.For(t, 10*time.Second, "status reports the new host address", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := d.Client.Status(ctx, &pb.StatusRequest{})
		return err == nil && st.GetHostIp() == "198.18.5.1"
	})
	var got string
	var err error
	if !wait.Until(10*time.Second, func() bool {
		got, err = echo("198.18.5.1:31001")
		return err == nil && got == "web"
	}) {
		t.Fatalf("the client does not reach web on the new address: %q %v\n%s", got, err, d.Log())
	}
	t.Logf("status and traffic on the new address %v after the change", time.Since(start))
	if out := d.Ctl(t, "status"); !strings.Contains(out, "198.18.5.1") {
		t.Errorf("isolatorctl status does not show the new address:\n%s", out)
	}
	// the first container: new address, gateway and MTU
	ns := namespaceEth0(t, web.NetNS)
	for _, s := range []string{"mtu 1400", "address 198.18.5.1/24 gateway 198.18.5.2", "default via 198.18.5.2"} {
		if !strings.Contains(ns, s) {
			t.Errorf("web's eth0 lacks %q:\n%s", s, ns)
		}
	}

	api := startServer(t, sb, "api", 31002)
	rt2 := cniRuntime(sb.Name+"-api", api.NetNS, cniPortMappings(31002))
	res, err := nw.CNI.AddNetworkList(cniCtx(t), nw.List, rt2)
	if err != nil {
		t.Fatalf("ADD after the change: %v\n%s", err, d.Log())
	}
	t.Cleanup(func() { nw.CNI.DelNetworkList(context.Background(), nw.List, rt2) })
	r, err := types100.NewResultFromResult(res)
	must(t, err)
	gotRes, nsRes := resultEth0(t, r, api.NetNS), namespaceEth0(t, api.NetNS)
	if gotRes != nsRes {
		t.Errorf("ADD reports eth0 as\n%s\nthe namespace holds\n%s", gotRes, nsRes)
	}
	for _, s := range []string{"mtu 1400", "address 198.18.5.1/24 gateway 198.18.5.2", "default via 198.18.5.2"} {
		if !strings.Contains(gotRes, s) {
			t.Errorf("the ADD result after the change lacks %q:\n%s", s, gotRes)
		}
	}
	if got, err := echo("198.18.5.1:31002"); err != nil || got != "api" {
		t.Errorf("api on the new address: %q %v", got, err)
	}
}

// TestDaemonFollowsIPv6Appearing: a daemon with --ipv6=auto on a host
// without a global IPv6 address decides off; the host gains one and a
// default route via a link-local router: status shows it, one log line
// says IPv6 came on, a container isolated from then on is reachable over
// IPv6 from the client within 2 s, and one isolated before keeps working
// over IPv4 and gains IPv6 too.
func TestDaemonFollowsIPv6Appearing(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--ipv6=auto"}})
	if !strings.Contains(d.Log(), "IPv6: off") {
		t.Fatalf("no start-up line saying IPv6 is off:\n%s", d.Log())
	}
	checkStatusIPv6(t, d, nil)
	oldID := sb.Name + "-old"
	old := startServer(t, sb, "old", 31001)
	d.Ctl(t, "prepare", oldID, "--ports", "31001")
	d.Ctl(t, "isolate", oldID, "--pid", strconv.Itoa(old.Pid))
	t.Cleanup(func() { d.Ctl(t, "cleanup", oldID) })
	mustEcho(t, sb, "tcp", 31001, "old")

	const host6, client6 = "2001:db8:33:e::1", "2001:db8:33:e::2"
	for _, args := range [][]string{
		{"client", "-6", "addr", "add", client6 + "/64", "dev", "eth0", "nodad"},
		{"client", "-6", "addr", "add", sandbox.RouterLinkLocal6 + "/64", "dev", "eth0", "nodad"},
		{"host", "-6", "addr", "add", host6 + "/64", "dev", "eth0", "nodad"},
		{"host", "-6", "route", "add", "default", "via", sandbox.RouterLinkLocal6, "dev", "eth0"},
	} {
		ns := sb.Host
		if args[0] == "client" {
			ns = sb.Client
		}
		if out, err := ns.Command("ip", args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args[1:], " "), err, out)
		}
	}
	start := time.Now()
	wait.For(t, 10*time.Second, "status reports the host's IPv6 address", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := d.Client.Status(ctx, &pb.StatusRequest{})
		return err == nil && slices.Equal(st.GetHostIpv6(), []string{host6 + "/64"})
	})
	t.Logf("status shows IPv6 %v after the address was added", time.Since(start))
	checkStatusIPv6(t, d, []string{host6 + "/64"})
	if !strings.Contains(d.Log(), "IPv6: on (the host interface gained a global IPv6 address)") {
		t.Errorf("no log line saying IPv6 came on:\n%s", d.Log())
	}

	newID := sb.Name + "-new"
	nw := startServer(t, sb, "new", 31002)
	d.Ctl(t, "prepare", newID, "--ports", "31002")
	d.Ctl(t, "isolate", newID, "--pid", strconv.Itoa(nw.Pid))
	t.Cleanup(func() { d.Ctl(t, "cleanup", newID) })
	if got := containerIPv6(t, nw); !slices.Contains(got, host6+"/64") {
		t.Errorf("new container's eth0 IPv6 addresses %v, want %s/64", got, host6)
	}
	target := net.JoinHostPort(host6, "31002")
	var got string
	var err error
	if !wait.Until(2*time.Second, func() bool {
		err = sb.Client.Do(func() error {
			reply, err := traffic.Echo(context.Background(), "tcp", target, "hi", traffic.WithTimeout(time.Second))
			got = traffic.ReplyName(reply)
			return err
		})
		return err == nil && got == "new"
	}) {
		t.Fatalf("the client does not reach the new container on %s within 2 s: %q %v\n%s", target, got, err, d.Log())
	}
	mustEcho(t, sb, "tcp", 31001, "old")
	mustEcho(t, sb, "udp", 31001, "old")
	// The container isolated before gains IPv6 as a host process would.
	wait.For(t, 10*time.Second, "the container isolated before has the host's IPv6 address", func() bool {
		return slices.Contains(containerIPv6(t, old), host6+"/64")
	})
	old6 := net.JoinHostPort(host6, "31001")
	if !wait.Until(2*time.Second, func() bool {
		err = sb.Client.Do(func() error {
			reply, err := traffic.Echo(context.Background(), "udp", old6, "hi", traffic.WithTimeout(time.Second))
			got = traffic.ReplyName(reply)
			return err
		})
		return err == nil && got == "old"
	}) {
		t.Fatalf("the client does not reach the container isolated before on %s: %q %v\n%s", old6, got, err, d.Log())
	}
}
