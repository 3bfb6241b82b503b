package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/isolatord/isolatord/api"
	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/ephemeral"
)

// ContainerIfName is the only interface name the plugin accepts: isolatord
// always names the container's end of its veth eth0.
const ContainerIfName = "eth0"

// maxIDLength is the longest container ID isolatord accepts.
const maxIDLength = 128

// Labels the plugin stores with each container it prepares, so that DEL, GC
// and CHECK only ever touch containers of their own network.
const (
	LabelNetwork = "cni.network"
	LabelIfName  = "cni.ifname"
	// LabelArgPrefix prefixes the CNI_ARGS values the plugin copies into
	// labels (see labelArgs), e.g. "cni.arg.K8S_POD_NAME".
	LabelArgPrefix = "cni.arg."
)

// ArgSharedPorts is the CNI_ARGS key through which a runtime asks for
// ports to be held shared (SO_REUSEPORT across containers), e.g.
// CNI_ARGS="IgnoreUnknown=1;ISOLATOR_SHARED_PORTS=31443,31500-31501".
// Nomad 1.9 and later pass it from `network { cni { args = { ... } } }`;
// with Nomad 1.6 a network's "sharedPorts" does the same for every alloc.
const ArgSharedPorts = "ISOLATOR_SHARED_PORTS"

// labelArgs are the CNI_ARGS keys copied into labels, so that `isolatorctl
// list` shows which pod or allocation a container belongs to.
var labelArgs = []string{
	"K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID", "K8S_POD_INFRA_CONTAINER_ID",
	"NOMAD_REGION", "NOMAD_NAMESPACE", "NOMAD_JOB_ID", "NOMAD_GROUP_NAME", "NOMAD_ALLOC_ID",
}

// NetConf is the plugin's configuration: the network's entry in a conflist,
// with what the runtime adds (name, cniVersion, runtimeConfig, prevResult).
type NetConf struct {
	types.PluginConf

	// Socket is isolatord's unix socket; default api.DefaultSocket.
	Socket string `json:"socket,omitempty"`
	// Ports are static ports every container of this network holds
	// exclusively, on top of its port mappings.
	Ports PortList `json:"ports,omitempty"`
	// SharedPorts are static ports every container of this network holds
	// shared with the others that ask for them shared. A port mapping whose
	// hostPort is listed here is held shared too.
	SharedPorts PortList `json:"sharedPorts,omitempty"`
	// DaemonWait is how long a verb waits for isolatord while it is down
	// (restarting) before failing: a duration ("10s", "0") or seconds;
	// default DefaultDaemonWait.
	DaemonWait waitDuration `json:"daemonWait,omitzero"`

	RuntimeConfig struct {
		PortMappings []PortMapping `json:"portMappings,omitempty"`
	} `json:"runtimeConfig,omitempty"`

	// legacyAttachments is "cni.dev/attachments", the misspelt key of early
	// 1.1 runtimes (libcni sends both), used when valid-attachments is absent.
	legacyAttachments []types.GCAttachment
	// hasAttachments records that the GC list was present (possibly empty).
	hasAttachments bool
}

// PortMapping is one entry of the portMappings capability (CNI conventions).
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
	HostIP        string `json:"hostIP,omitempty"`
}

func (m PortMapping) String() string {
	proto := m.Protocol
	if proto == "" {
		proto = "tcp"
	}
	s := fmt.Sprintf("{hostPort: %d, containerPort: %d, protocol: %s", m.HostPort, m.ContainerPort, proto)
	if m.HostIP != "" {
		s += ", hostIP: " + m.HostIP
	}
	return s + "}"
}

// PortList is a set of ports in the configuration. JSON accepts the
// operator syntax "31000-31009,31100" as a string, or an array whose elements
// are port numbers or such strings: [31000, "31010-31019"].
type PortList struct {
	ephemeral.Set
}

