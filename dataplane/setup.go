package dataplane

// Setting a container up: Setup, the host side of its plumbing, the
// rollback of a failed setup and the claim on its id while it runs.

import (
	"context"
	"errors"
	"fmt"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/netns/veth"
	"golang.org/x/sys/unix"
)

// Setup plumbs container c (see the package design notes for the order). Any
// failure undoes every step already done for c.
func (d *DataPlane) Setup(ctx context.Context, c plane.Container) (p plane.Plumbing, err error) {
	if err := validateContainer(c); err != nil {
		return p, err
	}
	if err := checkCtx(ctx); err != nil {
		return p, err
	}
	// The host's facts stay as they are until the setup ends (follow.go).
	d.fmu.RLock()
	defer d.fmu.RUnlock()
	if err := d.claim(c); err != nil {
		return p, err
	}
	defer d.unclaim(c.ID)
	release, err := d.admit(ctx)
	if err != nil {
		return p, err
	}
	defer release()
	// The container's own objects are made without d.mu, so that setups
	// of different containers overlap; only the handles must stay open.
	d.hmu.RLock()
	defer d.hmu.RUnlock()
	if d.hclosed {
		return p, ErrClosed
	}

	// Handles are closed only after a rollback has used them: an operation
	// on a closed netlink.Handle silently falls back to a fresh socket in
	// the calling thread's namespace, which is the wrong namespace.
	var undo undoStack
	var closers []func()
	defer func() {
		if err != nil {
			d.rollback(c.ID, &undo, &err)
			p = plane.Plumbing{}
		}
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()

	ns, err := nshandle.Open(c.NetNS)
	if err != nil {
		return p, fmt.Errorf("container %s: %w", c.ID, err)
	}
	closers = append(closers, func() { ns.Close() })
	if err := d.refusedNamespace(ns); err != nil {
		return p, fmt.Errorf("container %s: %s: %w", c.ID, c.NetNS, err)
	}
	p.NetNSIno = ns.Ino()
	if err := d.step("open"); err != nil {
		return p, err
	}

	// Pin the namespace so `ip netns exec <id>` works and it outlives its
	// processes until Teardown; a runtime's pin already there is used and
	// never removed (nspin.Create).
	pin, err := nspin.Create(ns, d.cfg.NetNSDir, c.ID)
	if err != nil {
		return p, fmt.Errorf("container %s: %w", c.ID, err)
	}
	p.Mount, p.PinOwned = pin.Path, pin.Owned
	c.Meta.PinOwned = pin.Owned // the veth's alias says whose the pin is
	undo.push("bind mount", func() error {
		_, _, err := nspin.Remove(pin)
		return err
	})
	if err := d.step("mount"); err != nil {
		return p, err
	}

	// The veth: host end named after the ID, peer born inside as eth0, both
	// with the host MAC and MTU.
	p.Veth = plane.VethName(c.ID)
	spec := veth.Spec{Name: p.Veth, PeerName: ContainerEth0, MAC: d.info.MAC, MTU: d.vethMTU(d.info.MTU)}
	// A pair Stage made for a runtime that moved its peer in is adopted
	// (staged.go).
	var staged bool
	p.VethIndex, staged, err = d.adoptStaged(c.ID, ns)
	if !staged {
		p.VethIndex, err = veth.Create(d.h, ns, spec)
	}
	if !staged && errors.Is(err, unix.EEXIST) {
		// A retired pair of this namespace still holds eth0 (retire.go).
		d.retired.wait()
		p.VethIndex, err = veth.Create(d.h, ns, spec)
	}
	if err != nil {
		return p, fmt.Errorf("container %s: %w", c.ID, err)
	}
	vethIdx := p.VethIndex
	undo.push("veth "+p.Veth, func() error { _, err := veth.Delete(d.h, vethIdx); return err })
	if err := d.setAlias(vethIdx, c); err != nil {
		return p, err
	}
	if err := d.step("veth"); err != nil {
		return p, err
	}

	// The host side and the inside of the container, concurrently
	// (setupchains.go).
	via, err := d.setupChains(c, ns, p.Veth, vethIdx, &undo, &closers)
	if err != nil {
		return p, err
	}
	if err := d.step("chains"); err != nil {
		return p, err
	}

	// The shared host tables, under d.mu.
	if err := d.plumbHost(c, vethIdx, via, p); err != nil {
		return p, err
	}
	return p, nil
}

// plumbHost adds c's entries to the shared host tables (demuxes, fan-out,
// shared ports) and records c, under d.mu; on failure it removes what it
// added.
func (d *DataPlane) plumbHost(c plane.Container, veth, via int, p plane.Plumbing) (err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.ready(); err != nil {
		return err
	}
	var undo undoStack
	defer d.rollback(c.ID, &undo, &err)
	// Host demuxes: only now does traffic start flowing to the veth.
	excl := exclusiveRanges(c.Ephemeral, c.Ports)
	if err := d.eth0.AddRanges(c.Slot, veth, excl); err != nil {
		return fmt.Errorf("container %s: %s demux: %w", c.ID, d.links.Eth0, err)
	}
	undo.push("eth0 demux", func() error { _, err := d.eth0.DelRanges(c.Slot, excl); return err })
	if err := d.lo.AddRanges(c.Slot, veth, excl); err != nil {
		return fmt.Errorf("container %s: %s demux: %w", c.ID, d.links.Lo, err)
	}
	undo.push("lo demux", func() error { _, err := d.lo.DelRanges(c.Slot, excl); return err })
	if err := d.step("demux"); err != nil {
		return err
	}
	if err := d.eth0.SetEchoOrigin(veth, veth); err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	undo.push("echo origin", func() error { return d.eth0.DelEchoOrigin(veth) })
	if d.fanoutUsed() {
		if err := d.eth0.AddFanout(c.Slot, veth); err != nil {
			return fmt.Errorf("container %s: ICMP fan-out: %w", c.ID, err)
		}
		undo.push("fan-out", func() error { _, err := d.eth0.DelFanout(c.Slot); return err })
	}
	if err := d.step("fanout"); err != nil {
		return err
	}
	for _, port := range c.Shared.Ports() {
		old := d.shared[port]
		if err := d.setShared(port, holdersWith(old, c.Slot, veth)); err != nil {
			return fmt.Errorf("container %s: %w", c.ID, err)
		}
		undo.push(fmt.Sprintf("shared port %d", port), func() error { return d.setShared(port, old) })
	}
	if err := d.step("shared"); err != nil {
		return err
	}

	pin := nspin.Pin{Path: p.Mount, Owned: p.PinOwned}
	c.Pin, c.PinOwned = pin.Path, pin.Owned
	d.ctrs[c.ID] = &record{c: c, veth: veth, via: via, ino: p.NetNSIno, pin: pin, in: d.setupFacts()}
	if d.ctrs[c.ID].in != d.hostNow {
		d.pokeFollower()
	}
	d.slots[c.Slot] = c.ID
	d.noteVeth(c.ID, veth)
	return nil
}

// rollback undoes the steps of a failed setup (*err != nil), adding the
// undo errors to *err.
func (d *DataPlane) rollback(id string, undo *undoStack, err *error) {
	if *err == nil {
		return
	}
	if uerr := undo.run(); uerr != nil {
		d.log.Error("rollback of failed setup incomplete", "container", id, "err", uerr)
		*err = errors.Join(*err, uerr)
	}
}
