// Package dockerdriver serves Docker's remote network driver protocol
// (HTTP and JSON on a unix socket, /run/docker/plugins/NAME.sock) from the
// daemon, over the same lifecycle the gRPC API and the CNI plugin use:
// CreateEndpoint prepares the container (its -p ports and an ephemeral
// block), Join stages its veth pair for Docker to move in, and once Docker
// has moved and configured it, the lifecycle isolates the container in
// that namespace (filters, ip_local_port_range, pin); DeleteEndpoint
// cleans it up. Networks are persisted in a file of their own, since
// Docker does not replay them. The package has no kernel code: the
// lifecycle and the staging of veths (package dataplane) are interfaces.
// See docs/docker.md.
package dockerdriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane"
)

// LabelNetwork is the label naming the Docker network of a container the
// driver prepared (its value the network ID).
const LabelNetwork = "docker.network"

// Lifecycle is what the driver needs of the lifecycle (*isolator.Isolator).
type Lifecycle interface {
	PrepareWith(ctx context.Context, id string, o isolator.PrepareOptions) (isolator.Record, error)
	Isolate(ctx context.Context, id string, t isolator.IsolateTarget) (isolator.Record, error)
	Get(ctx context.Context, id string) (isolator.Record, error)
	CleanupIfLabeled(ctx context.Context, id string, want map[string]string) (kept bool, err error)
	Host() plane.HostInfo
}

// Stager makes the veth pair of a container whose runtime moves the
// interface into its namespace itself (*dataplane.DataPlane).
type Stager interface {
	// Stage creates id's pair in the host namespace and names the end to move.
	Stage(ctx context.Context, id string) (string, error)
	// AwaitStaged waits until the runtime has moved and configured it in
	// the namespace at nsPath (which may not exist yet).
	AwaitStaged(ctx context.Context, id, nsPath string) error
	// Unstage deletes a pair no isolation adopted.
	Unstage(id string) (bool, error)
}

// IsolateTimeout bounds the wait, after Join, for Docker to move the
// interface into the container's namespace and the isolation after it.
const IsolateTimeout = 2 * time.Minute

// Driver is the remote network driver.
type Driver struct {
	life  Lifecycle
	stage Stager
	log   *slog.Logger
	nets  *networks

	joinMu  sync.Mutex // serialises Joins: settle, stage, isolate
	mu      sync.Mutex
	pending map[string]*pending // endpoint ID -> its isolation after Join
}

// pending is the isolation of one joined endpoint, waiting for its namespace.
type pending struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
}

// New returns a driver whose networks are persisted in networksFile.
func New(life Lifecycle, stage Stager, networksFile string, log *slog.Logger) (*Driver, error) {
	nets, err := loadNetworks(networksFile)
	if err != nil {
		return nil, err
	}
	return &Driver{life: life, stage: stage, log: log, nets: nets, pending: map[string]*pending{}}, nil
}

// Close stops the isolations still waiting for their namespace.
func (d *Driver) Close() {
	d.mu.Lock()
	ps := make([]*pending, 0, len(d.pending))
	for _, p := range d.pending {
		ps = append(ps, p)
	}
	d.mu.Unlock()
	for _, p := range ps {
		p.cancel()
		<-p.done
	}
}

