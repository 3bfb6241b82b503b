package dockerdriver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane"
)

// fakeLife is a lifecycle of records in memory (the real one is tested in
// package isolator and, with this driver, in test/e2e/docker_test.go).
type fakeLife struct {
	mu       sync.Mutex
	recs     map[string]isolator.Record
	prepared []isolator.PrepareOptions
	isolated chan string
}

func (f *fakeLife) PrepareWith(_ context.Context, id string, o isolator.PrepareOptions) (isolator.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	excl, shared, err := isolator.ParsePorts("ports", o.Ports)
	if err != nil {
		return isolator.Record{}, err
	}
	r := isolator.Record{ID: id, State: isolator.StatePrepared, Ports: excl, Shared: shared, Labels: o.Labels,
		Ephemeral: ephemeral.Range{Begin: 40960, End: 41983}}
	f.recs[id] = r
	f.prepared = append(f.prepared, o)
	return r, nil
}

func (f *fakeLife) Isolate(_ context.Context, id string, t isolator.IsolateTarget) (isolator.Record, error) {
	f.mu.Lock()
	r := f.recs[id]
	r.State, r.NetNSPath = isolator.StateIsolated, t.NetNSPath
	f.recs[id] = r
	f.mu.Unlock()
	f.isolated <- id
	return r, nil
}

func (f *fakeLife) Get(_ context.Context, id string) (isolator.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.recs[id]
	if !ok {
		return r, &isolator.Error{Kind: isolator.ErrNotFound, Msg: "container_id: " + id + " not found"}
	}
	return r, nil
}

func (f *fakeLife) CleanupIfLabeled(_ context.Context, id string, want map[string]string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.recs[id]
	if !ok {
		return false, nil
	}
	if !r.HasLabels(want) {
		return true, nil
	}
	delete(f.recs, id)
	return false, nil
}

func (f *fakeLife) Host() plane.HostInfo {
	_, n, _ := net.ParseCIDR("198.18.0.1/24")
	n.IP = net.IPv4(198, 18, 0, 1).To4()
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	return plane.HostInfo{IP: *n, MAC: mac}
}

type fakeStager struct {
	mu       sync.Mutex
	staged   map[string]bool
	arrive   chan struct{} // closed: the runtime moved the interface in
	unstaged []string
}

func (s *fakeStager) Stage(_ context.Context, id string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.staged[id] = true
	return "isd" + id[:4], nil
}

