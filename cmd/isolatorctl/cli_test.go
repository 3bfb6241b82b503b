package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/isolatord/isolatord/api"
	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// fakeServer is a minimal in-memory Isolator for the CLI tests: it keeps
// containers, hands out 1024-port ephemeral blocks, refuses exclusive port
// conflicts, and records every request it gets.
type fakeServer struct {
	isolatordv1grpc.UnimplementedIsolatorServer

	mu         sync.Mutex
	containers map[string]*isolatordv1.Container
	nextBlock  uint32
	requests   []proto.Message
}

var created = time.Date(2026, 11, 22, 16, 0, 0, 0, time.UTC)

func (f *fakeServer) record(m proto.Message) {
	f.requests = append(f.requests, proto.Clone(m))
}

func (f *fakeServer) lastRequest() proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		return nil
	}
	return f.requests[len(f.requests)-1]
}

func (f *fakeServer) requestCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

func (f *fakeServer) find(id string) (*isolatordv1.Container, error) {
	c, ok := f.containers[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %q not found", id)
	}
	return c, nil
}

// conflict reports the first port of ports held exclusively by another
// container, as the daemon would.
func (f *fakeServer) conflict(id string, ports []*isolatordv1.PortRange) error {
	for _, p := range ports {
		for _, other := range f.containers {
			if other.GetContainerId() == id {
				continue
			}
			for _, q := range other.GetPorts() {
				if q.GetShared() && p.GetShared() {
					continue
				}
				if p.GetBegin() <= q.GetEnd() && q.GetBegin() <= p.GetEnd() {
					port := max(p.GetBegin(), q.GetBegin())
					return status.Errorf(codes.FailedPrecondition, "port %d is held exclusively by %s", port, other.GetContainerId())
				}
			}
		}
	}
	return nil
}

func (f *fakeServer) Prepare(_ context.Context, req *isolatordv1.PrepareRequest) (*isolatordv1.PrepareResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(req)
	if req.GetContainerId() == "" {
		return nil, status.Error(codes.InvalidArgument, "container_id: empty")
	}
	if _, ok := f.containers[req.GetContainerId()]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "container %q already exists", req.GetContainerId())
	}
	if err := f.conflict(req.GetContainerId(), req.GetPorts()); err != nil {
		return nil, err
	}
	begin := 32768 + 1024*f.nextBlock
	f.nextBlock++
	c := &isolatordv1.Container{
		ContainerId:    req.GetContainerId(),
		State:          isolatordv1.ContainerState_CONTAINER_STATE_PREPARED,
		EphemeralPorts: &isolatordv1.EphemeralRange{Begin: begin, End: begin + 1023},
		Ports:          req.GetPorts(),
		CreatedAt:      timestamppb.New(created),
		EgressLimit:    nonZeroLimit(req.GetEgressLimit()),
		IngressLimit:   nonZeroLimit(req.GetIngressLimit()),
	}
	f.containers[c.ContainerId] = c
	return &isolatordv1.PrepareResponse{Container: c}, nil
}

