package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
)

// fakeDaemon is an in-memory isolatord with the API's semantics that matter
// to the plugin: idempotent Prepare and Isolate, AlreadyExists on other
// ports or another namespace, exclusive port conflicts, Cleanup of unknown
// containers succeeding. It serves real gRPC on a unix socket.
type fakeDaemon struct {
	pbgrpc.UnimplementedIsolatorServer
	mu         sync.Mutex
	ctrs       map[string]*pb.Container
	calls      []string
	isolateErr error // returned by Isolate when set
	cleanupErr error // returned by Cleanup when set
	// eth0 is what a successful Attach reports of the container's
	// interface (nil: nothing, as for a container isolated before the call).
	eth0 *pb.AttachResponse_Interface
}

func (f *fakeDaemon) record(s string) {
	f.calls = append(f.calls, s)
}

func (f *fakeDaemon) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Status")
	return &pb.StatusResponse{Version: "fake", HostIp: "198.18.0.1", HostInterface: "eth0", Containers: uint32(len(f.ctrs))}, nil
}

func (f *fakeDaemon) Prepare(ctx context.Context, r *pb.PrepareRequest) (*pb.PrepareResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Prepare " + r.GetContainerId())
	return f.prepare(r)
}

func (f *fakeDaemon) prepare(r *pb.PrepareRequest) (*pb.PrepareResponse, error) {
	want := portsOf(r.GetPorts())
	if c, ok := f.ctrs[r.GetContainerId()]; ok {
		if have := portsOf(c.GetPorts()); !have.Equal(want) {
			return nil, status.Errorf(codes.AlreadyExists, "container_id: %s is already prepared with ports %s (asked for %s)", c.GetContainerId(), have, want)
		}
		return &pb.PrepareResponse{Container: clone(c)}, nil
	}
	for _, c := range f.ctrs {
		have := portsOf(c.GetPorts())
		if both := have.Exclusive.Union(have.Shared).Intersect(want.Exclusive); !both.Empty() {
			return nil, status.Errorf(codes.FailedPrecondition, "ports: port %s is held by %s", both, c.GetContainerId())
		}
	}
	c := &pb.Container{
		ContainerId:    r.GetContainerId(),
		State:          pb.ContainerState_CONTAINER_STATE_PREPARED,
		EphemeralPorts: &pb.EphemeralRange{Begin: 32768, End: 33023},
		Ports:          r.GetPorts(),
		Labels:         r.GetLabels(),
	}
	f.ctrs[c.ContainerId] = c
	return &pb.PrepareResponse{Container: clone(c)}, nil
}

func (f *fakeDaemon) Isolate(ctx context.Context, r *pb.IsolateRequest) (*pb.IsolateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Isolate " + r.GetContainerId())
	return f.isolate(r)
}

func (f *fakeDaemon) isolate(r *pb.IsolateRequest) (*pb.IsolateResponse, error) {
	c, ok := f.ctrs[r.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "container_id: %s is not prepared", r.GetContainerId())
	}
	if c.State == pb.ContainerState_CONTAINER_STATE_ISOLATED {
		if c.NetnsSource == r.GetNetnsPath() {
			return &pb.IsolateResponse{Container: clone(c)}, nil
		}
		return nil, status.Errorf(codes.AlreadyExists, "container_id: %s is already isolated (netns %s)", c.ContainerId, c.NetnsSource)
	}
	if f.isolateErr != nil {
		return nil, f.isolateErr
	}
	c.State = pb.ContainerState_CONTAINER_STATE_ISOLATED
	c.NetnsSource = r.GetNetnsPath()
	c.Veth = "iso0123456789ab"
	c.Netns = "/var/run/netns/isolator-" + c.ContainerId
	return &pb.IsolateResponse{Container: clone(c)}, nil
}

// Attach is Prepare then Isolate with the daemon's require_labels and
// rollback.
func (f *fakeDaemon) Attach(ctx context.Context, r *pb.AttachRequest) (*pb.AttachResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Attach " + r.GetPrepare().GetContainerId())
	prep, err := f.prepare(r.GetPrepare())
	if err != nil {
		return nil, err
	}
	c := prep.GetContainer()
	if !hasLabels(c, r.GetRequireLabels()) {
		return &pb.AttachResponse{Container: c, LabelsDiffer: true}, nil
	}
	was := c.GetState() == pb.ContainerState_CONTAINER_STATE_ISOLATED
	iso, err := f.isolate(&pb.IsolateRequest{ContainerId: c.GetContainerId(), Target: &pb.IsolateRequest_NetnsPath{NetnsPath: r.GetNetnsPath()}})
	if err != nil {
		if !was {
			delete(f.ctrs, c.GetContainerId())
		}
		return nil, err
	}
	return &pb.AttachResponse{Container: iso.GetContainer(), WasIsolated: was, Eth0: f.eth0}, nil
}

