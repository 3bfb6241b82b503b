package dataplane

import (
	"context"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nsstats"
)

// SocketStats reads socket and SNMP figures inside c's network namespace
// (through c.NetNS, the pin once there is one: safe against pid reuse)
// without forking. It takes no lock of the data plane: it reads nothing
// but the container's namespace.
func (d *DataPlane) SocketStats(ctx context.Context, c plane.Container) (plane.SocketStats, error) {
	ns, err := nsstats.Collect(c.NetNS)
	if err != nil {
		return plane.SocketStats{}, err
	}
	out := plane.SocketStats{TCPConnections: ns.Connections(), TCPTimeWait: ns.TCPTimeWait, SNMP: ns.SNMP}
	if x := ns.RTT; x != nil {
		out.RTT = &plane.RTTPercentiles{P50: x.P50, P90: x.P90, P95: x.P95, P99: x.P99, Samples: x.Samples}
	}
	return out, nil
}