func (f *fakeServer) Isolate(_ context.Context, req *isolatordv1.IsolateRequest) (*isolatordv1.IsolateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(req)
	c, err := f.find(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if c.State != isolatordv1.ContainerState_CONTAINER_STATE_PREPARED {
		return nil, status.Errorf(codes.FailedPrecondition, "container %s is already isolated", c.ContainerId)
	}
	c.State = isolatordv1.ContainerState_CONTAINER_STATE_ISOLATED
	c.Veth = "veth-" + c.ContainerId
	c.Netns = "/var/run/netns/isolator-" + c.ContainerId
	c.PinOwned = true
	switch t := req.GetTarget().(type) {
	case *isolatordv1.IsolateRequest_Pid:
		c.Pid = t.Pid
		c.NetnsSource = fmt.Sprintf("pid:%d", t.Pid)
	case *isolatordv1.IsolateRequest_NetnsPath:
		c.NetnsSource = t.NetnsPath
	default:
		return nil, status.Error(codes.InvalidArgument, "target: missing")
	}
	c.IsolatedAt = timestamppb.New(created.Add(time.Second))
	return &isolatordv1.IsolateResponse{Container: c}, nil
}

func (f *fakeServer) Update(_ context.Context, req *isolatordv1.UpdateRequest) (*isolatordv1.UpdateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(req)
	c, err := f.find(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if err := f.conflict(c.ContainerId, req.GetPorts()); err != nil {
		return nil, err
	}
	if !req.GetKeepPorts() {
		c.Ports = req.GetPorts()
	}
	if l := req.GetEgressLimit(); l != nil {
		c.EgressLimit = nonZeroLimit(l)
	}
	if l := req.GetIngressLimit(); l != nil {
		c.IngressLimit = nonZeroLimit(l)
	}
	return &isolatordv1.UpdateResponse{Container: c}, nil
}

func (f *fakeServer) Usage(_ context.Context, req *isolatordv1.UsageRequest) (*isolatordv1.UsageResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(req)
	c, err := f.find(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return &isolatordv1.UsageResponse{
		ContainerId:    c.ContainerId,
		EphemeralPorts: c.EphemeralPorts,
		Traffic: &isolatordv1.TrafficStats{
			RxBytes: 123456, RxPackets: 789, RxErrors: 1, RxDropped: 2,
			TxBytes: 654321, TxPackets: 987, TxErrors: 3, TxDropped: 4,
		},
		Tcp: &isolatordv1.TcpStats{
			ActiveConnections:   5,
			TimeWaitConnections: 6,
			Rtt:                 &isolatordv1.RttPercentiles{P50Us: 120, P90Us: 480, P95Us: 950, P99Us: 2500, Samples: 5},
		},
		Snmp: &isolatordv1.SnmpStats{
			Ip:  map[string]uint64{"InReceives": 1000, "OutRequests": 900},
			Tcp: map[string]uint64{"RetransSegs": 7, "ActiveOpens": 3},
			Udp: map[string]uint64{"InDatagrams": 11},
		},
		CollectedAt:    timestamppb.New(created.Add(time.Minute)),
		EgressShaping:  fakeShaping(c.GetEgressLimit()),
		IngressShaping: fakeShaping(c.GetIngressLimit()),
	}, nil
}

// nonZeroLimit is nil for no limit, as the daemon reports it.
func nonZeroLimit(l *isolatordv1.BandwidthLimit) *isolatordv1.BandwidthLimit {
	if l.GetRate() == 0 {
		return nil
	}
	return l
}

func fakeShaping(l *isolatordv1.BandwidthLimit) *isolatordv1.ShapingStats {
	if l == nil {
		return nil
	}
	return &isolatordv1.ShapingStats{Limit: l, Enforced: true, Queue: "bfifo", Bytes: 5000, Packets: 40, Drops: 3, Overlimits: 17, BacklogBytes: 3000, BacklogPackets: 2}
}

func (f *fakeServer) Cleanup(_ context.Context, req *isolatordv1.CleanupRequest) (*isolatordv1.CleanupResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(req)
	if _, err := f.find(req.GetContainerId()); err != nil {
		return nil, err
	}
	delete(f.containers, req.GetContainerId())
	return &isolatordv1.CleanupResponse{}, nil
}

func (f *fakeServer) Get(_ context.Context, req *isolatordv1.GetRequest) (*isolatordv1.GetResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(req)
	c, err := f.find(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return &isolatordv1.GetResponse{Container: c}, nil
}

func (f *fakeServer) List(_ context.Context, req *isolatordv1.ListRequest) (*isolatordv1.ListResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(req)
	resp := &isolatordv1.ListResponse{}
	for _, c := range f.containers {
		resp.Containers = append(resp.Containers, c)
	}
	slices.SortFunc(resp.Containers, func(a, b *isolatordv1.Container) int {
		return strings.Compare(a.ContainerId, b.ContainerId)
	})
	return resp, nil
}

func (f *fakeServer) Status(_ context.Context, req *isolatordv1.StatusRequest) (*isolatordv1.StatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(req)
	byState := map[string]uint32{}
	for _, c := range f.containers {
		byState[api.StateName(c.State)]++
	}
	return &isolatordv1.StatusResponse{
		Version:              "v0.0.0-test",
		EphemeralPool:        "32768-49151",
		BlockSize:            1024,
		EphemeralBlocksTotal: 16,
		EphemeralBlocksUsed:  f.nextBlock,
		EphemeralBlocksFree:  16 - f.nextBlock,
		ManagedPorts:         "31000-31999",
		StaticPortsExclusive: "31000-31099",
		StaticPortsShared:    "31500",
		Features:             map[string]bool{"ifb": true, "htb": true, "fq_codel": false},
		ContainersByState:    byState,
		Containers:           uint32(len(f.containers)),
		HostIp:               "198.18.0.1",
		HostInterface:        "eth0",
		HostIpv6:             []string{"2001:db8::1/64"},
		DefaultEgressLimit:   &isolatordv1.BandwidthLimit{Rate: 2_000_000},
		LinkSpeedMbps:        10000,
		ShapingQueue:         "bfifo",
	}, nil
}

// startFake serves a fakeServer on a unix socket in a temporary directory
// and returns the socket's path.
func startFake(t *testing.T) (string, *fakeServer) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "isolatord.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{containers: map[string]*isolatordv1.Container{}}
	srv := grpc.NewServer()
	isolatordv1grpc.RegisterIsolatorServer(srv, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return sock, f
}

// ctl runs isolatorctl with args and returns its output and exit code.
func ctl(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return out.String(), errb.String(), code
}

// mustCtl runs isolatorctl against sock and fails the test unless it exits 0.
func mustCtl(t *testing.T, sock string, args ...string) string {
	t.Helper()
	out, errOut, code := ctl(append([]string{"--socket", sock}, args...)...)
	if code != exitOK {
		t.Fatalf("isolatorctl %s: exit %d, stderr:\n%s", strings.Join(args, " "), code, errOut)
	}
	if errOut != "" {
		t.Errorf("isolatorctl %s: unexpected stderr:\n%s", strings.Join(args, " "), errOut)
	}
	return out
}

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("output is not the expected JSON (%v):\n%s", err, s)
	}
	return v
}

// tableValue returns the value of the "Label:" row of a vertical table.
func tableValue(t *testing.T, table, label string) string {
	t.Helper()
	for line := range strings.Lines(table) {
		if rest, ok := strings.CutPrefix(line, label+":"); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("no %q row in:\n%s", label, table)
	return ""
}

func portRanges(t *testing.T, list string) []*isolatordv1.PortRange {
	t.Helper()
	var out []*isolatordv1.PortRange
	for _, tok := range strings.Split(list, ",") {
		var p isolatordv1.PortRange
		shared := strings.HasSuffix(tok, "s")
		tok = strings.TrimSuffix(tok, "s")
		if _, err := fmt.Sscanf(tok, "%d-%d", &p.Begin, &p.End); err != nil {
			if _, err := fmt.Sscanf(tok, "%d", &p.Begin); err != nil {
				t.Fatalf("bad test port %q", tok)
			}
			p.End = p.Begin
		}
		p.Shared = shared
		out = append(out, &p)
	}
	return out
}

func TestParseInterleaved(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		pos   []string
		ports string
	}{
		{[]string{"c1", "--ports", "31000"}, []string{"c1"}, "31000"},
		{[]string{"--ports", "31000", "c1"}, []string{"c1"}, "31000"},
		{[]string{"c1", "--ports=31000", "extra"}, []string{"c1", "extra"}, "31000"},
		{[]string{"c1"}, []string{"c1"}, ""},
		{[]string{"c1", "--", "--ports", "x"}, []string{"c1", "--ports", "x"}, ""},
		{[]string{"--", "-c1"}, []string{"-c1"}, ""},
		{nil, nil, ""},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		ports := fs.String("ports", "", "")
		pos, err := parseInterleaved(fs, tc.args)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if !slices.Equal(pos, tc.pos) || *ports != tc.ports {
			t.Errorf("%q: positional %q, --ports %q; want %q, %q", tc.args, pos, *ports, tc.pos, tc.ports)
		}
	}
}

func TestPortFlagsRanges(t *testing.T) {
	p := &portFlags{exclusive: "32000, 31000-31099,31100", shared: "8081,8080"}
	got, err := p.ranges()
	if err != nil {
		t.Fatal(err)
	}
	want := portRanges(t, "8080-8081s,31000-31100,32000")
	if len(got) != len(want) {
		t.Fatalf("ranges = %v, want %v", got, want)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("range %d = %v, want %v", i, got[i], want[i])
		}
	}

	empty, err := (&portFlags{}).ranges()
	if err != nil || len(empty) != 0 {
		t.Errorf("no ports: %v, %v", empty, err)
	}

	for _, tc := range []struct {
		p    portFlags
		want string
	}{
		{portFlags{exclusive: "31000-x"}, `--ports: invalid port range "31000-x"`},
		{portFlags{exclusive: "70000"}, "--ports: invalid port range \"70000\": port 70000 out of range 1-65535"},
		{portFlags{shared: "5-3"}, `--shared-ports: invalid port range "5-3": range is reversed`},
		{portFlags{exclusive: "31000-31010", shared: "31005,31010-31020"}, "ports in both --ports and --shared-ports: 31005,31010"},
	} {
		_, err := tc.p.ranges()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want it to contain %q", tc.p, err, tc.want)
		}
	}
}