// Handler serves the protocol: every call is a POST of JSON.
func (d *Driver) Handler() http.Handler {
	mux := http.NewServeMux()
	handle := func(name string, fn func(ctx context.Context, body []byte) (any, error)) {
		mux.HandleFunc("/"+name, func(w http.ResponseWriter, r *http.Request) {
			var body []byte
			if r.Body != nil {
				b, err := readBody(r)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				body = b
			}
			start := time.Now()
			resp, err := fn(r.Context(), body)
			w.Header().Set("Content-Type", contentType)
			if err != nil {
				d.log.Info("docker driver call failed", "call", name, "duration_seconds", time.Since(start).Seconds(), "err", err.Error())
				_ = json.NewEncoder(w).Encode(errResponse{Err: err.Error()})
				return
			}
			d.log.Debug("docker driver call", "call", name, "duration_seconds", time.Since(start).Seconds())
			_ = json.NewEncoder(w).Encode(resp)
		})
	}
	handle("Plugin.Activate", func(context.Context, []byte) (any, error) {
		return activateResponse{Implements: []string{"NetworkDriver"}}, nil
	})
	handle("NetworkDriver.GetCapabilities", func(context.Context, []byte) (any, error) {
		return capabilitiesResponse{Scope: "local", ConnectivityScope: "local"}, nil
	})
	handle("NetworkDriver.CreateNetwork", d.createNetwork)
	handle("NetworkDriver.DeleteNetwork", d.deleteNetwork)
	handle("NetworkDriver.CreateEndpoint", d.createEndpoint)
	handle("NetworkDriver.DeleteEndpoint", d.deleteEndpoint)
	handle("NetworkDriver.EndpointOperInfo", d.operInfo)
	handle("NetworkDriver.Join", d.join)
	handle("NetworkDriver.Leave", d.leave)
	ack := func(context.Context, []byte) (any, error) { return struct{}{}, nil }
	for _, name := range []string{"DiscoverNew", "DiscoverDelete", "ProgramExternalConnectivity", "RevokeExternalConnectivity"} {
		handle("NetworkDriver."+name, ack)
	}
	// Anything else: 404, which Docker takes as "not implemented".
	return mux
}

func readBody(r *http.Request) ([]byte, error) {
	defer r.Body.Close()
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		return nil, err
	}
	if len(b) > 1<<20 {
		return nil, errors.New("request body over 1 MiB")
	}
	return b, nil
}

func decode(body []byte, v any) error {
	if len(body) == 0 {
		return errors.New("empty request")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("malformed request: %v", err)
	}
	return nil
}

func (d *Driver) createNetwork(_ context.Context, body []byte) (any, error) {
	var req createNetworkRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if req.NetworkID == "" {
		return nil, errors.New("NetworkID: missing")
	}
	for _, p := range req.IPv4Data {
		if p.Pool != "" && p.Pool != nullPool {
			return nil, fmt.Errorf("the isolator driver gives containers the host's own address: create the network with --ipam-driver null (it was given the pool %s)", p.Pool)
		}
	}
	if v, ok := req.Options[optIPv6].(bool); ok && v {
		return nil, errors.New("--ipv6: the isolator driver gives containers the host's IPv6 addresses when isolatord runs with --ipv6; the network itself takes no IPv6 pool")
	}
	opts, err := stringOptions("network", req.Options[optGeneric])
	if err != nil {
		return nil, err
	}
	if _, err := parseOptions("network", opts, settings{}); err != nil {
		return nil, err
	}
	if err := d.nets.put(req.NetworkID, opts); err != nil {
		return nil, err
	}
	d.log.Info("docker network created", "network_id", req.NetworkID, "options", opts)
	return struct{}{}, nil
}

func (d *Driver) deleteNetwork(_ context.Context, body []byte) (any, error) {
	var req networkRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if err := d.nets.remove(req.NetworkID); err != nil {
		return nil, err
	}
	d.log.Info("docker network deleted", "network_id", req.NetworkID)
	return struct{}{}, nil
}

// network returns the settings of network id.
func (d *Driver) network(id string) (settings, error) {
	opts, ok := d.nets.get(id)
	if !ok {
		return settings{}, fmt.Errorf("network %s is not known to isolatord (created before its state was lost?): remove and create it again", id)
	}
	return parseOptions("network", opts, settings{})
}

func (d *Driver) createEndpoint(ctx context.Context, body []byte) (any, error) {
	var req createEndpointRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if req.Interface != nil && (req.Interface.Address != "" || req.Interface.AddressIPv6 != "") {
		return nil, fmt.Errorf("endpoint %s was given the address %s by Docker's IPAM: create the network with --ipam-driver null (containers share the host's address)", req.EndpointID, req.Interface.Address+req.Interface.AddressIPv6)
	}
	if err := d.checkMAC(req.Interface); err != nil {
		return nil, err
	}
	base, err := d.network(req.NetworkID)
	if err != nil {
		return nil, err
	}
	own, err := endpointOptions(req.Options)
	if err != nil {
		return nil, err
	}
	s, err := parseOptions("endpoint", own, base)
	if err != nil {
		return nil, err
	}
	pbs, err := portBindings(req.Options)
	if err != nil {
		return nil, err
	}
	ports, err := requestedPorts(pbs, s.shared)
	if err != nil {
		return nil, err
	}
	rec, err := d.life.PrepareWith(ctx, req.EndpointID, isolator.PrepareOptions{
		Ports:  ports,
		Labels: map[string]string{LabelNetwork: req.NetworkID},
		Egress: s.egress, Ingress: s.ingress,
	})
	if err != nil {
		return nil, d.explainHolders(ctx, err)
	}
	d.log.Info("docker endpoint prepared", "endpoint_id", req.EndpointID, "network_id", req.NetworkID, "ports", rec.Ports.String(), "shared", rec.Shared.String(), "ephemeral_ports", rec.Ephemeral.String())
	host := d.life.Host()
	out := &endpointInterface{Address: (&host.IP).String()}
	if req.Interface == nil || req.Interface.MacAddress == "" {
		out.MacAddress = host.MAC.String()
	}
	return createEndpointResponse{Interface: out}, nil
}

