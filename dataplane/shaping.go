package dataplane

// Bandwidth limits, enforced on host-side devices (the design and the
// kernel facts behind it are in tcfilter's package documentation,
// "Bandwidth limits"):
//
//   - Ingress: an HTB root qdisc on the container's host veth.
//   - Egress: a per-container shaper veth pair in the host namespace, entry
//     "isx"+h and exit "isy"+h (h: the 12 hex digits of the container's veth
//     name), both with the host MAC and MTU, IPv6 and forwarding off. The
//     entry carries the HTB; the veth's IP redirects point at it
//     (tcfilter.VethFilters.Via) and the exit's filters (tcfilter.ShaperExit)
//     send packets on to host eth0 or lo. Containers without an egress limit
//     have no pair and pay nothing.
//
// A limit is set at Setup, changed with SetLimits (in place: an HTB class
// change; switching egress on or off re-points the veth's redirect actions
// with a live connection surviving it), and brought back in line with the
// container's limits by Adopt after a restart, which changes nothing when
// the kernel already enforces them. Removing a limit first lifts the class
// so the queue drains, so that no queued packet is dropped.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/dataplane/shaping"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/netns/veth"
)

// Shaper pair name prefixes (followed by the 12 hex digits of VethName).
const (
	ShaperEntryPrefix = "isx"
	ShaperExitPrefix  = "isy"
)

// drainTimeout bounds the wait for a removed limit's queue to empty.
const drainTimeout = 500 * time.Millisecond

// ShaperNames returns the names of container id's egress shaper pair.
func ShaperNames(id string) (entry, exit string) {
	h := plane.VethName(id)[len(plane.VethPrefix):]
	return ShaperEntryPrefix + h, ShaperExitPrefix + h
}

// isShaperEntryName reports whether name has our shaper entry shape.
func isShaperEntryName(name string) bool {
	return len(name) == 15 && strings.HasPrefix(name, ShaperEntryPrefix) && isHex(name[3:])
}

// isShaperExitName reports whether name has our shaper exit shape.
func isShaperExitName(name string) bool {
	return len(name) == 15 && strings.HasPrefix(name, ShaperExitPrefix) && isHex(name[3:])
}

func isHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// leaf is the best leaf qdisc the kernel has.
func (d *DataPlane) leaf() shaping.Leaf {
	if d.info.Features[plane.FeatureFQCodel] {
		return shaping.LeafFQCodel
	}
	return shaping.LeafFIFO
}

func (d *DataPlane) shaper(link int) shaping.Shaper {
	return shaping.Shaper{H: d.h, NS: d.hostNS.Fd(), Link: link, Leaf: d.leaf()}
}

func (d *DataPlane) checkLimits(egress, ingress rate.Limit) error {
	for _, x := range []struct {
		name string
		l    rate.Limit
	}{{"egress", egress}, {"ingress", ingress}} {
		if err := x.l.Validate(); err != nil {
			return fmt.Errorf("%w: %s limit: %v", ErrInvalid, x.name, err)
		}
		if !x.l.IsZero() && d.prepared && !d.info.Features[plane.FeatureHTB] {
			return plane.ErrNoHTB
		}
	}
	return nil
}