func hasLabels(c *pb.Container, want map[string]string) bool {
	for k, v := range want {
		if got, ok := c.GetLabels()[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (f *fakeDaemon) Cleanup(ctx context.Context, r *pb.CleanupRequest) (*pb.CleanupResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Cleanup " + r.GetContainerId())
	if f.cleanupErr != nil {
		return nil, f.cleanupErr
	}
	if c, ok := f.ctrs[r.GetContainerId()]; ok && !hasLabels(c, r.GetRequireLabels()) {
		return &pb.CleanupResponse{Kept: true}, nil
	}
	delete(f.ctrs, r.GetContainerId())
	return &pb.CleanupResponse{}, nil
}

func (f *fakeDaemon) Get(ctx context.Context, r *pb.GetRequest) (*pb.GetResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Get " + r.GetContainerId())
	c, ok := f.ctrs[r.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container_id: %s is not known", r.GetContainerId())
	}
	return &pb.GetResponse{Container: clone(c)}, nil
}

func (f *fakeDaemon) List(ctx context.Context, _ *pb.ListRequest) (*pb.ListResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("List")
	var out []*pb.Container
	for _, c := range f.ctrs {
		out = append(out, clone(c))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ContainerId < out[j].ContainerId })
	return &pb.ListResponse{Containers: out}, nil
}

func clone(c *pb.Container) *pb.Container {
	b, _ := json.Marshal(c)
	out := &pb.Container{}
	_ = json.Unmarshal(b, out)
	return out
}

func (f *fakeDaemon) put(c *pb.Container) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctrs[c.ContainerId] = c
}

func (f *fakeDaemon) has(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.ctrs[id]
	return ok
}

func (f *fakeDaemon) callLog() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.calls, "; ")
}

// env is a fake daemon on a socket and a plugin pointed at it.
type env struct {
	daemon *fakeDaemon
	socket string
	plugin *Plugin
	out    *bytes.Buffer
	stop   func()
}

func newEnv(t *testing.T) *env {
	t.Helper()
	// A short directory: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "icni")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "d.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDaemon{ctrs: map[string]*pb.Container{}}
	srv := grpc.NewServer()
	pbgrpc.RegisterIsolatorServer(srv, d)
	go srv.Serve(lis)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			srv.Stop()
		}
	}
	t.Cleanup(stop)
	out := &bytes.Buffer{}
	p := newPlugin(out)
	p.Timeout, p.StatusTimeout, p.DialTimeout, p.DaemonWait = 10*time.Second, 2*time.Second, 2*time.Second, 0
	p.ReadNS = func(nsPath, ifname string) (nsIface, error) {
		if nsPath == "/gone" {
			return nsIface{}, errors.New("open network namespace /gone: no such file or directory")
		}
		return nsIface{
			MAC:     net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
			MTU:     1500,
			Addrs:   []net.IPNet{{IP: net.IPv4(198, 18, 0, 1).To4(), Mask: net.CIDRMask(24, 32)}},
			Gateway: net.IPv4(198, 18, 0, 2).To4(),
		}, nil
	}
	return &env{daemon: d, socket: sock, plugin: p, out: out, stop: stop}
}

// conf is a network configuration for the fake daemon's socket.
func (e *env) conf(version, extra string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":%q,"name":"isolator","type":"isolator-cni","socket":%q%s}`, version, e.socket, extra))
}

func cmdArgs(id string, stdin []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: id, Netns: "/run/netns/" + id, IfName: "eth0", StdinData: stdin}
}

const twoMappings = `,"runtimeConfig":{"portMappings":[
	{"hostPort":31001,"containerPort":31001,"protocol":"tcp"},
	{"hostPort":31001,"containerPort":31001,"protocol":"udp"},
	{"hostPort":31002,"containerPort":31002,"protocol":"tcp"}]}`