// Bad command lines exit 2 with a message, before any RPC reaches the daemon.
func TestUsageErrors(t *testing.T) {
	sock, fake := startFake(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing command"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--bogus", "list"}, "flag provided but not defined: -bogus"},
		{[]string{"prepare"}, "isolatorctl prepare: missing container ID"},
		{[]string{"prepare", "--ports", "31000"}, "missing container ID"},
		{[]string{"prepare", ""}, "empty container ID"},
		{[]string{"prepare", "c1", "c2"}, `unexpected argument "c2"`},
		{[]string{"prepare", "c1", "--ports", "31000-x"}, `--ports: invalid port range "31000-x": "x" is not a port number`},
		{[]string{"prepare", "c1", "--shared-ports", "0"}, `--shared-ports: invalid port range "0"`},
		{[]string{"prepare", "c1", "--ports", "1,,2"}, "empty element"},
		{[]string{"prepare", "c1", "--nope"}, "flag provided but not defined: -nope"},
		{[]string{"isolate", "c1"}, "--pid or --netns"},
		{[]string{"isolate", "c1", "--pid", "1", "--netns", "/x"}, "either --pid or --netns, not both"},
		{[]string{"isolate", "c1", "--pid", "0"}, "--pid 0: not a process id"},
		{[]string{"isolate", "c1", "--pid", "4294967296"}, "not a process id"},
		{[]string{"isolate", "c1", "--netns", ""}, "--netns: empty path"},
		{[]string{"update", "c1"}, "--ports and/or --shared-ports"},
		{[]string{"usage"}, "missing container ID"},
		{[]string{"cleanup"}, "missing container ID"},
		{[]string{"get"}, "missing container ID"},
		{[]string{"list", "c1"}, `unexpected argument "c1"`},
		{[]string{"status", "-o", "yaml"}, `-o "yaml": the output format is table or json`},
		{[]string{"-o", "xml", "list"}, "table or json"},
		{[]string{"list", "--timeout", "0s"}, "--timeout 0s: must be positive"},
	} {
		args := append([]string{"--socket", sock}, tc.args...)
		out, errOut, code := ctl(args...)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.args, code, exitUsage, errOut)
		}
		if !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: stderr %q does not contain %q", tc.args, errOut, tc.want)
		}
		if !strings.Contains(errOut, "usage: isolatorctl") {
			t.Errorf("%q: stderr has no usage line:\n%s", tc.args, errOut)
		}
		if out != "" {
			t.Errorf("%q: stdout %q, want nothing", tc.args, out)
		}
	}
	if n := fake.requestCount(); n != 0 {
		t.Errorf("the daemon got %d requests from bad command lines, last %v", n, fake.lastRequest())
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		out, errOut, code := ctl(args...)
		if code != exitOK || errOut != "" {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
		}
		for _, c := range commands {
			if !strings.Contains(out, "  "+c.name+" ") && !strings.Contains(out, "  "+c.name+"\t") {
				t.Errorf("%q: help does not list %s:\n%s", args, c.name, out)
			}
		}
	}
	for _, args := range [][]string{{"help", "prepare"}, {"prepare", "-h"}, {"prepare", "c1", "--help"}} {
		out, _, code := ctl(args...)
		if code != exitOK {
			t.Errorf("%q: exit %d", args, code)
		}
		for _, want := range []string{"usage: isolatorctl prepare ID", "-ports LIST", "-shared-ports LIST", "-socket PATH", "LIST is a comma-separated"} {
			if !strings.Contains(out, want) {
				t.Errorf("%q: help lacks %q:\n%s", args, want, out)
			}
		}
	}
}

