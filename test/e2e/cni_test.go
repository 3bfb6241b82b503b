package e2e

// End-to-end tests of cmd/isolator-cni: libcni (from the same module as the
// plugin's SDK) executes the built plugin binary exactly as a runtime does,
// with a conflist loaded from a configuration directory, against isolatord
// running in a sandbox host namespace. Containers are processes in fresh
// network namespaces whose /proc/PID/ns/net is CNI_NETNS. Traffic is real
// TCP and UDP from the sandbox's client namespace to the shared host IP.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// Plugin-defined error codes of isolator-cni (cmd/isolator-cni/errors.go).
const (
	cniErrPortUnavailable = 100
	cniErrCheckFailed     = 104
)

// cniGet returns the daemon's record of id, or nil when it does not know it.
func cniGet(t *testing.T, d *Daemon, id string) *pb.Container {
	t.Helper()
	resp, err := d.Client.Get(context.Background(), &pb.GetRequest{ContainerId: id})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return resp.GetContainer()
}

// TestCNIEndToEnd: ADD with two port mappings, real traffic reaches the
// container, CHECK passes (and fails on changed mappings), a retried ADD
// gives the same result, DEL removes everything, DEL again succeeds, a
// mapping with NAT is refused with code 7, and DEL succeeds once the
// container's namespace is gone.
func TestCNIEndToEnd(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	bin := Binaries(t)
	nw := newCNINet(t, bin, d.Socket, "isolator", "1.1.0", "")
	ctx := cniCtx(t)
	base := readHostState(t, sb, d.NetNSDir)

	web := startServer(t, sb, "web", 31001, 31002)
	id := sb.Name + "-web"
	rt := cniRuntime(id, web.NetNS, cniPortMappings(31001, 31002), [2]string{"K8S_POD_NAME", "web-0"})

	res, err := nw.CNI.AddNetworkList(ctx, nw.List, rt)
	if err != nil {
		t.Fatalf("ADD: %v\n%s", err, d.Log())
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	veth := plane.VethName(id)
	if r.CNIVersion != "1.1.0" || len(r.Interfaces) != 2 || len(r.IPs) != 1 {
		t.Fatalf("ADD result: %+v", r)
	}
	if r.Interfaces[0].Name != veth || r.Interfaces[0].Sandbox != "" {
		t.Errorf("host interface %+v, want %s on the host", r.Interfaces[0], veth)
	}
	eth0 := r.Interfaces[1]
	if eth0.Name != "eth0" || eth0.Sandbox != web.NetNS || eth0.Mac != sb.HostMAC.String() {
		t.Errorf("container interface %+v, want eth0 in %s with the host MAC %s", eth0, web.NetNS, sb.HostMAC)
	}
	ip := r.IPs[0]
	if *ip.Interface != 1 || ip.Address.String() != "198.18.0.1/24" || !ip.Gateway.Equal(sb.ClientIP) {
		t.Errorf("ip %+v, want 198.18.0.1/24 via %s on eth0", ip, sb.ClientIP)
	}
	if len(r.Routes) != 1 || r.Routes[0].Dst.String() != "0.0.0.0/0" || !r.Routes[0].GW.Equal(sb.ClientIP) {
		t.Errorf("routes %v, want default via %s", r.Routes, sb.ClientIP)
	}

	// The daemon holds the container, isolated, with both ports once each
	// (tcp and udp mappings of one port are one port) and our labels.
	c := cniGet(t, d, id)
	if c == nil || c.GetState() != pb.ContainerState_CONTAINER_STATE_ISOLATED || c.GetNetnsSource() != web.NetNS {
		t.Fatalf("daemon's record after ADD: %v", c)
	}
	if ps := c.GetPorts(); len(ps) != 1 || ps[0].GetBegin() != 31001 || ps[0].GetEnd() != 31002 || ps[0].GetShared() {
		t.Errorf("ports %v, want exclusive 31001-31002", ps)
	}
	if l := c.GetLabels(); l["cni.network"] != "isolator" || l["cni.ifname"] != "eth0" || l["cni.arg.K8S_POD_NAME"] != "web-0" {
		t.Errorf("labels %v", l)
	}

	// Real traffic from outside reaches the container on both ports.
	for _, proto := range []string{"tcp", "udp"} {
		mustEcho(t, sb, proto, 31001, "web")
		mustEcho(t, sb, proto, 31002, "web")
	}

	if err := nw.CNI.CheckNetworkList(ctx, nw.List, rt); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	// CHECK with other port mappings than ADD's fails, naming the ports.
	other := cniRuntime(id, web.NetNS, cniPortMappings(31001))
	err = nw.CNI.CheckNetworkList(ctx, nw.List, other)
	if code, msg := cniErrCode(t, err); code != cniErrCheckFailed || !strings.Contains(msg, "31001-31002") {
		t.Errorf("CHECK with changed mappings: code %d %q", code, msg)
	}

	// A runtime retrying ADD gets the same answer and changes nothing.
	res2, err := nw.CNI.AddNetworkList(ctx, nw.List, rt)
	if err != nil {
		t.Fatalf("repeated ADD: %v", err)
	}
	r2, _ := types100.NewResultFromResult(res2)
	if r2.IPs[0].Address.String() != ip.Address.String() || r2.Interfaces[1].Sandbox != eth0.Sandbox {
		t.Errorf("repeated ADD result differs: %+v", r2)
	}
	mustEcho(t, sb, "tcp", 31001, "web")

	// DEL removes everything: the daemon's record, the veth, the filters,
	// the namespace bind mount; traffic stops.
	if err := nw.CNI.DelNetworkList(ctx, nw.List, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if c := cniGet(t, d, id); c != nil {
		t.Errorf("daemon still holds %s after DEL: %v", id, c)
	}
	if after := readHostState(t, sb, d.NetNSDir); fmt.Sprint(after) != fmt.Sprint(base) {
		t.Errorf("DEL left kernel state behind:\nbefore %+v\nafter  %+v", base, after)
	}
	if got, err := echoFromClient(sb, "tcp", 31001); err == nil {
		t.Errorf("traffic still reaches %q after DEL", got)
	}
	// DEL again (runtimes repeat it) succeeds.
	if err := nw.CNI.DelNetworkList(ctx, nw.List, rt); err != nil {
		t.Errorf("second DEL: %v", err)
	}
	// CHECK of the deleted container fails.
	if err := nw.CNI.CheckNetworkList(ctx, nw.List, rt); err == nil {
		t.Error("CHECK passed after DEL")
	}

	// No NAT: a mapping to another container port is refused with code 7
	// naming the mapping, and nothing is held.
	nat := cniRuntime(id, web.NetNS, []map[string]any{
		{"hostPort": 31001, "containerPort": 31001, "protocol": "tcp"},
		{"hostPort": 31003, "containerPort": 8080, "protocol": "tcp"},
	})
	_, err = nw.CNI.AddNetworkList(ctx, nw.List, nat)
	if code, msg := cniErrCode(t, err); code != types.ErrInvalidNetworkConfig ||
		!strings.Contains(msg, "portMappings[1]") || !strings.Contains(msg, "hostPort: 31003, containerPort: 8080") {
		t.Errorf("ADD with containerPort != hostPort: code %d %q", code, msg)
	}
	if c := cniGet(t, d, id); c != nil {
		t.Errorf("refused ADD left %v", c)
	}
	// The runtime DELs after a failed ADD; that succeeds.
	if err := nw.CNI.DelNetworkList(ctx, nw.List, nat); err != nil {
		t.Errorf("DEL after refused ADD: %v", err)
	}

	// A daemon refusal reaches the runtime with the daemon's message: a
	// port outside the managed static ports.
	_, err = nw.CNI.AddNetworkList(ctx, nw.List, cniRuntime(id, web.NetNS, cniPortMappings(30999)))
	if code, msg := cniErrCode(t, err); code != types.ErrInvalidNetworkConfig || !strings.Contains(msg, "30999") {
		t.Errorf("ADD of an unmanaged port: code %d %q", code, msg)
	}
	if c := cniGet(t, d, id); c != nil {
		t.Errorf("refused ADD left %v", c)
	}
	_ = nw.CNI.DelNetworkList(ctx, nw.List, cniRuntime(id, web.NetNS, cniPortMappings(30999)))

	// A port held by another container: code 100 naming the holder.
	if _, err := nw.CNI.AddNetworkList(ctx, nw.List, rt); err != nil {
		t.Fatalf("ADD again: %v", err)
	}
	thief := sb.StartContainer(t, "thief")
	thiefID := sb.Name + "-thief"
	_, err = nw.CNI.AddNetworkList(ctx, nw.List, cniRuntime(thiefID, thief.NetNS, cniPortMappings(31002)))
	if code, msg := cniErrCode(t, err); code != cniErrPortUnavailable || !strings.Contains(msg, id) {
		t.Errorf("ADD of a held port: code %d %q, want %d naming %s", code, msg, cniErrPortUnavailable, id)
	}
	mustEcho(t, sb, "udp", 31002, "web")

	// The container dies and its namespace with it; DEL still succeeds and
	// removes what the daemon had.
	if err := web.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := nw.CNI.DelNetworkList(ctx, nw.List, rt); err != nil {
		t.Fatalf("DEL after the namespace is gone: %v", err)
	}
	if c := cniGet(t, d, id); c != nil {
		t.Errorf("daemon still holds %s: %v", id, c)
	}
	if after := readHostState(t, sb, d.NetNSDir); fmt.Sprint(after) != fmt.Sprint(base) {
		t.Errorf("DEL of a dead container left kernel state behind:\nbefore %+v\nafter  %+v", base, after)
	}
}

// TestCNIGC: GC removes the containers of its network that are not in
// cni.dev/valid-attachments, and nothing else: not a valid attachment, not
// another network's container, not a container made through the API.
func TestCNIGC(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	bin := Binaries(t)
	nw := newCNINet(t, bin, d.Socket, "isolator", "1.1.0", "")
	blue := newCNINet(t, bin, d.Socket, "blue", "1.1.0", "")
	ctx := cniCtx(t)

	keep := startServer(t, sb, "keep", 31010)
	stale := startServer(t, sb, "stale", 31011)
	bluec := startServer(t, sb, "blue", 31012)
	keepID, staleID, blueID, handID := sb.Name+"-keep", sb.Name+"-stale", sb.Name+"-blue", sb.Name+"-byhand"
	for _, a := range []struct {
		nw *cniNet
		rt *libcni.RuntimeConf
	}{
		{nw, cniRuntime(keepID, keep.NetNS, cniPortMappings(31010))},
		{nw, cniRuntime(staleID, stale.NetNS, cniPortMappings(31011))},
		{blue, cniRuntime(blueID, bluec.NetNS, cniPortMappings(31012))},
	} {
		if _, err := a.nw.CNI.AddNetworkList(ctx, a.nw.List, a.rt); err != nil {
			t.Fatalf("ADD %s: %v", a.rt.ContainerID, err)
		}
	}
	if _, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: handID, Ports: []*pb.PortRange{{Begin: 31013, End: 31013}}}); err != nil {
		t.Fatal(err)
	}
	mustEcho(t, sb, "tcp", 31011, "stale")

	// The runtime lost track of "stale" (its cache is empty too, so libcni
	// DELs nothing itself): only the plugin's GC can find it.
	fresh := nw.withEmptyCache(t)
	err := fresh.CNI.GCNetworkList(ctx, fresh.List, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{
		{ContainerID: keepID, IfName: "eth0"},
	}})
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if c := cniGet(t, d, staleID); c != nil {
		t.Errorf("GC left the stale container: %v", c)
	}
	for _, id := range []string{keepID, blueID, handID} {
		if cniGet(t, d, id) == nil {
			t.Errorf("GC removed %s", id)
		}
	}
	ks := readHostState(t, sb, d.NetNSDir)
	if slices.Contains(ks.veths, plane.VethName(staleID)) || !slices.Contains(ks.veths, plane.VethName(keepID)) {
		t.Errorf("after GC: %+v; want %s gone and %s kept", ks, plane.VethName(staleID), plane.VethName(keepID))
	}
	if got, err := echoFromClient(sb, "tcp", 31011); err == nil {
		t.Errorf("traffic still reaches %q after GC", got)
	}
	mustEcho(t, sb, "tcp", 31010, "keep")
	mustEcho(t, sb, "udp", 31012, "blue")
	if err := nw.CNI.CheckNetworkList(ctx, nw.List, cniRuntime(keepID, keep.NetNS, cniPortMappings(31010))); err != nil {
		t.Errorf("CHECK of the kept container: %v", err)
	}

	// The normal path: libcni DELs cached attachments that are not valid,
	// then runs the plugin's GC. An empty list removes the rest of the network.
	if err := nw.CNI.GCNetworkList(ctx, nw.List, &libcni.GCArgs{}); err != nil {
		t.Fatalf("GC with no valid attachment: %v", err)
	}
	if cniGet(t, d, keepID) != nil {
		t.Error("GC with no valid attachment kept", keepID)
	}
	if cniGet(t, d, blueID) == nil || cniGet(t, d, handID) == nil {
		t.Error("GC of network isolator removed a container of another network or made by hand")
	}
}