func TestAddReportsEth0WithHostAddress(t *testing.T) {
	e := newEnv(t)
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings))); err != nil {
		t.Fatal(err)
	}
	res, err := types100.NewResult(e.out.Bytes())
	if err != nil {
		t.Fatalf("result %s: %v", e.out, err)
	}
	r := res.(*types100.Result)
	if r.CNIVersion != "1.1.0" || len(r.Interfaces) != 2 || len(r.IPs) != 1 || len(r.Routes) != 1 {
		t.Fatalf("result = %s", e.out)
	}
	host, ctr := r.Interfaces[0], r.Interfaces[1]
	if host.Name != "iso0123456789ab" || host.Sandbox != "" {
		t.Errorf("host interface = %+v", host)
	}
	if ctr.Name != "eth0" || ctr.Sandbox != "/run/netns/c1" || ctr.Mac != "02:00:00:00:00:01" || ctr.Mtu != 1500 {
		t.Errorf("container interface = %+v", ctr)
	}
	ip := r.IPs[0]
	if *ip.Interface != 1 || ip.Address.String() != "198.18.0.1/24" || ip.Gateway.String() != "198.18.0.2" {
		t.Errorf("ip = %+v", ip)
	}
	if r.Routes[0].Dst.String() != "0.0.0.0/0" || r.Routes[0].GW.String() != "198.18.0.2" {
		t.Errorf("route = %+v", r.Routes[0])
	}
	got := e.daemon.ctrs["c1"]
	if ports := portsOf(got.Ports).String(); ports != "31001-31002" {
		t.Errorf("daemon holds ports %q, want 31001-31002", ports)
	}
	if got.Labels[LabelNetwork] != "isolator" || got.Labels[LabelIfName] != "eth0" {
		t.Errorf("labels = %v", got.Labels)
	}
	if got.NetnsSource != "/run/netns/c1" {
		t.Errorf("isolated into %q", got.NetnsSource)
	}

	// A retried ADD (runtime timeout) gives the same result.
	first := e.out.String()
	e.out.Reset()
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings))); err != nil {
		t.Fatalf("repeated ADD: %v", err)
	}
	if e.out.String() != first {
		t.Errorf("repeated ADD result differs:\n%s\n%s", first, e.out)
	}
}

func TestAddOldVersionResult(t *testing.T) {
	e := newEnv(t)
	if err := e.plugin.Add(cmdArgs("c1", e.conf("0.4.0", ""))); err != nil {
		t.Fatal(err)
	}
	res, err := types040.NewResult(e.out.Bytes())
	if err != nil {
		t.Fatalf("0.4.0 result %s: %v", e.out, err)
	}
	r := res.(*types040.Result)
	if r.CNIVersion != "0.4.0" || len(r.IPs) != 1 || r.IPs[0].Address.String() != "198.18.0.1/24" {
		t.Errorf("result = %s", e.out)
	}
}

func TestAddRollsBackWhenIsolateFails(t *testing.T) {
	e := newEnv(t)
	e.daemon.isolateErr = status.Error(codes.Internal, "isolate c1: veth: file exists")
	err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings)))
	ce := cniErr(t, err, types.ErrInternal)
	if ce.Msg != "isolate c1: veth: file exists" {
		t.Errorf("message = %q, want the daemon's", ce.Msg)
	}
	if e.daemon.has("c1") {
		t.Errorf("c1 still held after failed ADD; calls: %s", e.daemon.callLog())
	}
	// The daemon undid its own Attach: one call.
	if got := e.daemon.callLog(); got != "Attach c1" {
		t.Errorf("calls = %q, want Attach c1 alone", got)
	}

	// Netns missing: code 8 from the daemon's NOT_FOUND on netns_path.
	e.daemon.isolateErr = status.Error(codes.NotFound, "netns_path: /run/netns/c2: no such file or directory")
	cniErr(t, e.plugin.Add(cmdArgs("c2", e.conf("1.1.0", ""))), types.ErrInvalidNetNS)
	if e.daemon.has("c2") {
		t.Error("c2 still held")
	}

	// Reading the interface fails after Isolate: rolled back too.
	e.daemon.isolateErr = nil
	a := cmdArgs("c3", e.conf("1.1.0", ""))
	a.Netns = "/gone"
	ce = cniErr(t, e.plugin.Add(a), types.ErrInternal)
	if !strings.Contains(ce.Msg, "/gone") {
		t.Errorf("message = %q", ce.Msg)
	}
	if e.daemon.has("c3") {
		t.Error("c3 still held")
	}
}

func TestAddRetryDoesNotRollBackWorkingContainer(t *testing.T) {
	e := newEnv(t)
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", ""))); err != nil {
		t.Fatal(err)
	}
	// Same container, another namespace: the daemon refuses, the isolated
	// container stays.
	a := cmdArgs("c1", e.conf("1.1.0", ""))
	a.Netns = "/run/netns/other"
	cniErr(t, e.plugin.Add(a), ErrContainerExists)
	if !e.daemon.has("c1") {
		t.Error("a refused ADD removed the working container")
	}
}