func TestPrepareAndGet(t *testing.T) {
	sock, fake := startFake(t)

	out := mustCtl(t, sock, "prepare", "c1", "--ports", "31000-31099,32000", "--shared-ports", "31500")
	want := &isolatordv1.PrepareRequest{ContainerId: "c1", Ports: portRanges(t, "31000-31099,31500s,32000")}
	if got := fake.lastRequest(); !proto.Equal(got, want) {
		t.Errorf("daemon got %v, want %v", got, want)
	}
	for label, want := range map[string]string{
		"Container":       "c1",
		"State":           "prepared",
		"Ephemeral ports": "32768-33791 (1024 ports)",
		"Ports":           "31000-31099,32000",
		"Shared ports":    "31500",
		"Veth":            "-",
		"Netns":           "-",
		"Created":         "2026-11-22T16:00:00Z",
	} {
		if got := tableValue(t, out, label); got != want {
			t.Errorf("%s: %q, want %q\n%s", label, got, want, out)
		}
	}

	// Flags before the ID, and global flags after the command.
	mustCtl(t, sock, "prepare", "--shared-ports", "31500", "c2", "-o", "json")
	want = &isolatordv1.PrepareRequest{ContainerId: "c2", Ports: portRanges(t, "31500s")}
	if got := fake.lastRequest(); !proto.Equal(got, want) {
		t.Errorf("daemon got %v, want %v", got, want)
	}

	js := decodeJSON[map[string]any](t, mustCtl(t, sock, "-o", "json", "get", "c1"))
	for _, key := range []string{"container_id", "state", "ephemeral_ports", "ports", "veth", "netns", "pid", "netns_source", "created_at"} {
		if _, ok := js[key]; !ok {
			t.Errorf("JSON lacks %q: %v", key, js)
		}
	}
	if _, ok := js["isolated_at"]; ok {
		t.Errorf("JSON of a prepared container has isolated_at: %v", js)
	}
	typed := decodeJSON[containerJSON](t, mustCtl(t, sock, "get", "c1", "-o", "json"))
	wantJSON := containerJSON{
		ContainerID:    "c1",
		State:          "prepared",
		EphemeralPorts: &rangeJSON{Begin: 32768, End: 33791},
		Ports:          []portJSON{{31000, 31099, false}, {31500, 31500, true}, {32000, 32000, false}},
		CreatedAt:      "2026-11-22T16:00:00Z",
		Labels:         map[string]string{},
		NotRecovered:   []string{},
	}
	if !reflect.DeepEqual(typed, wantJSON) {
		t.Errorf("get -o json = %+v, want %+v", typed, wantJSON)
	}
}