// TestCNIStatusAndDaemonDown: STATUS passes with the daemon up and fails
// with 50 when it is stopped; meanwhile ADD and DEL fail with 11 (try again
// later) rather than pretend; after a restart STATUS passes, the container
// survived, CHECK passes and DEL works.
func TestCNIStatusAndDaemonDown(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	bin := Binaries(t)
	nw := newCNINet(t, bin, d.Socket, "isolator", "1.1.0", "")
	ctx := cniCtx(t)

	info, err := nw.CNI.GetVersionInfo(ctx, "isolator-cni")
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	if got := info.SupportedVersions(); !slices.Equal(got, []string{"0.4.0", "1.0.0", "1.1.0"}) {
		t.Errorf("supported versions %v", got)
	}

	if err := nw.CNI.GetStatusNetworkList(ctx, nw.List); err != nil {
		t.Fatalf("STATUS with the daemon up: %v", err)
	}
	web := startServer(t, sb, "web", 31020)
	id := sb.Name + "-web"
	rt := cniRuntime(id, web.NetNS, cniPortMappings(31020))
	if _, err := nw.CNI.AddNetworkList(ctx, nw.List, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}

	d.Stop()
	err = nw.CNI.GetStatusNetworkList(ctx, nw.List)
	if code, msg := cniErrCode(t, err); code != types.ErrPluginNotAvailable || !strings.Contains(msg, d.Socket) {
		t.Errorf("STATUS with the daemon stopped: code %d %q, want 50 naming the socket", code, msg)
	}
	// Traffic keeps flowing while the daemon is down.
	mustEcho(t, sb, "tcp", 31020, "web")
	if err := nw.CNI.DelNetworkList(ctx, nw.List, rt); err == nil {
		t.Error("DEL succeeded with the daemon down: the ports' fate is unknown, the runtime must retry")
	} else if code, _ := cniErrCode(t, err); code != types.ErrTryAgainLater {
		t.Errorf("DEL with the daemon down: code %d, want 11", code)
	}
	other := sb.StartContainer(t, "other")
	_, err = nw.CNI.AddNetworkList(ctx, nw.List, cniRuntime(sb.Name+"-other", other.NetNS, nil))
	if code, _ := cniErrCode(t, err); code != types.ErrTryAgainLater {
		t.Errorf("ADD with the daemon down: code %d, want 11", code)
	}

	d.Start()
	if err := nw.CNI.GetStatusNetworkList(ctx, nw.List); err != nil {
		t.Fatalf("STATUS after restart: %v", err)
	}
	if err := nw.CNI.CheckNetworkList(ctx, nw.List, rt); err != nil {
		t.Errorf("CHECK after the daemon restarted: %v", err)
	}
	if err := nw.CNI.DelNetworkList(ctx, nw.List, rt); err != nil {
		t.Fatalf("DEL after restart: %v", err)
	}
	if cniGet(t, d, id) != nil {
		t.Error("container survived DEL")
	}
}

