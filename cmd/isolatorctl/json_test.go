package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
)

// The JSON shapes tests decode -o json into: the field names scripts rely on.

type rangeJSON struct {
	Begin uint32 `json:"begin"`
	End   uint32 `json:"end"`
}

type portJSON struct {
	Begin  uint32 `json:"begin"`
	End    uint32 `json:"end"`
	Shared bool   `json:"shared"`
}

type containerJSON struct {
	ContainerID    string            `json:"container_id"`
	State          string            `json:"state"`
	EphemeralPorts *rangeJSON        `json:"ephemeral_ports"`
	Ports          []portJSON        `json:"ports"`
	Veth           string            `json:"veth"`
	Netns          string            `json:"netns"`
	Pid            int32             `json:"pid"`
	NetnsSource    string            `json:"netns_source"`
	CreatedAt      string            `json:"created_at,omitempty"`
	IsolatedAt     string            `json:"isolated_at,omitempty"`
	EgressLimit    *limitJSON        `json:"egress_limit"`  // null: none
	IngressLimit   *limitJSON        `json:"ingress_limit"` // null: none
	Labels         map[string]string `json:"labels"`        // {} when none
	PinOwned       bool              `json:"pin_owned"`     // false: the runtime's pin (or not isolated)
	NotRecovered   []string          `json:"not_recovered,omitempty"`
}

// limitJSON is a bandwidth limit: bytes per second and bytes.
type limitJSON struct {
	Rate  int64 `json:"rate"`
	Burst int64 `json:"burst"`
	Ceil  int64 `json:"ceil"`
}

type shapingJSON struct {
	Limit          *limitJSON `json:"limit"`
	Enforced       bool       `json:"enforced"`
	Queue          string     `json:"queue"`
	Bytes          uint64     `json:"bytes"`
	Packets        uint64     `json:"packets"`
	Drops          uint64     `json:"drops"`
	Overlimits     uint64     `json:"overlimits"`
	BacklogBytes   uint64     `json:"backlog_bytes"`
	BacklogPackets uint64     `json:"backlog_packets"`
}

type trafficJSON struct {
	RxBytes   uint64 `json:"rx_bytes"`
	RxPackets uint64 `json:"rx_packets"`
	RxErrors  uint64 `json:"rx_errors"`
	RxDropped uint64 `json:"rx_dropped"`
	TxBytes   uint64 `json:"tx_bytes"`
	TxPackets uint64 `json:"tx_packets"`
	TxErrors  uint64 `json:"tx_errors"`
	TxDropped uint64 `json:"tx_dropped"`
}

type rttJSON struct {
	P50Us   uint64 `json:"p50_us"`
	P90Us   uint64 `json:"p90_us"`
	P95Us   uint64 `json:"p95_us"`
	P99Us   uint64 `json:"p99_us"`
	Samples uint64 `json:"samples"`
}

type tcpJSON struct {
	ActiveConnections   uint64   `json:"active_connections"`
	TimeWaitConnections uint64   `json:"time_wait_connections"`
	RTT                 *rttJSON `json:"rtt"`
}

type snmpJSON struct {
	IP   map[string]uint64 `json:"ip"`
	ICMP map[string]uint64 `json:"icmp"`
	TCP  map[string]uint64 `json:"tcp"`
	UDP  map[string]uint64 `json:"udp"`
}

type usageJSON struct {
	ContainerID    string       `json:"container_id"`
	EphemeralPorts *rangeJSON   `json:"ephemeral_ports"`
	Traffic        *trafficJSON `json:"traffic"`
	EgressShaping  *shapingJSON `json:"egress_shaping"`  // null: no egress limit
	IngressShaping *shapingJSON `json:"ingress_shaping"` // null: no ingress limit
	TCP            *tcpJSON     `json:"tcp"`
	SNMP           *snmpJSON    `json:"snmp"`
	CollectedAt    string       `json:"collected_at,omitempty"`
	// frames the host refused from the container, by reason (null: not isolated)
	DroppedPackets map[string]uint64 `json:"dropped_packets"`
}

