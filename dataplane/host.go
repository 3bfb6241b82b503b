package dataplane

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/isolatord/isolatord/dataplane/shaping"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/containerns"
	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/vishvananda/netlink"
)

// hostSysctls are the host-namespace settings the traffic paths need. Each
// was checked against this kernel by removing it (see TestHostSettingsNeeded):
//
//   - lo route_localnet=1: packets to and from 127.0.0.1 are redirected from
//     a container's veth to the host's lo (container -> host process or other
//     container via 127.0.0.1); without it the host drops them as martians.
//   - lo accept_local=1: packets redirected from a veth to the host's lo carry
//     the shared host IP as source; without it they are dropped as
//     IP_LOCAL_SOURCE (container -> host process via the host IP).
var hostSysctls = []sysctl.Setting{
	{Name: "net/ipv4/conf/lo/route_localnet", Value: "1"},
	{Name: "net/ipv4/conf/lo/accept_local", Value: "1"},
}

// Reverse-path filtering is deliberately left alone on the host: with
// rp_filter 1 (strict) or 2 (loose) on all, lo, eth0 and default, every path
// still works on this kernel (TestHostPreparation checks it), because
// packets redirected to the host's lo come from a local address whose
// reverse route is lo itself. Mesos forced it to 0; we do not need to.

// Keys of HostInfo.Originals that are not sysctls.
const (
	OriginalLoMAC = "link/lo/address"
)