// TestCNIVersion040AndSharedPorts: a 0.4.0 conflist gets 0.4.0 results and
// CHECK; a network's sharedPorts are held shared by all its containers,
// whose SO_REUSEPORT servers both get traffic through the host IP.
func TestCNIVersion040AndSharedPorts(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	bin := Binaries(t)
	nw := newCNINet(t, bin, d.Socket, "quic", "0.4.0", `, "sharedPorts": [31443]`)
	ctx := cniCtx(t)

	names := []string{"a", "b"}
	rts := map[string]*libcni.RuntimeConf{}
	for _, n := range names {
		c := sb.StartContainer(t, n, traffic.BinaryPath(t), "serve", "--tcp", ":31443", "--udp", ":31443", "--name", n, "--reuseport")
		c.WaitFor(t, "ready", 10*time.Second)
		rt := cniRuntime(sb.Name+"-"+n, c.NetNS, cniPortMappings(31443))
		res, err := nw.CNI.AddNetworkList(ctx, nw.List, rt)
		if err != nil {
			t.Fatalf("ADD %s: %v", n, err)
		}
		r, ok := res.(*types040.Result)
		if !ok || r.CNIVersion != "0.4.0" || len(r.IPs) != 1 || r.IPs[0].Address.String() != "198.18.0.1/24" {
			t.Fatalf("ADD %s: 0.4.0 result %#v", n, res)
		}
		rts[n] = rt
		got := cniGet(t, d, rt.ContainerID)
		if ps := got.GetPorts(); len(ps) != 1 || ps[0].GetBegin() != 31443 || !ps[0].GetShared() {
			t.Errorf("%s ports %v, want shared 31443", n, ps)
		}
	}
	for _, n := range names {
		if err := nw.CNI.CheckNetworkList(ctx, nw.List, rts[n]); err != nil {
			t.Errorf("CHECK %s: %v", n, err)
		}
	}
	// New TCP connections are spread over both holders (bounded tries).
	seen := map[string]bool{}
	for i := 0; i < 64 && len(seen) < 2; i++ {
		if got, err := echoFromClient(sb, "tcp", 31443); err == nil {
			seen[got] = true
		}
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("shared port 31443 reached %v, want both a and b", seen)
	}
	for _, n := range names {
		if err := nw.CNI.DelNetworkList(ctx, nw.List, rts[n]); err != nil {
			t.Errorf("DEL %s: %v", n, err)
		}
	}
}
