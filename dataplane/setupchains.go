package dataplane

// Setup's two chains. Once the veth pair exists, what Setup does on the
// host side of it and what it does inside the container touch different
// objects through different netlink sockets:
//
//   - the host chain: the host veth's settings (sysctls of the host
//     namespace), the bandwidth limits, the veth's filters, and the host
//     veth up, last (through the data plane's host handles);
//   - the container chain: netlink handles opened inside the container's
//     namespace, its configuration, its filters (through those handles, on
//     threads that enter the namespace with nshandle.Do), and its
//     neighbours, which wait for the end of the host chain (eth0 must have
//     its carrier when they are given, see containerChain).
//
// They run concurrently: the host chain on a goroutine of its own, the
// container chain (the longer) on Setup's. Neither uses a netlink handle
// bound to the other's namespace, and neither moves the calling thread
// (every namespace switch is nshandle.Do's locked thread). Setup joins both before it adds
// the container to the shared host tables (plumbHost), so no traffic is
// steered to the container before both chains are complete. Until the host
// veth comes up, after its filters, the container's eth0 has no carrier:
// whatever the container chain has done by then, nothing the container
// sends leaves it unfiltered.
//
// Each chain keeps its own undo stack. When one fails, the other stops at
// its next step (errAborted) and, once both are joined, their undos go on
// top of Setup's own (container chain, then host chain, then the veth and
// the mount), so the rollback undoes everything in reverse, on one
// goroutine, after both are done.

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/containerns"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/netns/veth"
)

// errAborted ends a chain whose peer failed; Setup reports the peer's
// error, not this one.
var errAborted = errors.New("setup aborted: the other chain failed")

// chain is one of Setup's two concurrent sequences of steps.
type chain struct {
	d      *DataPlane
	name   string // "host" or "container": how trace tells them apart
	undo   undoStack
	failed *atomic.Bool // set by the first chain that fails
	// closers release what the chain opened (the container's handles),
	// after the rollback used them.
	closers []func()
}

// step ends a step of the chain (trace, test hook) and stops the chain if
// the other one failed.
func (c *chain) step(name string) error {
	if err := c.d.stepIn(c.name, name); err != nil {
		return err
	}
	if c.failed.Load() {
		return errAborted
	}
	return nil
}

// end records the chain's outcome: a failure of its own stops the other.
func (c *chain) end(err error) error {
	if err != nil && !errors.Is(err, errAborted) {
		c.failed.Store(true)
	}
	return err
}

// setupChains runs the host chain and the container chain of container c,
// whose host veth is vethIdx (named name) and whose namespace is ns, and
// joins them. It returns the egress shaper's entry ifindex (0: none). Their
// undos are pushed onto undo and the container's handles appended to
// closers, whatever the outcome.
func (d *DataPlane) setupChains(c plane.Container, ns *nshandle.NS, name string, vethIdx int, undo *undoStack, closers *[]func()) (via int, err error) {
	var failed atomic.Bool
	host := &chain{d: d, name: "host", failed: &failed}
	ctr := &chain{d: d, name: "container", failed: &failed}
	all := allRanges(c.Ephemeral, c.Ports, c.Shared)
	var herr, cerr error
	done := make(chan struct{}) // closed when the host chain has ended
	runHost := func() {
		defer close(done)
		via, herr = d.hostChain(host, c, name, vethIdx, all)
		herr = host.end(herr)
	}
	if d.serialSetup {
		runHost()
	} else {
		// The host chain is the shorter: the goroutine that runs it is
		// usually done at the join, so Setup's does not wait to be woken.
		go runHost()
	}
	cerr = ctr.end(d.containerChain(ctr, c, ns, all, done))
	<-done
	undo.steps = append(undo.steps, host.undo.steps...)
	undo.steps = append(undo.steps, ctr.undo.steps...)
	*closers = append(*closers, ctr.closers...)
	switch {
	case herr == nil && cerr == nil:
		return via, nil
	case herr == nil || errors.Is(herr, errAborted):
		return 0, cerr
	case cerr == nil || errors.Is(cerr, errAborted):
		return 0, herr
	}
	return 0, errors.Join(herr, cerr)
}