// UnmarshalJSON implements json.Unmarshaler.
func (p *PortList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		p.Set = ephemeral.Set{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		set, err := ephemeral.ParseSet(s)
		if err != nil {
			return err
		}
		p.Set = set
		return nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(b, &elems); err != nil {
		return fmt.Errorf("want a port list such as \"31000-31009,31100\" or [31000, \"31010-31019\"], got %s", b)
	}
	var set ephemeral.Set
	for i, e := range elems {
		dec := json.NewDecoder(bytes.NewReader(e))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("element %d: %v", i, err)
		}
		var tok string
		switch x := v.(type) {
		case json.Number:
			tok = x.String()
		case string:
			tok = x
		default:
			return fmt.Errorf("element %d: want a port number or a range string, got %s", i, e)
		}
		one, err := ephemeral.ParseSet(tok)
		if err != nil {
			return fmt.Errorf("element %d: %v", i, err)
		}
		if one.Empty() {
			return fmt.Errorf("element %d: empty port list", i)
		}
		set = set.Union(one)
	}
	p.Set = set
	return nil
}

// MarshalJSON writes the operator syntax.
func (p PortList) MarshalJSON() ([]byte, error) { return json.Marshal(p.Set.String()) }

// parseConfig decodes and validates the plugin's stdin. Errors are CNI
// errors (code 7 for a bad configuration).
func parseConfig(stdin []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, parseError(err)
	}
	if conf.Socket == "" {
		conf.Socket = api.DefaultSocket
	}
	if both := conf.Ports.Intersect(conf.SharedPorts.Set); !both.Empty() {
		return nil, configError("ports %s are listed both in \"ports\" and in \"sharedPorts\"", both)
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "isolator-cni: cannot parse prevResult: "+err.Error(), "")
		}
	}
	return conf, nil
}

func parseError(err error) error {
	return types.NewError(types.ErrDecodingFailure, "isolator-cni: cannot parse network configuration: "+err.Error(), "")
}

// parseGCConfig is parseConfig with what only GC reads: whether the list
// of valid attachments is present (possibly empty), and the list under the
// key of early 1.1 runtimes.
func parseGCConfig(stdin []byte) (*NetConf, error) {
	conf, err := parseConfig(stdin)
	if err != nil {
		return nil, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &raw); err == nil {
		_, conf.hasAttachments = raw["cni.dev/valid-attachments"]
		if a, ok := raw["cni.dev/attachments"]; ok {
			conf.hasAttachments = true
			_ = json.Unmarshal(a, &conf.legacyAttachments)
		}
	}
	return conf, nil
}

// delConf is what DEL reads of its configuration: the network's name, and
// where and how long to wait for isolatord.
type delConf struct {
	Name       string          `json:"name"`
	Socket     string          `json:"socket,omitempty"`
	DaemonWait json.RawMessage `json:"daemonWait,omitempty"`
}

// parseDelConfig decodes the members DEL reads (the input must still be a
// JSON object). DEL removes what ADD set up whatever else the
// configuration says now (ports edited since, a prevResult DEL does not
// use), and decoding three members costs the plugin's start a fraction of
// decoding them all. A daemonWait edited since into one ADD would refuse
// leaves DEL the default wait: a DEL should succeed whenever it can.
func parseDelConfig(stdin []byte) (*NetConf, error) {
	var d delConf
	if err := json.Unmarshal(stdin, &d); err != nil {
		return nil, parseError(err)
	}
	conf := &NetConf{Socket: d.Socket}
	if len(d.DaemonWait) > 0 && json.Unmarshal(d.DaemonWait, &conf.DaemonWait) != nil {
		conf.DaemonWait = waitDuration{}
	}
	conf.Name = d.Name
	if conf.Socket == "" {
		conf.Socket = api.DefaultSocket
	}
	return conf, nil
}

// attachments returns the GC's list of valid attachments.
func (c *NetConf) attachments() []types.GCAttachment {
	if c.ValidAttachments != nil {
		return c.ValidAttachments
	}
	return c.legacyAttachments
}

