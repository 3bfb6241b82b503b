package dataplane

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/containerns"
	"github.com/isolatord/isolatord/netns/hostlink"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/tcfilter"
)

// hostFacts are the facts of the host that containers' kernel objects
// copy, in a comparable form: a record's in says which ones its objects
// were made or last brought in line with.
type hostFacts struct {
	ip, gw, mac string
	mtu, eth0   int
	v6          string // the IPv6 addresses, link-local address and routes containers carry
	ip6tag      string // the IPv6 addresses the filters match (ip6Tag)
}

// factsNow are the data plane's host facts now (d.mu or d.fmu held).
func (d *DataPlane) factsNow() hostFacts {
	f := hostFacts{mac: d.info.MAC.String(), mtu: d.info.MTU, eth0: d.links.Eth0Index, ip6tag: d.ip6Tag()}
	if !d.lost4 {
		f.ip = d.info.IP.String()
	}
	if d.info.Gateway != nil {
		f.gw = d.info.Gateway.String()
	}
	if d.v6 != nil {
		h := sha256.New()
		for _, n := range d.v6.Global {
			h.Write([]byte(n.String() + ","))
		}
		h.Write([]byte(d.v6.LinkLocal.String() + ";"))
		for _, r := range d.v6.Routes {
			fmt.Fprintf(h, "%v %v %d;", r.Dst, r.Gw, r.Priority)
		}
		f.v6 = hex.EncodeToString(h.Sum(nil)[:8])
	}
	return f
}

