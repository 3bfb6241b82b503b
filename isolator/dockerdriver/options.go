package dockerdriver

import (
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane/rate"
)

// The options of a network (docker network create -o KEY=VALUE) and of an
// endpoint (docker network connect --driver-opt KEY=VALUE; they override
// the network's).
const (
	// OptSharedPorts: published ports in this set are shared with other
	// containers of the same port (SO_REUSEPORT), e.g. "8080,9000-9010".
	OptSharedPorts = "shared-ports"
	// OptEgressRate and OptIngressRate: bandwidth limits of each
	// container (bytes per second or a rate such as 10MB/s, 100Mbit);
	// without them the daemon's defaults apply.
	OptEgressRate  = "egress-rate-limit"
	OptIngressRate = "ingress-rate-limit"
)

var knownOptions = []string{OptSharedPorts, OptEgressRate, OptIngressRate}

// settings are the parsed options.
type settings struct {
	shared          ephemeral.Set
	egress, ingress *isolator.LimitSpec
}

// parseOptions checks options (where names them in errors) and parses
// them over base.
func parseOptions(where string, opts map[string]string, base settings) (settings, error) {
	s := base
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := opts[k]
		switch k {
		case OptSharedPorts:
			set, err := ephemeral.ParseSet(v)
			if err != nil {
				return s, fmt.Errorf("%s option %s=%q: %v", where, k, v, err)
			}
			s.shared = set
		case OptEgressRate, OptIngressRate:
			r, err := rate.Parse(v)
			if err != nil {
				return s, fmt.Errorf("%s option %s=%q: %v", where, k, v, err)
			}
			l := &isolator.LimitSpec{Rate: int64(r)}
			if k == OptEgressRate {
				s.egress = l
			} else {
				s.ingress = l
			}
		default:
			return s, fmt.Errorf("%s option %q is unknown to the isolator driver (it knows %s)", where, k, strings.Join(knownOptions, ", "))
		}
	}
	return s, nil
}

// stringOptions turns a JSON object of options into strings, refusing
// values that are not strings.
func stringOptions(where string, raw any) (map[string]string, error) {
	out := map[string]string{}
	if raw == nil {
		return out, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s options: not an object (%T)", where, raw)
	}
	for k, v := range m {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%s option %q: value %v is not a string", where, k, v)
		}
		out[k] = s
	}
	return out, nil
}

// endpointOptions are the options of an endpoint of its own: the keys not
// set by Docker itself (com.docker.*).
func endpointOptions(opts map[string]any) (map[string]string, error) {
	own := map[string]any{}
	for k, v := range opts {
		if !strings.HasPrefix(k, optDocker) {
			own[k] = v
		}
	}
	return stringOptions("endpoint", own)
}

// portBindings decodes com.docker.network.portmap from options (absent: none).
func portBindings(opts map[string]any) ([]portBinding, error) {
	raw, ok := opts[optPortMap]
	if !ok || raw == nil {
		return nil, nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	var pbs []portBinding
	if err := json.Unmarshal(b, &pbs); err != nil {
		return nil, fmt.Errorf("%s: %v", optPortMap, err)
	}
	return pbs, nil
}

// bindingString prints a binding as docker run -p takes it.
func bindingString(pb portBinding) string {
	host := fmt.Sprint(pb.HostPort)
	if pb.HostPortEnd > pb.HostPort {
		host = fmt.Sprintf("%d-%d", pb.HostPort, pb.HostPortEnd)
	}
	s := fmt.Sprintf("%s:%d/%s", host, pb.Port, protoName(pb.Proto))
	if pb.HostIP != "" {
		s = pb.HostIP + ":" + s
	}
	return s
}

// requestedPorts turns the -p bindings into the static ports to reserve:
// each container port P published as P:P (TCP and UDP alike: a static
// port is the container's for both). There is no NAT: a host port other
// than the container's is refused, saying so; HostPort 0 (docker run -p P
// or -P) takes P itself, the one host port that reaches container port P.
// Ports in shared are requested shared. Each binding is one PortSpec: the
// lifecycle (isolator.ParsePorts) merges them.
func requestedPorts(pbs []portBinding, shared ephemeral.Set) ([]isolator.PortSpec, error) {
	specs := make([]isolator.PortSpec, 0, len(pbs))
	for _, pb := range pbs {
		if pb.Proto != 6 && pb.Proto != 17 {
			return nil, fmt.Errorf("port mapping %s: the isolator driver publishes TCP and UDP ports only", bindingString(pb))
		}
		if pb.HostIP != "" {
			if ip := net.ParseIP(pb.HostIP); ip == nil || !ip.IsUnspecified() {
				return nil, fmt.Errorf("port mapping %s: the isolator driver gives a container its port on every host address; a host IP in -p is not offered (publish it as -p %d:%d)", bindingString(pb), pb.Port, pb.Port)
			}
		}
		if pb.Port == 0 || pb.Port > 65535 {
			return nil, fmt.Errorf("port mapping %s: container port %d out of range 1-65535", bindingString(pb), pb.Port)
		}
		end := pb.HostPortEnd
		if end < pb.HostPort {
			end = pb.HostPort
		}
		if pb.HostPort != 0 && (pb.Port < pb.HostPort || pb.Port > end) {
			return nil, fmt.Errorf("port mapping %s refused: the isolator driver gives containers the host's own address and does no NAT, so a container's port %d is host port %d; publish it as -p %d:%d",
				bindingString(pb), pb.Port, pb.Port, pb.Port, pb.Port)
		}
		port := uint16(pb.Port)
		specs = append(specs, isolator.PortSpec{Begin: uint32(port), End: uint32(port), Shared: shared.Contains(port)})
	}
	return specs, nil
}