// configError is a CNI "invalid network configuration" error (code 7).
func configError(format string, args ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, "isolator-cni: "+fmt.Sprintf(format, args...), "")
}

// cniArgs are the key/value pairs of CNI_ARGS ("K1=V1;K2=V2").
type cniArgs map[string]string

// parseArgs splits CNI_ARGS. Elements without '=' are refused; unknown keys
// are kept (and ignored by the plugin), whatever IgnoreUnknown says, because
// runtimes pass keys meant for other plugins.
func parseArgs(s string) (cniArgs, error) {
	out := cniArgs{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("isolator-cni: CNI_ARGS: %q is not KEY=VALUE", kv), "")
		}
		out[k] = v
	}
	return out, nil
}

// labels are what ADD stores with the container.
func (a cniArgs) labels(network, ifname string) map[string]string {
	l := map[string]string{LabelNetwork: network, LabelIfName: ifname}
	for _, k := range labelArgs {
		if v, ok := a[k]; ok && v != "" && len(v) <= 253 {
			l[LabelArgPrefix+k] = v
		}
	}
	return l
}

// PortRequest is the static ports a container asks isolatord for.
type PortRequest struct {
	Exclusive ephemeral.Set
	Shared    ephemeral.Set
}

func (r PortRequest) String() string {
	switch {
	case r.Exclusive.Empty() && r.Shared.Empty():
		return "none"
	case r.Shared.Empty():
		return r.Exclusive.String()
	case r.Exclusive.Empty():
		return "shared " + r.Shared.String()
	}
	return r.Exclusive.String() + " + shared " + r.Shared.String()
}

// Equal reports whether both requests hold the same ports the same way.
func (r PortRequest) Equal(o PortRequest) bool {
	return r.Exclusive.Equal(o.Exclusive) && r.Shared.Equal(o.Shared)
}

// Proto converts the request to the API's list, sorted by begin.
func (r PortRequest) Proto() []*pb.PortRange {
	var out []*pb.PortRange
	for _, rg := range r.Exclusive.Ranges() {
		out = append(out, &pb.PortRange{Begin: uint32(rg.Begin), End: uint32(rg.End)})
	}
	for _, rg := range r.Shared.Ranges() {
		out = append(out, &pb.PortRange{Begin: uint32(rg.Begin), End: uint32(rg.End), Shared: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetBegin() < out[j].GetBegin() })
	return out
}

// portRequestFromProto is the inverse of Proto, for a container the daemon
// returned. Ranges outside 1-65535 cannot come from the daemon; they are
// clipped rather than trusted.
func portRequestFromProto(ps []*pb.PortRange) PortRequest {
	var excl, shared []ephemeral.Range
	for _, p := range ps {
		b, e := p.GetBegin(), p.GetEnd()
		if b == 0 || b > 65535 || e < b {
			continue
		}
		if e > 65535 {
			e = 65535
		}
		r := ephemeral.Range{Begin: uint16(b), End: uint16(e)}
		if p.GetShared() {
			shared = append(shared, r)
		} else {
			excl = append(excl, r)
		}
	}
	return PortRequest{Exclusive: ephemeral.NewSet(excl...), Shared: ephemeral.NewSet(shared...)}
}

// requestedPorts merges the network's static ports, the shared ports from
// CNI_ARGS and the runtime's port mappings into one request. hostIP is the
// address isolatord's containers share ("" when unknown: hostIP fields are
// then only checked for being addresses).
//
// A mapping is one host port: tcp and udp entries for the same hostPort are
// the same port (isolatord steers both protocols of a port to its holder).
// There is no NAT, so a mapping whose containerPort differs from its
// hostPort is refused (containerPort 0 means "same as hostPort").
func requestedPorts(conf *NetConf, args cniArgs, hostIP string) (PortRequest, error) {
	shared := conf.SharedPorts.Set
	if v, ok := args[ArgSharedPorts]; ok {
		s, err := ephemeral.ParseSet(strings.ReplaceAll(v, " ", ""))
		if err != nil {
			return PortRequest{}, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("isolator-cni: CNI_ARGS %s=%s: %v", ArgSharedPorts, v, err), "")
		}
		if both := s.Intersect(conf.Ports.Set); !both.Empty() {
			return PortRequest{}, configError("CNI_ARGS %s asks for ports %s shared, but the network's \"ports\" hold them exclusively", ArgSharedPorts, both)
		}
		shared = shared.Union(s)
	}
	excl := conf.Ports.Set
	for i, m := range conf.RuntimeConfig.PortMappings {
		p, err := mappingPort(m, hostIP)
		if err != nil {
			return PortRequest{}, configError("runtimeConfig.portMappings[%d] %s: %v", i, m, err)
		}
		one := ephemeral.NewSet(ephemeral.Range{Begin: p, End: p})
		if !shared.Contains(p) {
			excl = excl.Union(one)
		}
	}
	return PortRequest{Exclusive: excl, Shared: shared}, nil
}