// v4Tag names the host facts of d.hostNow but IPv6's (the veth's alias
// carries it: a restart brings a container whose tag differs in line).
func (d *DataPlane) v4Tag() string {
	f := d.hostNow
	h := sha256.New()
	fmt.Fprintf(h, "%s;%s;%s;%d;%d", f.ip, f.gw, f.mac, f.mtu, f.eth0)
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// setupFacts are the facts a container set up now is made with: the
// IPv4 address it gets is the last one the host had, even when it has
// none now (the follower then takes it away again).
func (d *DataPlane) setupFacts() hostFacts {
	f := d.hostNow
	f.ip = d.info.IP.String()
	return f
}

// publicInfo is d.info as the lifecycle reports it: no IPv4 address when
// the host has none (d.info keeps the last one for the filters).
func (d *DataPlane) publicInfo() plane.HostInfo {
	info := d.info
	if d.lost4 {
		info.IP = net.IPNet{}
	}
	return info
}

// followPass reads the host's facts again, applies what changed to the
// host's tables and brings every container that is not in line with
// them in line. It reports whether all are.
func (d *DataPlane) followPass() bool {
	changed, info, notify, err := d.followHost()
	if err != nil {
		d.log.Warn("host follower: host change not applied; trying again", "err", err)
		return false
	}
	if changed {
		d.log.Info("host follower: the host changed", "eth0", info.Eth0, "ip", info.IP.String(), "mac", info.MAC.String(),
			"mtu", info.MTU, "gateway", info.Gateway, "ipv6", ipNets(info.IPv6), "gateway6", info.Gateway6)
		if notify != nil {
			notify(info)
		}
	}
	d.mu.Lock()
	d.followStats.Passes++
	var ids []string
	for id, r := range d.ctrs {
		if r.in != d.hostNow {
			ids = append(ids, id)
		}
	}
	busy := len(d.settingUp) > 0
	d.mu.Unlock()
	sort.Strings(ids)
	ok := d.followContainers(ids)
	// A setup that began before the change ends with the old facts: it is
	// brought in line at the next pass (its plumbHost pokes too).
	return ok && !busy
}

// followHost reads the host's facts and applies a change to the host's
// own tables (under d.fmu: no setup is under way, and d.mu).
func (d *DataPlane) followHost() (changed bool, info plane.HostInfo, notify func(plane.HostInfo), err error) {
	d.fmu.Lock()
	defer d.fmu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || !d.prepared {
		return false, info, nil, nil
	}
	hl, err := hostlink.ReadNow(d.h, d.links.Eth0, d.links.Lo)
	if err != nil {
		// eth0 gone (a driver reload): its return is an event too.
		d.log.Info("host follower: host interface not readable now; waiting for it", "eth0", d.links.Eth0, "err", err)
		return false, info, nil, nil
	}
	v6, err := d.followIPv6(hl)
	if err != nil {
		return false, info, nil, err
	}
	turnOn := d.v6 == nil && v6 != nil
	before := d.hostNow
	err = d.applyHost(hl, v6)
	if turnOn && d.v6 != nil {
		d.log.Info("IPv6: on (the host interface gained a global IPv6 address); containers share the host's IPv6 addresses (running ones as they are brought in line)",
			"mode", d.cfg.IPv6.String(), "eth0", hl.Eth0, "addresses", ipNets(v6.Global), "link_local", v6.LinkLocal.String(),
			"gateway", v6.Gateway(), "routes", len(v6.Routes))
	}
	if err != nil {
		d.hostNow = d.factsNow()
		return d.hostNow != before, d.publicInfo(), d.onHost, err
	}
	d.hostNow = d.factsNow()
	d.syncSaddr6()
	if d.hostNow == before {
		return false, info, nil, nil
	}
	d.followStats.Changes++
	return true, d.publicInfo(), d.onHost, nil
}

// followIPv6 reads the host's IPv6 facts for followHost (d.mu held): nil
// when containers have no IPv6 and keep none. With IPv6 on they are the
// host's now; with --ipv6=auto decided off they turn it on once eth0 has
// a global IPv6 address (an error reading them leaves it off until the
// next change); with --ipv6=false it stays off.
func (d *DataPlane) followIPv6(hl hostlink.Links) (*hostlink.IPv6, error) {
	if d.v6 == nil && d.cfg.IPv6 != IPv6Auto {
		return nil, nil
	}
	r, err := hostlink.ReadIPv6(d.h, hl.Eth0Index)
	switch {
	case err != nil && d.v6 != nil:
		return nil, err
	case err != nil || (d.v6 == nil && !r.HasGlobal()):
		return nil, nil
	}
	return &r, nil
}

// applyHost makes the host's tables follow hl and v6 (d.mu held): a
// recreated eth0 gets its demux back, lo the new MAC, the eth0 demux the
// new address, the neighbour sync the new subnet and gateway; d.info,
// d.links and the IPv6 facts become the new ones.
func (d *DataPlane) applyHost(hl hostlink.Links, v6 *hostlink.IPv6) error {
	lost := hl.Addr.IP == nil
	addr := hl.Addr
	if lost {
		addr = d.info.IP // the filters keep matching the last one
	}
	if v6 != nil {
		if !v6.HasGlobal() && v6.LinkLocal.IP == nil {
			v6 = nil // nothing to share now: containers keep what they have
		} else {
			d.ip6 = d.shareIPv6(v6)
		}
	}
	newEth0 := hl.Eth0Index != d.links.Eth0Index
	d.links = hl
	d.links.Addr = addr
	d.watchLinks()
	d.info.Eth0, d.info.Lo, d.info.IP, d.info.MAC, d.info.MTU = hl.Eth0, hl.Lo, addr, hl.MAC, hl.MTU
	d.lost4 = lost
	if !lost {
		d.info.Gateway = hl.Gateway
	} else {
		d.info.Gateway = nil
	}
	if v6 != nil {
		d.v6 = v6
		d.info.IPv6, d.info.Gateway6 = v6.Global, v6.Gateway()
	}
	var errs []error
	if !macEqual(hl.LoMAC, hl.MAC) {
		if err := d.h.LinkSetHardwareAddr(linkRefIdx(hl.LoIndex), hl.MAC); err != nil {
			errs = append(errs, fmt.Errorf("set %s MAC to %s's %s: %w", hl.Lo, hl.Eth0, hl.MAC, err))
		}
	}
	if newEth0 {
		if err := d.remakeEth0Demux(); err != nil {
			// Made again at the next pass; meanwhile no container is
			// pointed at an eth0 without its demux.
			d.links.Eth0Index = -1
			d.watchLinks()
			errs = append(errs, err)
		}
	} else {
		// (at once when it matches addr already)
		if err := d.eth0.SetDst(addr.IP); err != nil {
			errs = append(errs, fmt.Errorf("%s demux: %w", hl.Eth0, err))
		}
	}
	if v6 != nil && !newEth0 {
		if err := d.eth0.SetIPv6(d.demux6(d.sink.Index)); err != nil {
			errs = append(errs, fmt.Errorf("%s IPv6 demux: %w", hl.Eth0, err))
		}
	}
	if v6 != nil { // (on a recreated eth0 too: IPv6 may just have come on)
		if err := d.lo.SetIPv6(d.demux6(0)); err != nil {
			errs = append(errs, fmt.Errorf("%s IPv6 demux: %w", hl.Lo, err))
		}
	}
	if err := d.followNeigh(newEth0, v6); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// followNeigh gives the neighbour sync the host's subnet and gateways
// now; on a recreated eth0 it starts again there and serves every
// container again.
func (d *DataPlane) followNeigh(newEth0 bool, v6 *hostlink.IPv6) error {
	if d.neigh == nil && !d.neighAgain {
		return nil
	}
	if newEth0 || d.neighAgain {
		if d.neigh != nil {
			d.neigh.Close()
			d.neigh = nil
		}
		// until it is running again, later passes retry it
		d.neighAgain = true
		if err := d.startNeigh(d.links.Eth0Index, d.info.IP, d.info.Gateway); err != nil {
			return err
		}
		var err error
		if d.v6 != nil {
			err = d.neigh.EnableIPv6(d.v6.Global, d.v6.LinkLocal.IP, d.v6.Gateway())
		}
		// every container is served again, IPv6 or not
		for id, r := range d.ctrs {
			d.neigh.AddLater(id, r.pin.Path, ContainerEth0, r.ino)
		}
		d.neigh.Release()
		if err != nil {
			return err
		}
		d.neighAgain = false
		return nil
	}
	var errs []error
	if !d.lost4 {
		errs = append(errs, d.neigh.SetHost(d.info.IP, d.info.Gateway))
	}
	if v6 != nil {
		errs = append(errs, d.neigh.EnableIPv6(v6.Global, v6.LinkLocal.IP, v6.Gateway()))
	}
	return errors.Join(errs...)
}

// remakeEth0Demux makes the demux of a recreated eth0 (d.mu held): the
// fixed structure, then every container's entries, echo origins, fan-out
// nodes and shared ports, as the old device had them.
func (d *DataPlane) remakeEth0Demux() error {
	x := tcfilter.NewHostDemux(d.h, d.links.Eth0Index, d.links.Eth0, d.info.IP.IP, d.cfg.Observer)
	x.SetConn(d.hc)
	if err := x.SetIPv6(d.demux6(d.sink.Index)); err != nil {
		return fmt.Errorf("%s demux: %w", d.links.Eth0, err)
	}
	if err := x.Init(); err != nil {
		return fmt.Errorf("%s demux: %w", d.links.Eth0, err)
	}
	d.eth0 = x
	d.fragEth0(d.links.Eth0Index)
	d.wireEth0(d.links.Eth0Index)
	if err := x.EchoSteering(); err != nil {
		d.log.Warn("echo replies to the host IP are not steered by learning (cls_bpf on eth0)", "err", err)
	}
	var errs []error
	for id, r := range d.ctrs {
		c := r.c
		if err := x.AddRanges(c.Slot, r.veth, exclusiveRanges(c.Ephemeral, c.Ports)); err != nil {
			errs = append(errs, fmt.Errorf("container %s: %s demux: %w", id, d.links.Eth0, err))
		}
		if err := d.adoptEchoOrigins(id, r.veth, r.via != 0); err != nil {
			errs = append(errs, err)
		}
		if d.fanoutUsed() {
			if err := x.AddFanout(c.Slot, r.veth); err != nil {
				errs = append(errs, fmt.Errorf("container %s: ICMP fan-out: %w", id, err))
			}
		}
	}
	for port := range d.shared {
		if sp, ok := d.lo.Spread(port); ok {
			if err := x.SetSpread(port, sp); err != nil {
				errs = append(errs, fmt.Errorf("shared port %d on %s: %w", port, d.links.Eth0, err))
			}
		}
	}
	return errors.Join(errs...)
}

// followWorkers is how many containers' namespaces are brought in line
// at once (their host sides one at a time, under d.mu).
const followWorkers = 2

// inside is the part of bringing a container in line done inside its
// namespace, without d.mu.
type inside struct {
	id       string
	rec      *record
	in, want hostFacts
	pin      string
	all      []ephemeral.Range
}

// followContainers brings the containers ids in line: each one's host
// side under d.mu (its own calls wait for it), its inside without it, a
// few at once, then its record under d.mu again.
func (d *DataPlane) followContainers(ids []string) (ok bool) {
	ok = true
	jobs := make(chan inside)
	var wg sync.WaitGroup
	var okMu sync.Mutex
	fail := func() { okMu.Lock(); ok = false; okMu.Unlock() }
	for w := 0; w < min(followWorkers, len(ids)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if !d.finishContainer(j, d.syncInside(j)) {
					fail()
				}
			}
		}()
	}
	for _, id := range ids {
		j, err := d.followHostSide(id)
		switch {
		case err != nil:
			fail()
		case j != nil:
			jobs <- *j
		}
	}
	close(jobs)
	wg.Wait()
	return ok
}