// hostChain sets up the host end of c's veth: no routing of stray packets
// (forwarding=0) and no IPv6 (the shared MAC would give every veth the
// same link-local address), the bandwidth limits, the veth's filters, and
// only then the veth up.
func (d *DataPlane) hostChain(ch *chain, c plane.Container, name string, vethIdx int, all []ephemeral.Range) (via int, err error) {
	if ch.failed.Load() {
		return 0, errAborted
	}
	err = d.withHostSysctls(func(sd *sysctl.Dir) error { return hostLinkSettings(sd, vethIdx, name) })
	if err != nil {
		return 0, fmt.Errorf("container %s: host veth settings: %w", c.ID, err)
	}
	if err := ch.step("host veth sysctls"); err != nil {
		return 0, err
	}
	// Bandwidth limits: the egress shaper pair before the veth filters that
	// point at it; ingress HTB on the veth (it goes with the veth).
	if !c.Egress.IsZero() {
		// Under d.mu: it registers the shaper's exit as an echo origin in
		// the eth0 demux, a shared table.
		d.mu.Lock()
		via, err = d.createShaper(c.ID, c.Slot, c.Egress)
		d.mu.Unlock()
		if err != nil {
			return 0, fmt.Errorf("container %s: egress limit: %w", c.ID, err)
		}
		shaper := via
		ch.undo.push("egress shaper", func() error { _, err := veth.Delete(d.h, shaper); return err })
	}
	if !c.Ingress.IsZero() {
		if err := d.shaper(vethIdx).Apply(c.Ingress); err != nil {
			return 0, fmt.Errorf("container %s: ingress limit on %s: %w", c.ID, name, err)
		}
	}
	if err := ch.step("limits"); err != nil {
		return 0, err
	}
	vf := d.vethFilters(c.Slot, vethIdx, via)
	vf.New = true
	// A new veth counts from zero, whatever a gone device of its ifindex
	// left in the count map.
	if err := d.drops.Reset(vethIdx); err != nil {
		return 0, fmt.Errorf("container %s: %w", c.ID, err)
	}
	if err := vf.Install(all); err != nil {
		return 0, fmt.Errorf("container %s: filters on %s: %w", c.ID, name, err)
	}
	d.fragLearn(c.ID, vethIdx)
	if err := ch.step("veth filters"); err != nil {
		return 0, err
	}
	if err := veth.Up(d.h, vethIdx); err != nil {
		return 0, fmt.Errorf("container %s: %w", c.ID, err)
	}
	if err := ch.step("host veth"); err != nil {
		return 0, err
	}
	return via, nil
}

// containerChain sets up the inside of c's namespace ns: its
// configuration, its filters and, once the host chain has ended (hostDone
// closed), its neighbours.
func (d *DataPlane) containerChain(ch *chain, c plane.Container, ns *nshandle.NS, all []ephemeral.Range, hostDone <-chan struct{}) error {
	if ch.failed.Load() {
		return errAborted
	}
	nh, tc, err := openHandles(ns)
	if err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	ch.closers = append(ch.closers, nh.Close, func() { tc.Close() })
	if err := ch.step("container handle"); err != nil {
		return err
	}
	cl, err := containerns.Configure(ns, nh, containerns.Config{
		Eth0: ContainerEth0, Addr: d.info.IP, MAC: d.info.MAC, MTU: d.info.MTU, LoMTU: d.loMTU(),
		Gateway: d.info.Gateway, Ports: c.Ephemeral, Copy: d.copy, IPv6: d.v6,
	})
	if err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	// The container's lo keeps its filters when the veth goes: remove them
	// on rollback so a retry starts clean.
	ch.undo.push("container lo filters", func() error { return delIngress(nh, cl.Lo) })
	if err := ch.step("container config"); err != nil {
		return err
	}
	cf := d.containerFilters(nh, cl.Lo, cl.Eth0)
	cf.C = tc
	if err := cf.Install(all); err != nil {
		return fmt.Errorf("container %s: container filters: %w", c.ID, err)
	}
	if err := ch.step("container"); err != nil {
		return err
	}
	// The neighbours only once the host veth is up and eth0 has its
	// carrier: on an eth0 without it, the kernel's handling of the carrier
	// event of the pair's creation, which comes later (linkwatch), would
	// flush the entries given now.
	<-hostDone
	if ch.failed.Load() {
		return errAborted
	}
	if err := d.addNeigh(c.ID, ns); err != nil {
		return err
	}
	ch.undo.push("neighbour sync", func() error { d.dropNeigh(c.ID); return nil })
	return ch.step("neighbours")
}

// delIngress removes the ingress qdisc Setup adds, and with it every
// filter, of a link.
func delIngress(h *netlink.Handle, idx int) error {
	attrs := netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}
	err := h.QdiscDel(&netlink.Ingress{QdiscAttrs: attrs})
	if err != nil && !veth.IsNotFound(err) {
		return fmt.Errorf("delete ingress qdisc of link %d: %w", idx, err)
	}
	return nil
}