// checkMAC refuses a MAC of Docker's (docker run --mac-address) other
// than the host's: containers carry the host's MAC, and the filters and
// neighbour entries count on it.
func (d *Driver) checkMAC(ifc *endpointInterface) error {
	if ifc == nil || ifc.MacAddress == "" {
		return nil
	}
	want := d.life.Host().MAC
	if m, err := net.ParseMAC(ifc.MacAddress); err != nil || m.String() != want.String() {
		return fmt.Errorf("--mac-address %s: containers on an isolator network carry the host's MAC (%s)", ifc.MacAddress, want)
	}
	return nil
}

// explainHolders adds to a port conflict which holders are Docker
// endpoints, and of which network: Docker users know containers, not
// endpoint IDs.
func (d *Driver) explainHolders(ctx context.Context, err error) error {
	var ce *ephemeral.ConflictError
	if !errors.As(err, &ce) {
		return err
	}
	var notes []string
	for _, h := range ce.Holders {
		r, gerr := d.life.Get(ctx, h.Container)
		if gerr != nil {
			continue
		}
		if n, ok := r.Labels[LabelNetwork]; ok {
			notes = append(notes, fmt.Sprintf("%s is a Docker endpoint of network %s (docker network inspect %.12s names its container)", h.Container, n, n))
		}
	}
	if len(notes) == 0 {
		return err
	}
	return fmt.Errorf("%w; %s", err, strings.Join(notes, "; "))
}

func (d *Driver) operInfo(ctx context.Context, body []byte) (any, error) {
	var req endpointRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	rec, err := d.life.Get(ctx, req.EndpointID)
	if err != nil {
		return nil, err
	}
	return operInfoResponse{Value: map[string]string{
		"isolator.state":           string(rec.State),
		"isolator.ports":           rec.Ports.String(),
		"isolator.shared-ports":    rec.Shared.String(),
		"isolator.ephemeral-ports": rec.Ephemeral.String(),
	}}, nil
}

// join stages the endpoint's veth pair and answers with the end Docker is
// to move in (as eth0). Docker 20.10 joins before the container's
// namespace exists (it is mounted at SandboxKey by the container's
// prestart hook, which then moves the interface in), so the isolation
// waits for that in the background: nothing the container sends can leave
// before it (the host end of the pair is down until its filters are in).
// No gateway is returned (Docker would race the lifecycle's default route)
// and DisableGatewayService keeps Docker from adding a gateway bridge: the
// lifecycle gives the container the host's default route.
func (d *Driver) join(ctx context.Context, body []byte) (any, error) {
	var req joinRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if req.SandboxKey == "" {
		return nil, errors.New("SandboxKey: missing")
	}
	rec, err := d.life.Get(ctx, req.EndpointID)
	if err != nil {
		return nil, err
	}
	if !rec.HasLabels(networkLabel(req.NetworkID)) {
		return nil, fmt.Errorf("endpoint %s is not of network %s in isolatord", req.EndpointID, req.NetworkID)
	}
	if rec.State != isolator.StatePrepared {
		return nil, fmt.Errorf("endpoint %s is %s, not prepared: joined twice?", req.EndpointID, rec.State)
	}
	// A Join again supersedes the one before: its pending isolation stops
	// (and unstages its pair) before the pair is staged anew, not after.
	d.joinMu.Lock()
	defer d.joinMu.Unlock()
	d.settle(req.EndpointID)
	peer, err := d.stage.Stage(ctx, req.EndpointID)
	if err != nil {
		return nil, err
	}
	d.isolateLater(req.EndpointID, req.SandboxKey)
	return joinResponse{InterfaceName: interfaceName{SrcName: peer, DstPrefix: "eth"}, DisableGatewayService: true}, nil
}