// followHostSide does the host side of bringing container id in line
// (under d.mu) and returns what is left to do inside (nil: nothing, the
// container is gone or in line).
func (d *DataPlane) followHostSide(id string) (*inside, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rec := d.ctrs[id]
	if d.closed || rec == nil || rec.in == d.hostNow {
		return nil, nil
	}
	j := &inside{id: id, rec: rec, in: rec.in, want: d.hostNow, pin: rec.pin.Path,
		all: allRanges(rec.c.Ephemeral, rec.c.Ports, rec.c.Shared)}
	if err := d.syncHostSide(rec, j.in, j.want, j.all); err != nil {
		d.followFailed(rec, id, err)
		return nil, err
	}
	return j, nil
}

// finishContainer records the outcome of bringing j's container in line
// (err: its inside failed) and, on success, writes its veth's alias. It
// reports whether the container is in line.
func (d *DataPlane) finishContainer(j inside, err error) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.ctrs[j.id] != j.rec {
		return true // gone meanwhile
	}
	if err == nil {
		// The alias says what the container now carries (a restart
		// trusts it).
		err = d.setAlias(j.rec.veth, j.rec.c)
	}
	if err != nil {
		d.followFailed(j.rec, j.id, err)
		return false
	}
	if j.rec.followErr != "" {
		d.log.Info("host follower: container in line with the host again", "container", j.id)
	}
	j.rec.in, j.rec.followErr = j.want, ""
	d.followStats.Synced++
	return true
}