func TestAddErrorsFromDaemon(t *testing.T) {
	e := newEnv(t)
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings))); err != nil {
		t.Fatal(err)
	}
	// Port held by c1.
	ce := cniErr(t, e.plugin.Add(cmdArgs("c2", e.conf("1.1.0", twoMappings))), ErrPortUnavailable)
	if !strings.Contains(ce.Msg, "held by c1") {
		t.Errorf("message = %q, want the holder", ce.Msg)
	}
	// c1 again with other ports.
	ce = cniErr(t, e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", ""))), ErrContainerExists)
	if !strings.Contains(ce.Msg, "already prepared") {
		t.Errorf("message = %q", ce.Msg)
	}
	if !e.daemon.has("c1") {
		t.Error("c1 removed by a refused ADD")
	}
}

func TestAddRefusesContainersOfOthers(t *testing.T) {
	e := newEnv(t)
	e.daemon.put(&pb.Container{ContainerId: "byhand", State: pb.ContainerState_CONTAINER_STATE_PREPARED})
	e.daemon.put(&pb.Container{ContainerId: "other", State: pb.ContainerState_CONTAINER_STATE_PREPARED,
		Labels: map[string]string{LabelNetwork: "blue", LabelIfName: "eth0"}})
	ce := cniErr(t, e.plugin.Add(cmdArgs("byhand", e.conf("1.1.0", ""))), ErrContainerExists)
	if !strings.Contains(ce.Msg, "outside CNI") {
		t.Errorf("message = %q", ce.Msg)
	}
	ce = cniErr(t, e.plugin.Add(cmdArgs("other", e.conf("1.1.0", ""))), ErrContainerExists)
	if !strings.Contains(ce.Msg, `"blue"`) {
		t.Errorf("message = %q", ce.Msg)
	}
	if !e.daemon.has("byhand") || !e.daemon.has("other") {
		t.Error("ADD removed a container it does not own")
	}
	if strings.Contains(e.daemon.callLog(), "Isolate") {
		t.Errorf("ADD isolated a container it does not own: %s", e.daemon.callLog())
	}
}