func TestIsolateAndUpdate(t *testing.T) {
	sock, fake := startFake(t)
	mustCtl(t, sock, "prepare", "c1", "--ports", "31000")
	mustCtl(t, sock, "prepare", "c2")

	out := mustCtl(t, sock, "isolate", "c1", "--pid", "4242")
	want := &isolatordv1.IsolateRequest{ContainerId: "c1", Target: &isolatordv1.IsolateRequest_Pid{Pid: 4242}}
	if got := fake.lastRequest(); !proto.Equal(got, want) {
		t.Errorf("daemon got %v, want %v", got, want)
	}
	for label, want := range map[string]string{
		"State":        "isolated",
		"Veth":         "veth-c1",
		"Netns":        "/var/run/netns/isolator-c1",
		"Netns source": "pid:4242",
		"Isolated":     "2026-11-22T16:00:01Z",
	} {
		if got := tableValue(t, out, label); got != want {
			t.Errorf("%s: %q, want %q\n%s", label, got, want, out)
		}
	}

	// A relative namespace path is sent absolute: the daemon has its own cwd.
	dir := t.TempDir()
	t.Chdir(dir)
	js := decodeJSON[containerJSON](t, mustCtl(t, sock, "isolate", "--netns", "ns/c2", "c2", "-o", "json"))
	abs := filepath.Join(dir, "ns/c2")
	want = &isolatordv1.IsolateRequest{ContainerId: "c2", Target: &isolatordv1.IsolateRequest_NetnsPath{NetnsPath: abs}}
	if got := fake.lastRequest(); !proto.Equal(got, want) {
		t.Errorf("daemon got %v, want %v", got, want)
	}
	if js.State != "isolated" || js.NetnsSource != abs || js.Veth != "veth-c2" || js.Netns != "/var/run/netns/isolator-c2" || js.Pid != 0 {
		t.Errorf("isolate -o json = %+v", js)
	}

	js = decodeJSON[containerJSON](t, mustCtl(t, sock, "update", "c1", "--shared-ports", "31500-31501", "--ports", "31000", "-o", "json"))
	wantU := &isolatordv1.UpdateRequest{ContainerId: "c1", Ports: portRanges(t, "31000,31500-31501s")}
	if got := fake.lastRequest(); !proto.Equal(got, wantU) {
		t.Errorf("daemon got %v, want %v", got, wantU)
	}
	if fmt.Sprint(js.Ports) != fmt.Sprint([]portJSON{{31000, 31000, false}, {31500, 31501, true}}) {
		t.Errorf("update ports = %+v", js.Ports)
	}

	// --ports '' releases every static port.
	js = decodeJSON[containerJSON](t, mustCtl(t, sock, "update", "c1", "--ports", "", "-o", "json"))
	if got := fake.lastRequest().(*isolatordv1.UpdateRequest); len(got.GetPorts()) != 0 {
		t.Errorf("update --ports '' sent %v", got)
	}
	if js.Ports == nil || len(js.Ports) != 0 {
		t.Errorf("no ports must print as [], got %#v", js.Ports)
	}
}