// followFailed counts a failure to bring rec in line and logs its error
// once (again only when it changes), with d.mu held.
func (d *DataPlane) followFailed(rec *record, id string, err error) {
	d.followStats.Failures++
	if msg := err.Error(); msg != rec.followErr {
		rec.followErr = msg
		d.log.Warn("host follower: container not brought in line with the host; trying again", "container", id, "err", err)
	}
}

// syncHostSide changes what of container rec's host side differs between
// in (what its objects carry) and want (the host now): its host veth's
// MTU and MAC, its veth (and shaper exit) filters (d.mu held).
func (d *DataPlane) syncHostSide(rec *record, in, want hostFacts, all []ephemeral.Range) error {
	c := rec.c
	link := linkRefIdx(rec.veth)
	if in.mtu != want.mtu {
		if err := d.h.LinkSetMTU(link, d.vethMTU(d.info.MTU)); err != nil {
			return fmt.Errorf("%s MTU %d: %w", plane.VethName(c.ID), d.vethMTU(d.info.MTU), err)
		}
	}
	if in.mac != want.mac {
		if err := d.h.LinkSetHardwareAddr(link, d.info.MAC); err != nil {
			return fmt.Errorf("%s MAC %s: %w", plane.VethName(c.ID), d.info.MAC, err)
		}
	}
	if !(in.ip != want.ip && want.ip != "") && in.mac == want.mac && in.eth0 == want.eth0 && in.ip6tag == want.ip6tag {
		return nil
	}
	vf := d.vethFilters(c.Slot, rec.veth, rec.via)
	if in.eth0 != want.eth0 {
		if err := vf.Retarget(all); err != nil {
			return fmt.Errorf("%s filters: %w", plane.VethName(c.ID), err)
		}
	}
	// The fixed nodes name the addresses and the MAC; a veth gaining
	// or losing IPv6 needs its tables too.
	refresh := vf.Refresh
	if in.ip6tag != want.ip6tag {
		refresh = func() error { return vf.Install(all) }
	}
	if err := refresh(); err != nil {
		return fmt.Errorf("%s filters: %w", plane.VethName(c.ID), err)
	}
	if rec.via != 0 {
		_, exit := ShaperNames(c.ID)
		xi, err := d.linkIndex(exit)
		if err == nil && xi != 0 {
			err = d.shaperExit(xi, c.Slot).Install()
		}
		if err != nil {
			return fmt.Errorf("shaper exit %s filters: %w", exit, err)
		}
	}
	return nil
}