func TestAddRefusesBeforeCallingDaemon(t *testing.T) {
	e := newEnv(t)
	ce := cniErr(t, e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", `,"runtimeConfig":{"portMappings":[{"hostPort":31001,"containerPort":80,"protocol":"tcp"}]}`))), types.ErrInvalidNetworkConfig)
	if !strings.Contains(ce.Msg, "hostPort: 31001, containerPort: 80") {
		t.Errorf("message = %q should name the mapping", ce.Msg)
	}
	a := cmdArgs("c1", e.conf("1.1.0", ""))
	a.IfName = "net1"
	cniErr(t, e.plugin.Add(a), types.ErrInvalidEnvironmentVariables)
	cniErr(t, e.plugin.Add(cmdArgs(strings.Repeat("x", 129), e.conf("1.1.0", ""))), types.ErrInvalidEnvironmentVariables)
	// An earlier plugin created eth0 already.
	prev := `,"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c1"}]}`
	cniErr(t, e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", prev))), types.ErrInvalidNetworkConfig)
	if strings.Contains(e.daemon.callLog(), "Prepare") {
		t.Errorf("daemon asked to prepare: %s", e.daemon.callLog())
	}
}

func TestAddChainsAfterLoopback(t *testing.T) {
	e := newEnv(t)
	prev := `,"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"lo","sandbox":"/run/netns/c1"}],"ips":[{"interface":0,"address":"127.0.0.1/8"}]}`
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", prev))); err != nil {
		t.Fatal(err)
	}
	res, err := types100.NewResult(e.out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	r := res.(*types100.Result)
	if len(r.Interfaces) != 3 || r.Interfaces[0].Name != "lo" || len(r.IPs) != 2 || *r.IPs[1].Interface != 2 {
		t.Errorf("chained result = %s", e.out)
	}
}

func TestDel(t *testing.T) {
	e := newEnv(t)
	conf := e.conf("1.1.0", twoMappings)
	if err := e.plugin.Add(cmdArgs("c1", conf)); err != nil {
		t.Fatal(err)
	}
	if err := e.plugin.Del(cmdArgs("c1", conf)); err != nil {
		t.Fatal(err)
	}
	if e.daemon.has("c1") {
		t.Fatal("c1 still held after DEL")
	}
	if err := e.plugin.Del(cmdArgs("c1", conf)); err != nil {
		t.Errorf("repeated DEL: %v", err)
	}
	// Netns already gone: CNI_NETNS empty.
	a := cmdArgs("never-added", conf)
	a.Netns = ""
	if err := e.plugin.Del(a); err != nil {
		t.Errorf("DEL of unknown container without netns: %v", err)
	}
	// IDs and interfaces ADD would refuse: nothing to delete.
	if err := e.plugin.Del(cmdArgs(strings.Repeat("x", 200), conf)); err != nil {
		t.Errorf("DEL of an overlong ID: %v", err)
	}

	// Containers of another network or made by hand are left alone.
	e.daemon.put(&pb.Container{ContainerId: "other", Labels: map[string]string{LabelNetwork: "blue", LabelIfName: "eth0"}})
	e.daemon.put(&pb.Container{ContainerId: "byhand"})
	for _, id := range []string{"other", "byhand"} {
		if err := e.plugin.Del(cmdArgs(id, conf)); err != nil {
			t.Errorf("DEL %s: %v", id, err)
		}
		if !e.daemon.has(id) {
			t.Errorf("DEL removed %s, which is not this network's", id)
		}
	}

	// The daemon's failure is the runtime's to retry.
	if err := e.plugin.Add(cmdArgs("c2", conf)); err != nil {
		t.Fatal(err)
	}
	e.daemon.cleanupErr = status.Error(codes.Internal, "cleanup of c2: netlink: device busy")
	ce := cniErr(t, e.plugin.Del(cmdArgs("c2", conf)), types.ErrInternal)
	if ce.Msg != "cleanup of c2: netlink: device busy" {
		t.Errorf("message = %q", ce.Msg)
	}

	// Daemon down: try again later, not success.
	e.stop()
	ce = cniErr(t, e.plugin.Del(cmdArgs("c2", conf)), types.ErrTryAgainLater)
	if !strings.Contains(ce.Msg, e.socket) {
		t.Errorf("message = %q should name the socket", ce.Msg)
	}
}

func TestCheck(t *testing.T) {
	e := newEnv(t)
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings))); err != nil {
		t.Fatal(err)
	}
	prev := `,"prevResult":` + e.out.String()
	if err := e.plugin.Check(cmdArgs("c1", e.conf("1.1.0", twoMappings+prev))); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}

	// Port mappings changed since ADD.
	ce := cniErr(t, e.plugin.Check(cmdArgs("c1", e.conf("1.1.0", prev))), ErrCheckFailed)
	if !strings.Contains(ce.Msg, "holds ports 31001-31002") {
		t.Errorf("message = %q", ce.Msg)
	}
	// Another namespace than the one isolated.
	a := cmdArgs("c1", e.conf("1.1.0", twoMappings+prev))
	a.Netns = "/run/netns/elsewhere"
	cniErr(t, e.plugin.Check(a), ErrCheckFailed)
	// prevResult with another address.
	bad := strings.Replace(prev, "198.18.0.1/24", "198.18.0.1/32", 1)
	ce = cniErr(t, e.plugin.Check(cmdArgs("c1", e.conf("1.1.0", twoMappings+bad))), ErrCheckFailed)
	if !strings.Contains(ce.Msg, "198.18.0.1/32") {
		t.Errorf("message = %q", ce.Msg)
	}
	// prevResult with another MAC.
	bad = strings.Replace(prev, "02:00:00:00:00:01", "02:00:00:00:00:99", 1)
	cniErr(t, e.plugin.Check(cmdArgs("c1", e.conf("1.1.0", twoMappings+bad))), ErrCheckFailed)
	// Without prevResult.
	cniErr(t, e.plugin.Check(cmdArgs("c1", e.conf("1.1.0", twoMappings))), types.ErrInvalidNetworkConfig)
	// Only prepared.
	e.daemon.put(&pb.Container{ContainerId: "c2", State: pb.ContainerState_CONTAINER_STATE_PREPARED,
		Labels: map[string]string{LabelNetwork: "isolator", LabelIfName: "eth0"}})
	ce = cniErr(t, e.plugin.Check(cmdArgs("c2", e.conf("1.1.0", prev))), ErrCheckFailed)
	if !strings.Contains(ce.Msg, "prepared") {
		t.Errorf("message = %q", ce.Msg)
	}
	// Gone from the daemon.
	e.daemon.Cleanup(context.Background(), &pb.CleanupRequest{ContainerId: "c1"})
	cniErr(t, e.plugin.Check(cmdArgs("c1", e.conf("1.1.0", twoMappings+prev))), types.ErrUnknownContainer)
}