// linkIndex returns the ifindex of a host link, 0 if there is none (or
// only a retired one, awaiting deletion).
func (d *DataPlane) linkIndex(name string) (int, error) {
	l, err := d.h.LinkByName(name)
	if err != nil {
		if veth.IsNotFound(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("look up %s: %w", name, err)
	}
	if isRetired(l.Attrs()) {
		return 0, nil
	}
	return l.Attrs().Index, nil
}

// createShaper creates container id's egress shaper pair with its exit
// filters and an HTB enforcing l on the entry, and brings it up. It returns
// the entry's ifindex; on error nothing is left. A pair left over by an
// interrupted run is replaced.
func (d *DataPlane) createShaper(id string, slot uint16, l rate.Limit) (int, error) {
	entry, exit := ShaperNames(id)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = entry
	attrs.MTU = d.vethMTU(d.info.MTU)
	attrs.HardwareAddr = d.info.MAC
	v := &netlink.Veth{LinkAttrs: attrs, PeerName: exit, PeerHardwareAddr: d.info.MAC}
	if d.info.MTU > 0 {
		v.PeerMTU = uint32(d.vethMTU(d.info.MTU))
	}
	if _, err := veth.DeleteByName(d.h, entry); err != nil {
		return 0, err
	}
	if err := d.h.LinkAdd(v); err != nil {
		return 0, fmt.Errorf("create shaper pair %s/%s: %w", entry, exit, err)
	}
	ei, err := d.linkIndex(entry)
	if err == nil && ei == 0 {
		err = fmt.Errorf("shaper %s vanished", entry)
	}
	if err != nil {
		veth.DeleteByName(d.h, entry)
		return 0, err
	}
	fail := func(err error) (int, error) {
		if _, derr := veth.Delete(d.h, ei); derr != nil {
			err = errors.Join(err, derr)
		}
		return 0, err
	}
	xi, err := d.linkIndex(exit)
	if err != nil || xi == 0 {
		return fail(fmt.Errorf("shaper exit %s: %v", exit, err))
	}
	// like the host veth: no forwarding of stray packets, no IPv6
	err = d.withHostSysctls(func(sd *sysctl.Dir) error {
		if err := hostLinkSettings(sd, ei, entry); err != nil {
			return err
		}
		return hostLinkSettings(sd, xi, exit)
	})
	if err != nil {
		return fail(fmt.Errorf("shaper settings: %w", err))
	}
	x := d.shaperExit(xi, slot)
	if err := x.Install(); err != nil {
		return fail(fmt.Errorf("shaper exit filters: %w", err))
	}
	if err := d.shaper(ei).Apply(l); err != nil {
		return fail(err)
	}
	if err := d.echoOriginShaper(id, xi); err != nil {
		return fail(err)
	}
	for _, i := range []int{xi, ei} {
		if err := veth.Up(d.h, i); err != nil {
			return fail(err)
		}
	}
	return ei, nil
}

// applyLimits brings the kernel to egress and ingress for the container of
// rec from whatever state it is in, changing only what differs: with the
// limits in force already it changes nothing. It updates rec (its limits
// and the shaper entry).
func (d *DataPlane) applyLimits(rec *record, egress, ingress rate.Limit) error {
	c := rec.c
	// ingress: HTB on the veth
	vs := d.shaper(rec.veth)
	if ingress.IsZero() && d.rootQdiscs != nil && !d.rootQdiscs[rec.veth] {
		// Recovery: no root qdisc on the veth, so no HTB to remove.
	} else if ingress.IsZero() {
		st, err := vs.Read()
		if err != nil {
			return err
		}
		if st.Root {
			if err := vs.Drain(drainTimeout); err != nil {
				d.log.Warn("ingress queue not drained before removal", "container", c.ID, "err", err)
			}
			if err := vs.Remove(); err != nil {
				return err
			}
		}
	} else if err := vs.Apply(ingress); err != nil {
		return fmt.Errorf("ingress: %w", err)
	}
	rec.c.Ingress = ingress

	// egress: the shaper pair and where the veth points
	entry, _ := ShaperNames(c.ID)
	ei, err := d.recoveryLinkOrZero(entry)
	if err != nil {
		return err
	}
	all := allRanges(c.Ephemeral, c.Ports, c.Shared)
	if egress.IsZero() {
		if ei == 0 && rec.via == 0 {
			// No pair, and none recorded: the veth cannot point at one
			// (a pair is deleted only after the veth stopped pointing at
			// it), so there is nothing to dump or change.
			rec.c.Egress = egress
			return nil
		}
		vf := d.vethFilters(c.Slot, rec.veth, 0)
		if err := vf.Retarget(all); err != nil {
			return fmt.Errorf("egress: point %s back at %s/%s: %w", plane.VethName(c.ID), d.links.Eth0, d.links.Lo, err)
		}
		rec.via = 0
		if ei != 0 {
			if err := d.shaper(ei).Drain(drainTimeout); err != nil {
				d.log.Warn("egress queue not drained before removal", "container", c.ID, "err", err)
			}
			if _, err := veth.Delete(d.h, ei); err != nil {
				return fmt.Errorf("egress: delete shaper %s: %w", entry, err)
			}
		}
		rec.c.Egress = egress
		return nil
	}
	xi := 0
	if ei != 0 {
		_, exit := ShaperNames(c.ID)
		if xi, err = d.linkIndex(exit); err != nil {
			return err
		}
		if xi == 0 {
			// The pair was deleted after the recovery cache's dump (its
			// two ends go together): it is made again.
			ei = 0
		}
	}
	created := false
	if ei == 0 {
		if ei, err = d.createShaper(c.ID, c.Slot, egress); err != nil {
			return fmt.Errorf("egress: %w", err)
		}
		created = true
	} else {
		x := d.shaperExit(xi, c.Slot)
		if err := x.Install(); err != nil {
			return fmt.Errorf("egress: shaper exit filters: %w", err)
		}
		if err := d.shaper(ei).Apply(egress); err != nil {
			return fmt.Errorf("egress: %w", err)
		}
	}
	vf := d.vethFilters(c.Slot, rec.veth, ei)
	if err := vf.Retarget(all); err != nil {
		err = fmt.Errorf("egress: point %s at the shaper: %w", plane.VethName(c.ID), err)
		if created {
			back := d.vethFilters(c.Slot, rec.veth, 0)
			err = errors.Join(err, back.Retarget(all))
			if _, derr := veth.Delete(d.h, ei); derr != nil {
				err = errors.Join(err, derr)
			}
		}
		return err
	}
	rec.via = ei
	rec.c.Egress = egress
	return nil
}

// SetLimits changes the bandwidth limits of a running container (the zero
// Limit removes one). Connections are not disturbed: a changed limit is an
// in-place class change; switching egress shaping on or off re-points the
// veth's redirect actions; a removed limit drains its queue first. On error
// the previous limits are put back.
func (d *DataPlane) SetLimits(ctx context.Context, c plane.Container, egress, ingress rate.Limit) error {
	if err := d.begin(ctx, c.ID, dropCache); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if err := d.checkLimits(egress, ingress); err != nil {
		return err
	}
	rec, ok := d.ctrs[c.ID]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknown, c.ID)
	}
	old := rec.c
	if err := d.applyLimits(rec, egress, ingress); err != nil {
		err = fmt.Errorf("container %s: %w: %w", c.ID, plane.ErrShaping, err)
		if rerr := d.applyLimits(rec, old.Egress, old.Ingress); rerr != nil {
			d.log.Error("rollback of failed limit change incomplete", "container", c.ID, "err", rerr)
			err = errors.Join(err, rerr)
		}
		return err
	}
	return nil
}

// shapeCounters reads one direction's shaping.
func (d *DataPlane) shapeCounters(link int, l rate.Limit) (plane.ShapeCounters, error) {
	sc := plane.ShapeCounters{Limit: l}
	if link == 0 {
		return sc, nil
	}
	st, err := d.shaper(link).Read()
	if err != nil {
		return sc, err
	}
	sc.Enforced = st.Present
	sc.Queue = st.Leaf
	sc.Bytes, sc.Packets, sc.Drops, sc.Overlimits = st.Bytes, st.Packets, st.Drops, st.Overlimits
	sc.Backlog, sc.QueueLen = st.Backlog, st.QueueLen
	return sc, nil
}
