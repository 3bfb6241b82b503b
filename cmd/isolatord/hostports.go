package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/netns/hostports"
)

// reservedPortsFile (in --state-dir) records the ports isolatord added to
// the host's net.ipv4.ip_local_reserved_ports.
const reservedPortsFile = "host-reserved-ports"

// openHostPorts opens the host port reservations of the host namespace.
func openHostPorts(hostNetNS string) (*hostports.Ports, error) {
	hp, err := hostports.New(hostNetNS)
	if err != nil {
		return nil, fmt.Errorf("host port reservations: %w", err)
	}
	return hp, nil
}

// reservePool puts the ephemeral pool into the host's
// ip_local_reserved_ports, logging the original value when it changes.
func reservePool(hp *hostports.Ports, pool ephemeral.Set, stateDir string, log *slog.Logger) error {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	res, err := hp.ReservePool(pool, filepath.Join(stateDir, reservedPortsFile))
	if err != nil {
		return err
	}
	if res.Changed() {
		log.Info("host setting changed: the ephemeral pool is in net.ipv4.ip_local_reserved_ports (host processes get none of its ports from the kernel; an explicit bind into it is the operator's business)",
			"original", res.Original, "value", res.Value, "removed_old_pool_ports", res.Removed.String())
	}
	return nil
}

func hostPortsToProto(h isolator.HostPortsStatus) *pb.HostPortReservations {
	out := &pb.HostPortReservations{Enabled: h.Enabled, Reserved: uint32(h.Reserved)}
	for _, c := range h.Conflicts {
		out.Conflicts = append(out.Conflicts, &pb.HostPortConflict{Port: uint32(c.Port), Holder: c.Holder})
	}
	return out
}