// syncInside changes what of j's container's namespace differs between
// j.in and j.want: eth0's and lo's addresses, routes, MTU and MAC, and
// the filters there that name the host's addresses. It runs without d.mu:
// only the follower changes the host facts it reads, and nothing else
// changes what it changes (SetPorts changes the range nodes of those
// filters, not their roots).
func (d *DataPlane) syncInside(j inside) error {
	in, want := j.in, j.want
	addrChanged := in.ip != want.ip && want.ip != ""
	ns, err := nshandle.Open(j.pin)
	if err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	defer ns.Close()
	ch, err := ns.Netlink()
	if err != nil {
		return err
	}
	defer ch.Close()
	if in.ip != want.ip || in.gw != want.gw || in.mtu != want.mtu || in.mac != want.mac {
		h4 := containerns.Host4{Gateway: d.info.Gateway, MTU: d.info.MTU, LoMTU: d.loMTU(), MAC: d.info.MAC}
		if !d.lost4 {
			h4.Addr = d.info.IP
		}
		if err := containerns.SyncIPv4(ch, ContainerEth0, "lo", h4); err != nil {
			return err
		}
	}
	switch {
	case d.v6 != nil && in.v6 == "" && want.v6 != "":
		// IPv6 came on (--ipv6=auto): the container gets it as a
		// host process would.
		if err := containerns.TurnOnIPv6(ns, ch, ContainerEth0, d.v6, d.info.MTU); err != nil {
			return err
		}
		// Its neighbour sync member again, now serving IPv6 too (its
		// IPv6 neighbour settings made as at a setup with IPv6).
		d.mu.Lock()
		ng := d.neigh
		d.mu.Unlock()
		if ng != nil {
			if err := ng.Add(j.id, ns, ContainerEth0); err != nil {
				return err
			}
		}
	case d.v6 != nil && (in.v6 != want.v6 || in.mtu != want.mtu):
		if err := containerns.SyncIPv6(ch, ContainerEth0, d.v6, d.info.MTU); err != nil {
			return err
		}
	}
	if !addrChanged && in.ip6tag == want.ip6tag {
		return nil
	}
	cf, err := d.containerFiltersIn(ch)
	if err != nil {
		return err
	}
	refresh := cf.Refresh
	if in.ip6tag != want.ip6tag {
		refresh = func() error { return cf.Install(j.all) }
	}
	if err := refresh(); err != nil {
		return fmt.Errorf("container filters: %w", err)
	}
	return nil
}