func TestServerErrors(t *testing.T) {
	sock, _ := startFake(t)
	mustCtl(t, sock, "prepare", "c1", "--ports", "31000-31099")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"prepare", "c2", "--ports", "31001"}, "isolatorctl: FailedPrecondition: port 31001 is held exclusively by c1\n"},
		{[]string{"prepare", "c1"}, "isolatorctl: AlreadyExists: container \"c1\" already exists\n"},
		{[]string{"get", "nope"}, "isolatorctl: NotFound: container \"nope\" not found\n"},
		{[]string{"-o", "json", "usage", "nope"}, "isolatorctl: NotFound: container \"nope\" not found\n"},
	} {
		out, errOut, code := ctl(append([]string{"--socket", sock}, tc.args...)...)
		if code != exitError {
			t.Errorf("%q: exit %d, want %d", tc.args, code, exitError)
		}
		if errOut != tc.want {
			t.Errorf("%q: stderr %q, want %q", tc.args, errOut, tc.want)
		}
		if out != "" {
			t.Errorf("%q: stdout %q, want nothing", tc.args, out)
		}
	}
}

func TestList(t *testing.T) {
	sock, _ := startFake(t)

	if out := mustCtl(t, sock, "list", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("empty list -o json = %q, want []", out)
	}
	out := mustCtl(t, sock, "list")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "CONTAINER") {
		t.Errorf("empty list table = %q, want the header only", out)
	}

	mustCtl(t, sock, "prepare", "b", "--ports", "31000-31009", "--shared-ports", "31500")
	mustCtl(t, sock, "prepare", "a")
	mustCtl(t, sock, "isolate", "a", "--pid", "7")

	out = mustCtl(t, sock, "list")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("list table has %d lines, want 3:\n%s", len(lines), out)
	}
	wantRows := [][]string{
		{"CONTAINER", "STATE", "EPHEMERAL", "PORTS", "SHARED", "VETH", "CREATED"},
		{"a", "isolated", "33792-34815", "-", "-", "veth-a", "2026-11-22T16:00:00Z"},
		{"b", "prepared", "32768-33791", "31000-31009", "31500", "-", "2026-11-22T16:00:00Z"},
	}
	for i, want := range wantRows {
		if got := strings.Fields(lines[i]); !slices.Equal(got, want) {
			t.Errorf("row %d = %q, want %q", i, got, want)
		}
	}
	// Columns line up.
	col := strings.Index(lines[0], "STATE")
	for _, l := range lines[1:] {
		if l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("STATE column misaligned:\n%s", out)
		}
	}

	list := decodeJSON[[]containerJSON](t, mustCtl(t, sock, "-o", "json", "list"))
	if len(list) != 2 || list[0].ContainerID != "a" || list[0].State != "isolated" ||
		list[1].ContainerID != "b" || list[1].State != "prepared" || len(list[1].Ports) != 2 || !list[1].Ports[1].Shared {
		t.Errorf("list -o json = %+v", list)
	}
}