// isolateLater waits for the endpoint's interface in the namespace at
// nsPath and isolates the container there. None is pending for id (join
// settled it, under joinMu).
func (d *Driver) isolateLater(id, nsPath string) {
	ctx, cancel := context.WithTimeout(context.Background(), IsolateTimeout)
	p := &pending{cancel: cancel, done: make(chan struct{})}
	d.mu.Lock()
	d.pending[id] = p
	d.mu.Unlock()
	go func() {
		defer close(p.done)
		defer cancel()
		start := time.Now()
		err := d.stage.AwaitStaged(ctx, id, nsPath)
		arrived := time.Since(start)
		if err == nil {
			_, err = d.life.Isolate(ctx, id, isolator.IsolateTarget{NetNSPath: nsPath})
		}
		if err != nil {
			p.err = err
			d.log.Error("docker endpoint not isolated: its container has no network", "endpoint_id", id, "netns", nsPath, "err", err.Error())
			if _, uerr := d.stage.Unstage(id); uerr != nil {
				d.log.Error("remove staged veth", "endpoint_id", id, "err", uerr.Error())
			}
			return
		}
		d.log.Info("docker endpoint isolated", "endpoint_id", id, "netns", nsPath, "interface_arrived_seconds", arrived.Seconds(), "duration_seconds", time.Since(start).Seconds())
	}()
}

// settle stops the endpoint's pending isolation, if any, and waits for it.
func (d *Driver) settle(id string) {
	d.mu.Lock()
	p, ok := d.pending[id]
	delete(d.pending, id)
	d.mu.Unlock()
	if ok {
		p.cancel()
		<-p.done
	}
}

// Wait waits until the endpoint's isolation after Join has ended and
// returns its outcome (nil when there is none pending).
func (d *Driver) Wait(id string) error {
	d.mu.Lock()
	p, ok := d.pending[id]
	d.mu.Unlock()
	if !ok {
		return nil
	}
	<-p.done
	return p.err
}

func (d *Driver) leave(ctx context.Context, body []byte) (any, error) {
	var req endpointRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if err := d.ofNetwork(ctx, req.EndpointID, req.NetworkID); err != nil {
		return nil, err
	}
	// The container is going: an isolation still waiting for it stops.
	d.settle(req.EndpointID)
	return struct{}{}, nil
}

func (d *Driver) deleteEndpoint(ctx context.Context, body []byte) (any, error) {
	var req endpointRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if err := d.ofNetwork(ctx, req.EndpointID, req.NetworkID); err != nil {
		return nil, err
	}
	d.settle(req.EndpointID)
	if _, err := d.stage.Unstage(req.EndpointID); err != nil {
		return nil, err
	}
	kept, err := d.life.CleanupIfLabeled(ctx, req.EndpointID, networkLabel(req.NetworkID))
	if err != nil {
		return nil, err
	}
	if kept {
		return nil, heldElsewhere(req.EndpointID, req.NetworkID)
	}
	d.log.Info("docker endpoint deleted", "endpoint_id", req.EndpointID, "network_id", req.NetworkID)
	return struct{}{}, nil
}

// ofNetwork refuses a call on endpoint id naming another network than the
// one its record carries, before anything of the endpoint (its pending
// isolation, its staged pair) is touched. An endpoint without a record
// passes: Docker retries Leave and DeleteEndpoint.
func (d *Driver) ofNetwork(ctx context.Context, id, network string) error {
	rec, err := d.life.Get(ctx, id)
	if errors.Is(err, isolator.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if !rec.HasLabels(networkLabel(network)) {
		return heldElsewhere(id, network)
	}
	return nil
}

func networkLabel(network string) map[string]string {
	return map[string]string{LabelNetwork: network}
}

func heldElsewhere(id, network string) error {
	return fmt.Errorf("endpoint %s is held by isolatord for another network than %s: left alone", id, network)
}
