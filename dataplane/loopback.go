package dataplane

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/tcfilter"
)

// DefaultContainerPorts is the port space Config.ContainerPorts defaults
// to: every unprivileged port.
var DefaultContainerPorts = ephemeral.MustParseSet("1024-65535")

// loopbackSet is what a container may reach on 127.0.0.0/8 and ::1 (see
// tcfilter/loopback.go): the ports containers may own (host lo's demux
// steers them to their owner), the host's own ip_local_port_range
// (replies to a host client that connected to a container there) and the
// ports the operator opened.
func loopbackSet(containerPorts, hostRange, open ephemeral.Set) ephemeral.Set {
	if containerPorts.Empty() {
		containerPorts = DefaultContainerPorts
	}
	return containerPorts.Union(hostRange).Union(open)
}

// readHostPortRange reads the host namespace's ip_local_port_range.
func (d *DataPlane) readHostPortRange() (ephemeral.Set, error) {
	var v string
	err := sysctl.In(d.hostNS, func(sd *sysctl.Dir) (err error) { v, err = sd.Read("net/ipv4/ip_local_port_range"); return err })
	if err != nil {
		return ephemeral.Set{}, fmt.Errorf("host ip_local_port_range: %w", err)
	}
	f := strings.Fields(v)
	if len(f) != 2 {
		return ephemeral.Set{}, fmt.Errorf("host ip_local_port_range %q: not two ports", v)
	}
	return ephemeral.ParseSet(f[0] + "-" + f[1])
}

// setLoopPorts computes the veths' loopback port ranges from the host's
// port range and open. Call with d.mu held.
func (d *DataPlane) setLoopPorts(open ephemeral.Set) error {
	hr, err := d.readHostPortRange()
	if err != nil {
		return err
	}
	rs, err := tcfilter.LoopPortRanges(loopbackSet(d.cfg.ContainerPorts, hr, open))
	if err != nil {
		return err
	}
	d.loopPorts, d.loopOpen = rs, open
	return nil
}

// loopTag tags the loopback port ranges a veth's filters were installed
// with (its alias), so a restart with other ranges re-installs them.
func (d *DataPlane) loopTag() string {
	h := sha256.New()
	for _, r := range d.loopPorts {
		binary.Write(h, binary.BigEndian, [2]uint16{r.Begin, r.End})
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// HostLoopbackPorts are the host loopback ports open to every container.
func (d *DataPlane) HostLoopbackPorts() ephemeral.Set {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.loopOpen
}

// SetHostLoopbackPorts opens the host loopback ports open (and closes the
// others that were open) to every container: each container's veth gets
// the new loopback table (a reload of --host-loopback-ports). An error
// means nothing changed (ports the table cannot hold). A veth that cannot
// be brought in line is logged and keeps its table until the next change
// or restart (its alias keeps the old tag, so a restart re-installs it);
// the others are changed.
func (d *DataPlane) SetHostLoopbackPorts(ctx context.Context, open ephemeral.Set) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	if !d.prepared {
		d.cfg.HostLoopbackPorts = open
		d.loopOpen = open
		return nil
	}
	old := d.loopPorts
	if err := d.setLoopPorts(open); err != nil {
		return err
	}
	if slices.Equal(old, d.loopPorts) {
		return nil
	}
	for id, rec := range d.ctrs {
		if err := d.vethFilters(rec.c.Slot, rec.veth, rec.via).SetLoopPorts(); err != nil {
			d.log.Error("host loopback ports not changed on a container's veth", "container", id, "veth", plane.VethName(id), "err", err)
			continue
		}
		if err := d.setAlias(rec.veth, rec.c); err != nil {
			d.log.Warn("veth alias not updated", "container", id, "err", err)
		}
	}
	return nil
}