type statusJSON struct {
	Version              string            `json:"version"`
	HostIP               string            `json:"host_ip"`
	HostIPv6             []string          `json:"host_ipv6"`
	HostInterface        string            `json:"host_interface"`
	EphemeralPool        string            `json:"ephemeral_pool"`
	BlockSize            uint32            `json:"block_size"`
	EphemeralBlocksTotal uint32            `json:"ephemeral_blocks_total"`
	EphemeralBlocksFree  uint32            `json:"ephemeral_blocks_free"`
	EphemeralBlocksUsed  uint32            `json:"ephemeral_blocks_used"`
	ManagedPorts         string            `json:"managed_ports"`
	StaticPortsExclusive string            `json:"static_ports_exclusive"`
	StaticPortsShared    string            `json:"static_ports_shared"`
	Features             map[string]bool   `json:"features"`
	Containers           uint32            `json:"containers"`
	ContainersByState    map[string]uint32 `json:"containers_by_state"`
	DefaultEgressLimit   *limitJSON        `json:"default_egress_limit"`
	DefaultIngressLimit  *limitJSON        `json:"default_ingress_limit"`
	LinkSpeedMbps        uint64            `json:"link_speed_mbps"` // 0: unknown
	ShapingQueue         string            `json:"shaping_queue"`   // "": no HTB, limits refused
	HostPorts            hostPortsJSON     `json:"host_ports"`
	Unattributed         []string          `json:"unattributed"` // kernel objects of no container, left in place
	Rebuilt              []string          `json:"rebuilt"`      // containers rebuilt from the kernel at start-up
	StateMovedAside      string            `json:"state_moved_aside,omitempty"`
	OrphansReclaimed     uint64            `json:"orphans_reclaimed"`
}

type cleanupJSON struct {
	ContainerID string `json:"container_id"`
}

type hostPortsJSON struct {
	Enabled   bool                   `json:"enabled"`
	Reserved  uint32                 `json:"reserved"`
	Conflicts []hostPortConflictJSON `json:"conflicts"`
}

type hostPortConflictJSON struct {
	Port   uint32 `json:"port"`
	Holder string `json:"holder"`
}

// jsonString is what -o json prints for r.
func jsonString(t *testing.T, r result) string {
	t.Helper()
	b, err := json.Marshal(r.jsonValue())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestJSONFollowsTheProto: every field of the response messages appears in
// the JSON under its proto name without a hand-written mirror; 64-bit
// counters are numbers, enums short lower-case names, timestamps RFC 3339
// and left out when unset, unset messages null, lists and maps never null.
func TestJSONFollowsTheProto(t *testing.T) {
	for _, m := range []proto.Message{&isolatordv1.Container{}, &isolatordv1.UsageResponse{}, &isolatordv1.StatusResponse{}} {
		got := jsonOf(m)
		fields := m.ProtoReflect().Descriptor().Fields()
		for i := 0; i < fields.Len(); i++ {
			fd := fields.Get(i)
			_, ok := got[string(fd.Name())]
			isTime := fd.Message() != nil && fd.Message().FullName() == timestampName
			if ok == isTime {
				t.Errorf("%s: field %s present %v", m.ProtoReflect().Descriptor().Name(), fd.Name(), ok)
			}
		}
	}
	c := &isolatordv1.Container{
		ContainerId: "c", State: isolatordv1.ContainerState_CONTAINER_STATE_ISOLATED,
		CreatedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))),
	}
	s := jsonString(t, containerResult{c})
	for _, want := range []string{`"state":"isolated"`, `"created_at":"2026-01-02T02:04:05.000000006Z"`, `"ephemeral_ports":null`, `"ports":[]`, `"labels":{}`, `"not_recovered":[]`} {
		if !strings.Contains(s, want) {
			t.Errorf("container JSON %s lacks %s", s, want)
		}
	}
	if strings.Contains(s, "isolated_at") {
		t.Errorf("unset timestamp present: %s", s)
	}
	u := jsonString(t, usageResult{&isolatordv1.UsageResponse{Traffic: &isolatordv1.TrafficStats{RxBytes: 1 << 62}}, false})
	if !strings.Contains(u, `"rx_bytes":4611686018427387904`) {
		t.Errorf("64-bit counter not a number: %s", u)
	}
	if got := enumJSON(c.State.Descriptor(), 7); got != "unknown(7)" {
		t.Errorf("unknown state: %q", got)
	}
}