func TestGC(t *testing.T) {
	e := newEnv(t)
	conf := e.conf("1.1.0", "")
	for _, id := range []string{"keep", "stale1", "stale2"} {
		if err := e.plugin.Add(cmdArgs(id, conf)); err != nil {
			t.Fatal(err)
		}
	}
	e.daemon.put(&pb.Container{ContainerId: "other", Labels: map[string]string{LabelNetwork: "blue", LabelIfName: "eth0"}})
	e.daemon.put(&pb.Container{ContainerId: "byhand"})

	gc := e.conf("1.1.0", `,"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"eth0"},{"containerID":"stale2","ifname":"eth1"}]`)
	if err := e.plugin.GC(&skel.CmdArgs{StdinData: gc}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"keep": true, "stale1": false, "stale2": false, "other": true, "byhand": true} {
		if got := e.daemon.has(id); got != want {
			t.Errorf("after GC, %s held = %v, want %v", id, got, want)
		}
	}

	// Without the list GC refuses rather than remove everything.
	cniErr(t, e.plugin.GC(&skel.CmdArgs{StdinData: conf}), types.ErrInvalidNetworkConfig)
	if !e.daemon.has("keep") {
		t.Error("GC without a list removed a container")
	}

	// Failures are reported, after trying every container.
	for _, id := range []string{"s3", "s4"} {
		if err := e.plugin.Add(cmdArgs(id, conf)); err != nil {
			t.Fatal(err)
		}
	}
	e.daemon.cleanupErr = status.Error(codes.Internal, "teardown failed")
	ce := cniErr(t, e.plugin.GC(&skel.CmdArgs{StdinData: gc}), types.ErrInternal)
	if !strings.Contains(ce.Msg, "2 cleanups failed") {
		t.Errorf("message = %q", ce.Msg)
	}
}

func TestStatus(t *testing.T) {
	e := newEnv(t)
	if err := e.plugin.Status(&skel.CmdArgs{StdinData: e.conf("1.1.0", "")}); err != nil {
		t.Fatalf("STATUS with the daemon up: %v", err)
	}
	e.stop()
	start := time.Now()
	ce := cniErr(t, e.plugin.Status(&skel.CmdArgs{StdinData: e.conf("1.1.0", "")}), types.ErrPluginNotAvailable)
	if !strings.Contains(ce.Msg, e.socket) {
		t.Errorf("message = %q should name the socket", ce.Msg)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("STATUS took %v with the daemon down", d)
	}
	noSock := []byte(`{"cniVersion":"1.1.0","name":"isolator","socket":"/nonexistent/isolatord.sock"}`)
	cniErr(t, e.plugin.Status(&skel.CmdArgs{StdinData: noSock}), types.ErrPluginNotAvailable)
}

// failWriter fails every write, like a runtime that closed the plugin's
// stdout.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// TestAddRollsBackWhenResultCannotBeGiven: when the result cannot be made
// in the caller's version, or cannot be written, the runtime never learns
// of the container and would never DEL it, so ADD undoes its work.
func TestAddRollsBackWhenResultCannotBeGiven(t *testing.T) {
	e := newEnv(t)
	err := e.plugin.Add(cmdArgs("c1", e.conf("9.9.9", twoMappings)))
	if err == nil {
		t.Fatal("ADD with cniVersion 9.9.9 succeeded")
	}
	if e.daemon.has("c1") {
		t.Errorf("c1 still held after its result could not be converted; calls: %s", e.daemon.callLog())
	}
	if got := e.daemon.callLog(); got != "Attach c1; Cleanup c1" {
		t.Errorf("no rollback: %s", got)
	}

	e.plugin.Stdout = failWriter{}
	ce := cniErr(t, e.plugin.Add(cmdArgs("c2", e.conf("1.0.0", twoMappings))), types.ErrIOFailure)
	if !strings.Contains(ce.Msg, "broken pipe") {
		t.Errorf("message = %q", ce.Msg)
	}
	if e.daemon.has("c2") {
		t.Errorf("c2 still held after its result could not be written; calls: %s", e.daemon.callLog())
	}
}

// portsOf is the port request a container of the fake daemon holds.
func portsOf(ps []*pb.PortRange) PortRequest { return portRequestFromProto(ps) }