// mappingPort validates one port mapping and returns its host port.
func mappingPort(m PortMapping, hostIP string) (uint16, error) {
	if m.HostPort < 1 || m.HostPort > 65535 {
		return 0, fmt.Errorf("hostPort %d is out of range 1-65535", m.HostPort)
	}
	if m.ContainerPort < 0 || m.ContainerPort > 65535 {
		return 0, fmt.Errorf("containerPort %d is out of range 1-65535", m.ContainerPort)
	}
	if m.ContainerPort != 0 && m.ContainerPort != m.HostPort {
		return 0, fmt.Errorf("containerPort %d differs from hostPort %d: isolatord shares the host's IP address without NAT, "+
			"so the container must listen on the host port itself (use containerPort %d)", m.ContainerPort, m.HostPort, m.HostPort)
	}
	switch strings.ToLower(m.Protocol) {
	case "", "tcp", "udp":
	default:
		return 0, fmt.Errorf("protocol %q is not supported: isolatord steers tcp and udp ports", m.Protocol)
	}
	if !anyHostIP(m.HostIP) {
		ip := net.ParseIP(m.HostIP)
		if ip == nil {
			return 0, fmt.Errorf("hostIP %q is not an IP address", m.HostIP)
		}
		if hostIP != "" && !ip.Equal(net.ParseIP(hostIP)) {
			return 0, fmt.Errorf("hostIP %s is not the host address %s that isolatord's containers share", m.HostIP, hostIP)
		}
	}
	return uint16(m.HostPort), nil
}

// checkContainerID refuses IDs isolatord would refuse, with the CNI wording.
// skel has already checked the characters ([A-Za-z0-9][A-Za-z0-9_.-]*).
func checkContainerID(id string) error {
	if id == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "isolator-cni: CNI_CONTAINERID is empty", "")
	}
	if len(id) > maxIDLength {
		return types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("isolator-cni: CNI_CONTAINERID is %d characters long; isolatord accepts at most %d ([A-Za-z0-9][A-Za-z0-9_.-]{0,127})", len(id), maxIDLength), id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '.' || c == '-')
		if !ok {
			return types.NewError(types.ErrInvalidEnvironmentVariables,
				fmt.Sprintf("isolator-cni: CNI_CONTAINERID %q has %q at position %d; isolatord accepts [A-Za-z0-9][A-Za-z0-9_.-]{0,127}", id, c, i), "")
		}
	}
	return nil
}

// checkIfName refuses an interface name other than eth0.
func checkIfName(ifname string) error {
	if ifname != ContainerIfName {
		return types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("isolator-cni: CNI_IFNAME is %q, but isolatord always names the container's interface %s; configure the runtime to use %s", ifname, ContainerIfName, ContainerIfName), "")
	}
	return nil
}