// PrepareHost prepares the host namespace once (later calls return the same
// HostInfo): it reads the public interface's address, MAC, MTU and gateway,
// applies the host settings the paths need (recording each original value in
// HostInfo.Originals; settings already right are not recorded), makes the
// netns directory a shared mount point, creates clsact on eth0 and lo,
// initialises the host demuxes, reads the host sysctls containers copy and
// detects kernel features. A restarted daemon's PrepareHost finds the host
// already prepared and records nothing: the lifecycle keeps the Originals of
// the first run.
func (d *DataPlane) PrepareHost(ctx context.Context) (plane.HostInfo, error) {
	if err := checkCtx(ctx); err != nil {
		return plane.HostInfo{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return plane.HostInfo{}, ErrClosed
	}
	if d.prepared {
		return d.info, nil
	}
	// The feature probe (a scratch namespace of its own) runs while the
	// host is prepared.
	type probed struct {
		feats  map[string]bool
		source string
	}
	probe := make(chan probed, 1)
	go func() {
		f, src := detectFeatures()
		probe <- probed{f, src}
	}()
	hl, err := hostlink.Read(d.h, d.cfg.Eth0, d.cfg.Lo)
	if err != nil {
		return plane.HostInfo{}, fmt.Errorf("host interfaces: %w", err)
	}
	info := plane.HostInfo{
		Eth0: hl.Eth0, Lo: hl.Lo, IP: hl.Addr, MAC: hl.MAC, MTU: hl.MTU, Gateway: hl.Gateway,
		Originals: map[string]string{}, NetNSIno: d.hostNS.Ino(),
	}
	v6, err := d.decideIPv6(hl)
	if err != nil {
		return plane.HostInfo{}, err
	}
	d.ip6 = nil
	if v6 != nil {
		d.ip6 = d.shareIPv6(v6)
		info.IPv6, info.Gateway6 = v6.Global, v6.Gateway()
	}

	// Host lo carries the host MAC: frames redirected from the host's lo to a
	// veth keep lo's MAC as destination, and the container only accepts them
	// as PACKET_HOST if that is its own (the host's) MAC.
	lo, err := d.h.LinkByIndex(hl.LoIndex)
	if err != nil {
		return plane.HostInfo{}, err
	}
	if !macEqual(hl.LoMAC, hl.MAC) {
		if err := d.h.LinkSetHardwareAddr(lo, hl.MAC); err != nil {
			return plane.HostInfo{}, fmt.Errorf("set %s MAC to %s's %s: %w", hl.Lo, hl.Eth0, hl.MAC, err)
		}
		orig := hl.LoMAC.String()
		if orig == "" { // netlink drops an all-zero address
			orig = "00:00:00:00:00:00"
		}
		info.Originals[OriginalLoMAC] = orig
	}
	wanted := renameLo(hostSysctls, hl.Lo)
	var changed []sysctl.Setting
	err = sysctl.In(d.hostNS, func(sd *sysctl.Dir) (err error) { changed, err = sd.SetSaving(wanted...); return err })
	for _, kv := range changed {
		info.Originals["sysctl/"+kv.Name] = kv.Value
	}
	if err != nil {
		return info, fmt.Errorf("host sysctls: %w", err)
	}
	if err := d.setLoopPorts(d.cfg.HostLoopbackPorts); err != nil {
		return info, err
	}

	// The netns directory is a shared mount point (as iproute2 makes it), so
	// the namespace pins created under it propagate to mount namespaces
	// cloned from ours (`ip netns exec` makes one) and their removal does too.
	if err := nspin.EnsureSharedDir(d.cfg.NetNSDir); err != nil {
		return info, err
	}

	// eth0 and lo get their clsact qdiscs from their demuxes' Init.
	// The drop sink: before any veth filter points at it.
	sink, bpfErr, err := tcfilter.EnsureSink(d.h, tcfilter.SinkName)
	if err != nil {
		return info, err
	}
	// The sink is a host link like a veth's host end: no IPv6 (it would
	// get a link-local address and solicit routers into its own drop
	// program), no forwarding.
	if err := d.withHostSysctls(func(sd *sysctl.Dir) error {
		return hostLinkSettings(sd, sink.Index, tcfilter.SinkName)
	}); err != nil {
		return info, fmt.Errorf("drop sink %s settings: %w", tcfilter.SinkName, err)
	}
	// The per-reason sinks every veth's drop nodes redirect to (through
	// one action per reason), counting per container; their sysctls as
	// the sink's, set before they come up.
	drops, countErr, err := tcfilter.EnsureDropSinks(d.h, d.hostNS.Do, func(idx int, name string) error {
		return d.withHostSysctls(func(sd *sysctl.Dir) error { return hostLinkSettings(sd, idx, name) })
	})
	if err != nil {
		return info, err
	}
	if bpfErr != nil {
		d.log.Warn("cls_bpf programs unavailable: containers' dropped frames go to sinks kept down (the kernel logs rate-limited \"device is down\" notices), are not counted per container (usage shows no dropped packets), and VLAN-tagged frames are not checked",
			"sink", tcfilter.SinkName, "err", bpfErr)
	} else if countErr != nil {
		d.log.Warn("the drop-counting program is not loaded: containers' dropped frames go to sinks kept down and are not counted per container (usage shows no dropped packets)",
			"err", countErr)
	}
	// The recovery cache's dumps (links and qdiscs, read by the sweep of
	// retired links and then by recovery) on a socket of their own while
	// the demuxes read their filters on d.h: with 1,000 containers each
	// dump takes tens of ms. The demuxes add no link and no root qdisc
	// (clsact is no root qdisc), so the dumps see what recovery will.
	type dumped struct {
		ls  []netlink.Link
		qs  []netlink.Qdisc
		err error
	}
	dumps := make(chan dumped, 1)
	go func() {
		h, err := d.hostNS.Netlink()
		if err != nil {
			dumps <- dumped{err: err}
			return
		}
		defer h.Close()
		ls, qs, err := dumpLinksQdiscs(h)
		dumps <- dumped{ls, qs, err}
	}()
	eth0 := tcfilter.NewHostDemux(d.h, hl.Eth0Index, hl.Eth0, hl.Addr.IP, d.cfg.Observer)
	eth0.SetConn(d.hc)
	if err := eth0.SetDropSinks(drops); err != nil { // echo drops counted
		return info, fmt.Errorf("%s demux: %w", hl.Eth0, err)
	}
	if err := eth0.SetIPv6(d.demux6(sink.Index)); err != nil {
		return info, fmt.Errorf("%s demux: %w", hl.Eth0, err)
	}
	if err := eth0.Init(); err != nil {
		return info, fmt.Errorf("%s demux: %w", hl.Eth0, err)
	}
	lod := tcfilter.NewHostDemux(d.h, hl.LoIndex, hl.Lo, nil, d.cfg.Observer)
	lod.SetConn(d.hc)
	if err := lod.SetIPv6(d.demux6(0)); err != nil {
		return info, fmt.Errorf("%s demux: %w", hl.Lo, err)
	}
	if err := lod.Init(); err != nil {
		return info, fmt.Errorf("%s demux: %w", hl.Lo, err)
	}

	if err := d.startNeigh(hl.Eth0Index, hl.Addr, hl.Gateway); err != nil {
		return info, err
	}
	if v6 != nil {
		if err := d.neigh.EnableIPv6(v6.Global, v6.LinkLocal.IP, v6.Gateway()); err != nil {
			return info, err
		}
	}
	d.startFragments(hl.Eth0Index, hl.LoIndex)
	d.startWireGuard(hl.Eth0Index, drops)
	if err := eth0.EchoSteering(); err != nil {
		d.log.Warn("echo replies to the host IP are not steered by learning (cls_bpf on eth0); replies no container's ports attribute are mirrored to every container", "err", err)
	}

	cp, err := d.sysctlsToCopy()
	if err != nil {
		return info, err
	}

	pr := <-probe
	feats, source := pr.feats, pr.source
	info.Features = feats
	info.Features[plane.FeatureClsBPF] = sink.BPF
	if missing := missingFeatures(feats); len(missing) > 0 {
		d.log.Warn("kernel features missing; the data plane works without them (bandwidth limits need htb; fq_codel is their preferred queue)",
			"missing", strings.Join(missing, ","), "source", source)
	}
	// Bandwidth limits: HTB with the best leaf the kernel has, and eth0's
	// speed as the upper bound of a limit (when the driver knows it).
	switch {
	case !feats[plane.FeatureHTB]:
		d.log.Warn("bandwidth limits unavailable: the kernel has no HTB qdisc; containers asking for one are refused")
	case feats[plane.FeatureFQCodel]:
		info.ShapingQueue = shaping.LeafFQCodel.String()
	default:
		info.ShapingQueue = shaping.LeafFIFO.String()
	}
	err = d.hostNS.Do(func() (err error) {
		info.LinkSpeed, err = linkSpeedHere(hl.Eth0)
		return err
	})
	if err != nil {
		d.log.Warn("could not read the link speed of the host interface; bandwidth limits are not checked against it", "eth0", hl.Eth0, "err", err)
	}
	if info.ShapingQueue != "" {
		d.log.Info("bandwidth limits: HTB on the host side", "queue", info.ShapingQueue,
			"eth0_speed_mbit", info.LinkSpeed, "speed_known", info.LinkSpeed > 0)
	}

	d.info, d.links, d.copy, d.eth0, d.lo, d.sink, d.v6 = info, hl, cp, eth0, lod, sink, v6
	d.drops = drops
	d.hostNow = d.factsNow()
	d.prepared = true
	d.syncSaddr6()
	if d.saddr6.set { // (info shares the map)
		info.Originals["sysctl/"+saddr6Knob(hl.Eth0)] = d.saddr6.original
	}
	// (without the dumps, recovery makes them itself)
	if dm := <-dumps; dm.err == nil {
		d.setRecoveryCache(dm.ls, dm.qs)
		d.pruneDrops(dm.ls)
	}
	d.retired = newRetirer(d)
	if err := d.sweepRetired(); err != nil {
		d.log.Warn("links retired by an earlier run not deleted", "err", err)
	}
	d.startReconciler()
	d.startFollower()
	d.log.Info("host prepared", "eth0", hl.Eth0, "ip", hl.Addr.String(), "mac", hl.MAC.String(),
		"mtu", hl.MTU, "gateway", hl.Gateway, "changed", len(info.Originals), "originals", info.Originals)
	return info, nil
}

// renameLo rewrites "/lo/" in sysctl names to the host's loopback name.
func renameLo(kvs []sysctl.Setting, lo string) []sysctl.Setting {
	out := make([]sysctl.Setting, len(kvs))
	for i, kv := range kvs {
		out[i] = sysctl.Setting{Name: strings.Replace(kv.Name, "/lo/", "/"+lo+"/", 1), Value: kv.Value}
	}
	return out
}

func macEqual(a, b net.HardwareAddr) bool { return a.String() == b.String() }

// readExisting reads those of the named sysctls that exist in ns.
func readExisting(ns *nshandle.NS, names []string) (out []sysctl.Setting, err error) {
	err = sysctl.In(ns, func(sd *sysctl.Dir) error { out, err = sd.ReadExisting(names...); return err })
	return out, err
}

// sysctlsToCopy reads the host values of containerns.HostSysctlsToCopy and
// keeps those a new namespace does not already start with (checked on a scratch
// namespace): writing a value that is already there costs a /proc/sys
// lookup per container for nothing.
func (d *DataPlane) sysctlsToCopy() ([]sysctl.Setting, error) {
	host, err := readExisting(d.hostNS, containerns.HostSysctlsToCopy)
	if err != nil {
		return nil, fmt.Errorf("read host sysctls to copy: %w", err)
	}
	scratch, err := nshandle.New()
	if err != nil {
		return host, nil // cannot compare: copy them all
	}
	defer scratch.Close()
	fresh, err := readExisting(scratch, containerns.HostSysctlsToCopy)
	if err != nil {
		return host, nil
	}
	def := map[string]string{}
	for _, kv := range fresh {
		def[kv.Name] = strings.Join(strings.Fields(kv.Value), " ")
	}
	var out []sysctl.Setting
	for _, kv := range host {
		if v, ok := def[kv.Name]; !ok || v != strings.Join(strings.Fields(kv.Value), " ") {
			out = append(out, kv)
		}
	}
	return out, nil
}