func TestUsage(t *testing.T) {
	sock, fake := startFake(t)
	mustCtl(t, sock, "prepare", "c1")

	out := mustCtl(t, sock, "usage", "c1")
	if got := fake.lastRequest(); !proto.Equal(got, &isolatordv1.UsageRequest{ContainerId: "c1"}) {
		t.Errorf("daemon got %v", got)
	}
	for _, want := range []string{"TRAFFIC", "BYTES", "PACKETS", "ERRORS", "DROPPED"} {
		if !strings.Contains(out, want) {
			t.Errorf("usage table lacks %q:\n%s", want, out)
		}
	}
	rows := map[string][]string{}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) > 0 {
			rows[f[0]] = f
		}
	}
	if got, want := rows["rx"], []string{"rx", "123456", "789", "1", "2"}; !slices.Equal(got, want) {
		t.Errorf("rx row %q, want %q", got, want)
	}
	if got, want := rows["tx"], []string{"tx", "654321", "987", "3", "4"}; !slices.Equal(got, want) {
		t.Errorf("tx row %q, want %q", got, want)
	}
	if got, want := tableValue(t, out, "TCP connections"), "5 active, 6 in time-wait"; got != want {
		t.Errorf("TCP connections %q, want %q", got, want)
	}
	if got, want := tableValue(t, out, "TCP RTT"), "p50 120us  p90 480us  p95 950us  p99 2.5ms  (5 connections)"; got != want {
		t.Errorf("TCP RTT %q, want %q", got, want)
	}
	if got, want := tableValue(t, out, "SNMP"), "5 counters (--snmp lists them)"; got != want {
		t.Errorf("SNMP %q, want %q", got, want)
	}
	if strings.Contains(out, "RetransSegs") {
		t.Errorf("SNMP counters listed without --snmp:\n%s", out)
	}

	out = mustCtl(t, sock, "usage", "c1", "--snmp")
	i, j := strings.Index(out, "Ip.InReceives"), strings.Index(out, "Tcp.ActiveOpens")
	k := strings.Index(out, "Tcp.RetransSegs")
	if i < 0 || j < i || k < j || !strings.Contains(out, "Udp.InDatagrams") {
		t.Errorf("usage --snmp does not list the counters in group then name order:\n%s", out)
	}

	js := decodeJSON[usageJSON](t, mustCtl(t, sock, "usage", "c1", "-o", "json"))
	if js.ContainerID != "c1" || js.Traffic == nil || js.Traffic.RxBytes != 123456 || js.Traffic.TxDropped != 4 ||
		js.TCP == nil || js.TCP.TimeWaitConnections != 6 || js.TCP.RTT == nil || js.TCP.RTT.P99Us != 2500 ||
		js.SNMP == nil || js.SNMP.TCP["RetransSegs"] != 7 || js.SNMP.ICMP == nil ||
		js.EphemeralPorts == nil || js.EphemeralPorts.Begin != 32768 {
		t.Errorf("usage -o json = %+v", js)
	}
	raw := decodeJSON[map[string]any](t, mustCtl(t, sock, "usage", "c1", "-o", "json"))
	if tr, _ := raw["traffic"].(map[string]any); tr == nil || tr["rx_packets"] != float64(789) {
		t.Errorf("usage JSON traffic = %v", raw["traffic"])
	}
}

func TestStatusAndCleanup(t *testing.T) {
	sock, _ := startFake(t)
	mustCtl(t, sock, "prepare", "c1")
	mustCtl(t, sock, "prepare", "c2")
	mustCtl(t, sock, "isolate", "c2", "--pid", "9")

	out := mustCtl(t, sock, "status")
	for label, want := range map[string]string{
		"Version":              "v0.0.0-test",
		"Host":                 "198.18.0.1 on eth0",
		"Host IPv6":            "2001:db8::1/64",
		"Ephemeral pool":       "32768-49151 (16384 ports)",
		"Ephemeral blocks":     "16 of 1024 ports: 2 used, 14 free",
		"Managed static ports": "31000-31999 (1000 ports)",
		"Held exclusively":     "31000-31099 (100 ports)",
		"Held shared":          "31500 (1 port)",
		"Containers":           "2 (isolated 1, prepared 1)",
		"Features":             "htb, ifb (missing: fq_codel)",
	} {
		if got := tableValue(t, out, label); got != want {
			t.Errorf("%s: %q, want %q", label, got, want)
		}
	}
	st := decodeJSON[statusJSON](t, mustCtl(t, sock, "status", "-o", "json"))
	if st.EphemeralPool != "32768-49151" || st.ManagedPorts != "31000-31999" || st.BlockSize != 1024 ||
		st.EphemeralBlocksUsed != 2 || st.ContainersByState["isolated"] != 1 || !st.Features["ifb"] ||
		st.HostInterface != "eth0" || st.Containers != 2 || len(st.HostIPv6) != 1 || st.HostIPv6[0] != "2001:db8::1/64" {
		t.Errorf("status -o json = %+v", st)
	}

	if out := mustCtl(t, sock, "cleanup", "c1"); out != "Container c1 cleaned up\n" {
		t.Errorf("cleanup table = %q", out)
	}
	if js := decodeJSON[cleanupJSON](t, mustCtl(t, sock, "cleanup", "c2", "-o", "json")); js.ContainerID != "c2" {
		t.Errorf("cleanup -o json = %+v", js)
	}
	if list := decodeJSON[[]containerJSON](t, mustCtl(t, sock, "list", "-o", "json")); len(list) != 0 {
		t.Errorf("containers left after cleanup: %+v", list)
	}
	_, errOut, code := ctl("--socket", sock, "cleanup", "c1")
	if code != exitError || !strings.Contains(errOut, "NotFound") {
		t.Errorf("second cleanup: exit %d, stderr %q", code, errOut)
	}
}

