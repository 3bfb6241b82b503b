package dockerdriver

// The remote network driver protocol (moby libnetwork docs/remote.md and
// drivers/remote/api): HTTP POST with a JSON body to /Plugin.Activate and
// /NetworkDriver.<Call>; a call that fails answers 200 with {"Err": ...},
// an unknown one 404. Only the fields isolatord reads or writes are here.

import "strconv"

// contentType is what plugins answer with.
const contentType = "application/vnd.docker.plugins.v1+json"

// Option keys Docker sets.
const (
	optGeneric = "com.docker.network.generic" // the -o options of a network
	optPortMap = "com.docker.network.portmap" // -p bindings (endpoint and join options)
	optDocker  = "com.docker."                // prefix of every key Docker sets
	nullPool   = "0.0.0.0/0"                  // what the null IPAM driver hands out
	optIPv6    = "com.docker.network.enable_ipv6"
)

type errResponse struct {
	Err string
}

type activateResponse struct {
	Implements []string
}

type capabilitiesResponse struct {
	Scope             string
	ConnectivityScope string
}

type ipamData struct {
	AddressSpace string
	Pool         string
	Gateway      string
}

type createNetworkRequest struct {
	NetworkID string
	Options   map[string]any
	IPv4Data  []ipamData
	IPv6Data  []ipamData
}

type networkRequest struct {
	NetworkID string
}

type endpointInterface struct {
	Address     string `json:",omitempty"`
	AddressIPv6 string `json:",omitempty"`
	MacAddress  string `json:",omitempty"`
}

type createEndpointRequest struct {
	NetworkID  string
	EndpointID string
	Interface  *endpointInterface
	Options    map[string]any
}

type createEndpointResponse struct {
	Interface *endpointInterface `json:",omitempty"`
}

type endpointRequest struct {
	NetworkID  string
	EndpointID string
}

type joinRequest struct {
	NetworkID  string
	EndpointID string
	SandboxKey string
	Options    map[string]any
}

type interfaceName struct {
	SrcName   string
	DstPrefix string
}

type joinResponse struct {
	InterfaceName         interfaceName
	Gateway               string `json:",omitempty"`
	DisableGatewayService bool
}

type operInfoResponse struct {
	Value map[string]string
}

// portBinding is one -p mapping (libnetwork types.PortBinding).
type portBinding struct {
	Proto       int // IANA: 6 TCP, 17 UDP, 132 SCTP
	IP          string
	Port        uint32 // the container's port
	HostIP      string
	HostPort    uint32 // 0: Docker asks the driver to pick
	HostPortEnd uint32
}

func protoName(p int) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	}
	return "protocol " + strconv.Itoa(p)
}