func (s *fakeStager) AwaitStaged(ctx context.Context, id, nsPath string) error {
	select {
	case <-s.arrive:
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.staged[id] {
			return errors.New("nothing staged for " + id)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *fakeStager) Unstage(id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	had := s.staged[id]
	delete(s.staged, id)
	s.unstaged = append(s.unstaged, id)
	return had, nil
}

type fixture struct {
	t     *testing.T
	life  *fakeLife
	stage *fakeStager
	drv   *Driver
	srv   *httptest.Server
	file  string
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, life: &fakeLife{recs: map[string]isolator.Record{}, isolated: make(chan string, 4)},
		stage: &fakeStager{staged: map[string]bool{}, arrive: make(chan struct{})},
		file:  filepath.Join(t.TempDir(), "networks.json")}
	f.start()
	return f
}

func (f *fixture) start() {
	drv, err := New(f.life, f.stage, f.file, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		f.t.Fatal(err)
	}
	f.drv = drv
	f.srv = httptest.NewServer(drv.Handler())
	f.t.Cleanup(func() { f.srv.Close(); drv.Close() })
}

// call posts body to /name and decodes the answer into out; it returns the
// HTTP status and the answer's Err.
func (f *fixture) call(name string, body any, out any) (int, string) {
	f.t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(f.srv.URL+"/"+name, contentType, bytes.NewReader(b))
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e errResponse
	_ = json.Unmarshal(raw, &e)
	if out != nil && e.Err == "" {
		if err := json.Unmarshal(raw, out); err != nil {
			f.t.Fatalf("%s: %v: %s", name, err, raw)
		}
	}
	return resp.StatusCode, e.Err
}

func (f *fixture) mustCall(name string, body any, out any) {
	f.t.Helper()
	if code, e := f.call(name, body, out); code != 200 || e != "" {
		f.t.Fatalf("%s: %d %q", name, code, e)
	}
}

func nullIPAM(id string, generic map[string]string) map[string]any {
	g := map[string]any{}
	for k, v := range generic {
		g[k] = v
	}
	return map[string]any{"NetworkID": id, "Options": map[string]any{optGeneric: g},
		"IPv4Data": []map[string]any{{"AddressSpace": "null", "Pool": "0.0.0.0/0"}}}
}

func portmap(bs ...portBinding) map[string]any {
	return map[string]any{optPortMap: bs, "com.docker.network.endpoint.exposedports": []any{}}
}

func TestActivateAndUnknownCalls(t *testing.T) {
	f := newFixture(t)
	var act activateResponse
	f.mustCall("Plugin.Activate", nil, &act)
	if len(act.Implements) != 1 || act.Implements[0] != "NetworkDriver" {
		t.Fatalf("Activate: %+v", act)
	}
	var caps capabilitiesResponse
	f.mustCall("NetworkDriver.GetCapabilities", nil, &caps)
	if caps.Scope != "local" {
		t.Fatalf("capabilities: %+v", caps)
	}
	if code, _ := f.call("NetworkDriver.AllocateNetwork", map[string]any{}, nil); code != 404 {
		t.Fatalf("an unknown call answered %d, want 404", code)
	}
	for _, ack := range []string{"DiscoverNew", "DiscoverDelete", "ProgramExternalConnectivity", "RevokeExternalConnectivity"} {
		f.mustCall("NetworkDriver."+ack, map[string]any{}, nil)
	}
}

func TestNetworkRefusalsAndPersistence(t *testing.T) {
	f := newFixture(t)
	req := nullIPAM("n1", nil)
	req["IPv4Data"] = []map[string]any{{"Pool": "172.17.0.0/16"}}
	if _, e := f.call("NetworkDriver.CreateNetwork", req, nil); !strings.Contains(e, "--ipam-driver null") {
		t.Fatalf("default IPAM: %q", e)
	}
	if _, e := f.call("NetworkDriver.CreateNetwork", nullIPAM("n1", map[string]string{"colour": "blue"}), nil); !strings.Contains(e, `"colour"`) {
		t.Fatalf("unknown option: %q", e)
	}
	if _, e := f.call("NetworkDriver.CreateNetwork", nullIPAM("n1", map[string]string{OptSharedPorts: "x"}), nil); !strings.Contains(e, OptSharedPorts) {
		t.Fatalf("bad shared-ports: %q", e)
	}
	f.mustCall("NetworkDriver.CreateNetwork", nullIPAM("n1", map[string]string{OptSharedPorts: "31005", OptEgressRate: "10MB/s"}), nil)

	// A restarted daemon knows the network (Docker does not replay it).
	f.start()
	f.mustCall("NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef", "Interface": map[string]any{},
		"Options": portmap(portBinding{Proto: 6, Port: 31005, HostPort: 31005}, portBinding{Proto: 17, Port: 31001, HostPort: 31001})}, nil)
	o := f.life.prepared[0]
	if r := f.life.recs["e1abcdef"]; r.Ports.String() != "31001" || r.Shared.String() != "31005" {
		t.Fatalf("ports prepared: %+v: exclusive %s, shared %s", o.Ports, r.Ports, r.Shared)
	}
	if o.Egress == nil || o.Egress.Rate != 10_000_000 || o.Ingress != nil {
		t.Fatalf("limits prepared: %+v %+v", o.Egress, o.Ingress)
	}
	f.mustCall("NetworkDriver.DeleteNetwork", map[string]any{"NetworkID": "n1"}, nil)
	f.start()
	if _, e := f.call("NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e2abcdef"}, nil); !strings.Contains(e, "not known") {
		t.Fatalf("endpoint of a deleted network: %q", e)
	}
}

func TestEndpointPortRefusals(t *testing.T) {
	f := newFixture(t)
	f.mustCall("NetworkDriver.CreateNetwork", nullIPAM("n1", nil), nil)
	for _, c := range []struct {
		opts map[string]any
		want string
	}{
		{portmap(portBinding{Proto: 6, Port: 80, HostPort: 8080}), "8080:80/tcp refused"},
		{portmap(portBinding{Proto: 6, Port: 80, HostPort: 8000, HostPortEnd: 8010}), "no NAT"},
		{portmap(portBinding{Proto: 132, Port: 80, HostPort: 80}), "TCP and UDP ports only"},
		{portmap(portBinding{Proto: 6, Port: 80, HostPort: 80, HostIP: "127.0.0.1"}), "host IP"},
		{map[string]any{"speed": "fast"}, `endpoint option "speed" is unknown`},
	} {
		if _, e := f.call("NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef", "Options": c.opts}, nil); !strings.Contains(e, c.want) {
			t.Errorf("%v: %q, want %q", c.opts, e, c.want)
		}
	}
	if _, e := f.call("NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef", "Interface": map[string]any{"MacAddress": "02:42:ac:11:00:02"}}, nil); !strings.Contains(e, "--mac-address") {
		t.Errorf("a MAC of the user's: %q", e)
	}
	if len(f.life.prepared) != 0 {
		t.Fatalf("refused endpoints were prepared: %+v", f.life.prepared)
	}
	// HostPort 0 (-p 80, -P) takes the container's own port.
	f.mustCall("NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef", "Options": portmap(portBinding{Proto: 6, Port: 80}, portBinding{Proto: 6, Port: 81, HostPort: 80, HostPortEnd: 90})}, nil)
	if r := f.life.recs["e1abcdef"]; r.Ports.String() != "80-81" || !r.Shared.Empty() {
		t.Fatalf("ports: %+v: exclusive %s, shared %s", f.life.prepared[0].Ports, r.Ports, r.Shared)
	}
}