func TestSocketFromEnvironment(t *testing.T) {
	sock, fake := startFake(t)
	t.Setenv(socketEnv, sock)
	out, errOut, code := ctl("status", "-o", "json")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	if decodeJSON[statusJSON](t, out).Version != "v0.0.0-test" || fake.requestCount() != 1 {
		t.Errorf("status via $%s did not reach the fake daemon: %s", socketEnv, out)
	}
	// --socket wins over the environment.
	missing := filepath.Join(t.TempDir(), "none.sock")
	_, errOut, code = ctl("--socket", missing, "status")
	if code != exitError || !strings.Contains(errOut, missing) {
		t.Errorf("--socket %s: exit %d, stderr %q", missing, code, errOut)
	}
}

func TestDaemonUnreachable(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "isolatord.sock")
	out, errOut, code := ctl("--socket", missing, "list")
	if code != exitError {
		t.Errorf("exit %d, want %d", code, exitError)
	}
	want := "isolatorctl: cannot connect to isolatord at " + missing + ": connect: no such file or directory\n"
	if errOut != want {
		t.Errorf("stderr %q, want %q", errOut, want)
	}
	if out != "" {
		t.Errorf("stdout %q", out)
	}
}

// Formatting of values a healthy daemon rarely sends.
func TestFormatEdgeCases(t *testing.T) {
	for us, want := range map[uint64]string{0: "0us", 999: "999us", 1000: "1.0ms", 12345: "12.3ms"} {
		if got := micros(us); got != want {
			t.Errorf("micros(%d) = %q, want %q", us, got, want)
		}
	}
	for in, want := range map[string]string{"": "-", "31000": "31000 (1 port)", "1-10,20": "1-10,20 (11 ports)", "garbage": "garbage"} {
		if got := setWithSize(in); got != want {
			t.Errorf("setWithSize(%q) = %q, want %q", in, got, want)
		}
	}

	// An empty container (a response without one) prints dashes, not a panic.
	var buf bytes.Buffer
	if err := (containerResult{nil}).writeTable(&buf); err != nil {
		t.Fatal(err)
	}
	if got := tableValue(t, buf.String(), "Ephemeral ports"); got != "-" {
		t.Errorf("nil container ephemeral = %q", got)
	}
	js, err := json.Marshal(containerResult{nil}.jsonValue())
	if err != nil || !strings.Contains(string(js), `"ephemeral_ports":null`) || !strings.Contains(string(js), `"ports":[]`) {
		t.Errorf("nil container JSON = %s, %v", js, err)
	}

	// A container isolated by pid without netns_source shows the pid.
	buf.Reset()
	c := &isolatordv1.Container{ContainerId: "x", Pid: 12, Ports: portRanges(t, "80,443s,8080-8081")}
	if err := (containerResult{c}).writeTable(&buf); err != nil {
		t.Fatal(err)
	}
	if got := tableValue(t, buf.String(), "Netns source"); got != "pid:12" {
		t.Errorf("netns source = %q", got)
	}
	if got := tableValue(t, buf.String(), "Ports"); got != "80,8080-8081" {
		t.Errorf("ports = %q", got)
	}

	// Usage of a container without figures.
	buf.Reset()
	if err := (usageResult{&isolatordv1.UsageResponse{ContainerId: "x"}, true}).writeTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, label := range []string{"Traffic", "TCP", "SNMP"} {
		if got := tableValue(t, buf.String(), label); got != "-" {
			t.Errorf("%s = %q, want -", label, got)
		}
	}
	js, _ = json.Marshal(usageResult{&isolatordv1.UsageResponse{ContainerId: "x"}, false}.jsonValue())
	if !strings.Contains(string(js), `"traffic":null`) || !strings.Contains(string(js), `"tcp":null`) {
		t.Errorf("usage JSON without figures = %s", js)
	}
}
