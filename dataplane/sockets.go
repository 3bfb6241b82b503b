package dataplane

import (
	"context"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nsstats"
)

// Socket statistics of the lifecycle's vocabulary (package plane).
type (
	SocketStats    = plane.SocketStats
	RTTPercentiles = plane.RTTPercentiles
)

// SocketStats reads socket and SNMP figures inside c's network namespace
// (through c.NetNS, the pin once there is one: safe against pid reuse)
// without forking. It takes no lock of the data plane: it reads nothing
// but the container's namespace.
func (d *DataPlane) SocketStats(ctx context.Context, c Container) (SocketStats, error) {
	ns, err := nsstats.Collect(c.NetNS)
	if err != nil {
		return SocketStats{}, err
	}
	out := SocketStats{TCPConnections: ns.Connections(), TCPTimeWait: ns.TCPTimeWait, SNMP: ns.SNMP}
	if x := ns.RTT; x != nil {
		out.RTT = &RTTPercentiles{P50: x.P50, P90: x.P90, P95: x.P95, P99: x.P99, Samples: x.Samples}
	}
	return out, nil
}
