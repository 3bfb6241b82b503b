package e2e

import (
	"context"
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