func TestJoinIsolatesOnceTheInterfaceArrives(t *testing.T) {
	f := newFixture(t)
	f.mustCall("NetworkDriver.CreateNetwork", nullIPAM("n1", nil), nil)
	var ce createEndpointResponse
	f.mustCall("NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef", "Interface": map[string]any{}}, &ce)
	if ce.Interface == nil || ce.Interface.Address != "198.18.0.1/24" || ce.Interface.MacAddress != "02:00:00:00:00:01" {
		t.Fatalf("CreateEndpoint: %+v", ce.Interface)
	}
	var j joinResponse
	f.mustCall("NetworkDriver.Join", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef", "SandboxKey": "/var/run/docker/netns/abc"}, &j)
	if j.InterfaceName.SrcName != "isde1ab" || j.InterfaceName.DstPrefix != "eth" || !j.DisableGatewayService || j.Gateway != "" {
		t.Fatalf("Join: %+v", j)
	}
	select {
	case id := <-f.life.isolated:
		t.Fatalf("%s isolated before its interface arrived", id)
	case <-time.After(20 * time.Millisecond):
	}
	close(f.stage.arrive)
	select {
	case <-f.life.isolated:
	case <-time.After(5 * time.Second):
		t.Fatal("not isolated after the interface arrived")
	}
	if err := f.drv.Wait("e1abcdef"); err != nil {
		t.Fatal(err)
	}
	var oi operInfoResponse
	f.mustCall("NetworkDriver.EndpointOperInfo", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef"}, &oi)
	if oi.Value["isolator.state"] != "isolated" || oi.Value["isolator.ephemeral-ports"] != "40960-41983" {
		t.Fatalf("EndpointOperInfo: %+v", oi.Value)
	}
	f.mustCall("NetworkDriver.Leave", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef"}, nil)
	f.mustCall("NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef"}, nil)
	if _, err := f.life.Get(context.Background(), "e1abcdef"); !errors.Is(err, isolator.ErrNotFound) {
		t.Fatalf("after DeleteEndpoint: %v", err)
	}
	// Deleting again (Docker retries) succeeds.
	f.mustCall("NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef"}, nil)
}

func TestLeaveBeforeTheInterfaceArrives(t *testing.T) {
	f := newFixture(t)
	f.mustCall("NetworkDriver.CreateNetwork", nullIPAM("n1", nil), nil)
	f.mustCall("NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef"}, nil)
	f.mustCall("NetworkDriver.Join", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef", "SandboxKey": "/nonexistent"}, nil)
	f.mustCall("NetworkDriver.Leave", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef"}, nil)
	f.mustCall("NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef"}, nil)
	if f.stage.staged["e1abcdef"] {
		t.Fatal("the staged pair is left after DeleteEndpoint")
	}
	select {
	case id := <-f.life.isolated:
		t.Fatalf("%s isolated after Leave", id)
	default:
	}
}

// A Leave or DeleteEndpoint naming another network than the endpoint's is
// refused before anything of the endpoint is touched: its pending
// isolation goes on and its staged pair stays.
func TestWrongNetworkLeavesTheEndpointAlone(t *testing.T) {
	f := newFixture(t)
	f.mustCall("NetworkDriver.CreateNetwork", nullIPAM("n1", nil), nil)
	f.mustCall("NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef"}, nil)
	f.mustCall("NetworkDriver.Join", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef", "SandboxKey": "/nonexistent"}, nil)
	for _, call := range []string{"NetworkDriver.Leave", "NetworkDriver.DeleteEndpoint"} {
		if _, e := f.call(call, map[string]any{"NetworkID": "n2", "EndpointID": "e1abcdef"}, nil); !strings.Contains(e, "another network") {
			t.Fatalf("%s of another network: %q", call, e)
		}
	}
	f.stage.mu.Lock()
	staged, unstaged := f.stage.staged["e1abcdef"], f.stage.unstaged
	f.stage.mu.Unlock()
	if !staged || len(unstaged) != 0 {
		t.Fatalf("staged %v, unstaged %v after calls of another network", staged, unstaged)
	}
	close(f.stage.arrive)
	select {
	case <-f.life.isolated:
	case <-time.After(5 * time.Second):
		t.Fatal("the pending isolation was stopped by calls of another network")
	}
	if err := f.drv.Wait("e1abcdef"); err != nil {
		t.Fatal(err)
	}
}

// A second Join while the first's isolation is pending supersedes it: the
// first's failure path (which unstages) runs before the pair is staged
// again, so the second isolates.
func TestJoinAgainWhilePending(t *testing.T) {
	f := newFixture(t)
	f.mustCall("NetworkDriver.CreateNetwork", nullIPAM("n1", nil), nil)
	f.mustCall("NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef"}, nil)
	join := map[string]any{"NetworkID": "n1", "EndpointID": "e1abcdef", "SandboxKey": "/nonexistent"}
	f.mustCall("NetworkDriver.Join", join, nil)
	f.mustCall("NetworkDriver.Join", join, nil)
	close(f.stage.arrive)
	select {
	case <-f.life.isolated:
	case <-time.After(5 * time.Second):
		t.Fatalf("not isolated after a second Join: %v", f.drv.Wait("e1abcdef"))
	}
	if err := f.drv.Wait("e1abcdef"); err != nil {
		t.Fatal(err)
	}
}
