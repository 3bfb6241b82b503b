package dataplane

// Staged veths: for runtimes that move the container's interface into its
// namespace themselves (Docker's remote network drivers: the driver names
// an interface of the host namespace in its Join answer, and Docker moves
// it in, renames it eth0 and gives it the address and MAC the driver
// returned). Stage creates the container's veth pair with both ends in the
// host namespace, the host end (VethName) down and without filters, the
// peer (StagedPeerName) the one the runtime moves. Nothing the container
// sends can leave before Setup: the host end is down until the host chain
// has installed its filters. AwaitStaged waits until the runtime has moved
// the peer into the namespace and configured it (eth0, up, with the
// address it was given); Setup then adopts the pair instead of creating
// one, and does everything else as for any container (settings and
// ip_local_port_range inside, filters, neighbours, pin). Unstage deletes a
// pair no Setup adopted.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/veth"
)

// StagedPeerPrefix starts the name of a staged pair's container end while
// it is in the host namespace.
const StagedPeerPrefix = "isd"

// StagedPeerName is the name of container id's staged peer: "isd" and 12
// hex digits of the SHA-256 of "peer:"+id (within IFNAMSIZ).
func StagedPeerName(id string) string {
	sum := sha256.Sum256([]byte("peer:" + id))
	return StagedPeerPrefix + hex.EncodeToString(sum[:])[:12]
}

// stagedVeth is a pair Stage made and no Setup adopted yet.
type stagedVeth struct {
	host int // host end ifindex
	peer string
}

// Stage creates container id's veth pair in the host namespace and returns
// the name of the end the runtime is to move into the container. Staging
// an id again returns the pair already staged.
func (d *DataPlane) Stage(ctx context.Context, id string) (string, error) {
	if err := plane.ValidateID(id); err != nil {
		return "", err
	}
	if err := checkCtx(ctx); err != nil {
		return "", err
	}
	d.hmu.RLock()
	defer d.hmu.RUnlock()
	if d.hclosed {
		return "", ErrClosed
	}
	info := d.infoNow() // before smu: strays takes smu under d.mu
	d.smu.Lock()
	defer d.smu.Unlock()
	if d.staged == nil {
		d.staged = map[string]stagedVeth{}
	}
	if s, ok := d.staged[id]; ok {
		return s.peer, nil
	}
	spec := veth.Spec{Name: plane.VethName(id), PeerName: StagedPeerName(id), MAC: info.MAC, MTU: d.vethMTU(info.MTU)}
	idx, err := veth.Create(d.h, d.hostNS, spec)
	if err != nil {
		return "", fmt.Errorf("container %s: stage: %w", id, err)
	}
	d.staged[id] = stagedVeth{host: idx, peer: spec.PeerName}
	return spec.PeerName, nil
}

// Unstage deletes container id's staged pair, if a Stage made one that no
// Setup adopted. It reports whether there was one. A pair staged by an
// earlier run of the daemon is known by its shape: the host end named
// VethName(id) without the alias every Setup gives its veth, and id
// neither plumbed nor being set up.
func (d *DataPlane) Unstage(id string) (bool, error) {
	if err := plane.ValidateID(id); err != nil {
		return false, err
	}
	d.smu.Lock()
	s, ok := d.staged[id]
	delete(d.staged, id)
	d.smu.Unlock()
	d.hmu.RLock()
	defer d.hmu.RUnlock()
	if d.hclosed {
		return ok, ErrClosed
	}
	if ok {
		_, err := veth.Delete(d.h, s.host)
		return true, err
	}
	d.mu.Lock()
	_, plumbed := d.ctrs[id]
	_, busy := d.settingUp[id]
	d.mu.Unlock()
	if plumbed || busy {
		return false, nil
	}
	l, err := d.h.LinkByName(plane.VethName(id))
	if err != nil {
		return false, nil // none
	}
	if _, isVeth := l.(*netlink.Veth); !isVeth || l.Attrs().Alias != "" {
		return false, nil
	}
	_, err = veth.Delete(d.h, l.Attrs().Index)
	return err == nil, err
}

// stagedIndex is the host end of container id's staged pair (0: none).
func (d *DataPlane) stagedIndex(id string) int {
	d.smu.Lock()
	defer d.smu.Unlock()
	return d.staged[id].host
}

// adoptStaged gives Setup container id's staged pair when its peer is eth0
// inside ns; ok is false when nothing is staged for id. From then on the
// pair is Setup's (its rollback deletes it).
func (d *DataPlane) adoptStaged(id string, ns *nshandle.NS) (idx int, ok bool, err error) {
	idx = d.stagedIndex(id)
	if idx == 0 {
		return 0, false, nil
	}
	if err := d.peerMoved(ns, idx, nil); err != nil {
		return 0, true, fmt.Errorf("container %s: staged veth: %w", id, err)
	}
	d.smu.Lock()
	delete(d.staged, id)
	d.smu.Unlock()
	return idx, true, nil
}

// errNotYet: the runtime has not finished with the staged peer.
var errNotYet = errors.New("not yet")

// peerMoved checks that eth0 in ns is the peer of host veth idx, as the
// host side sees it (the host end's peer is in ns, at eth0's ifindex: a
// link the container made itself cannot pass for it), and up, with address
// addr when addr is not nil.
func (d *DataPlane) peerMoved(ns *nshandle.NS, idx int, addr *net.IPNet) error {
	h, err := ns.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(ContainerEth0)
	if err != nil {
		return fmt.Errorf("%w: no %s in %s", errNotYet, ContainerEth0, ns.Path())
	}
	host, err := d.h.LinkByIndex(idx)
	if err != nil {
		return fmt.Errorf("staged veth (ifindex %d): %w", idx, err)
	}
	nsid, err := d.h.GetNetNsIdByFd(ns.Fd())
	if err != nil {
		return fmt.Errorf("id of %s: %w", ns.Path(), err)
	}
	if host.Attrs().NetNsID != nsid || nsid < 0 {
		return fmt.Errorf("%w: the staged veth's peer is not in %s", errNotYet, ns.Path())
	}
	if _, isVeth := l.(*netlink.Veth); !isVeth || l.Attrs().ParentIndex != idx || l.Attrs().Index != host.Attrs().ParentIndex {
		return fmt.Errorf("%s in %s is not the staged veth's peer (a %s, ifindex %d, peer ifindex %d; the staged peer is ifindex %d there, its host end %d)",
			ContainerEth0, ns.Path(), l.Type(), l.Attrs().Index, l.Attrs().ParentIndex, host.Attrs().ParentIndex, idx)
	}
	if addr == nil {
		return nil
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("%w: %s is down", errNotYet, ContainerEth0)
	}
	as, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, a := range as {
		if a.IP.Equal(addr.IP) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s has no address %s yet", errNotYet, ContainerEth0, addr.IP)
}

// AwaitStaged waits until the runtime has moved container id's staged peer
// into the namespace at nsPath and configured it: eth0 in it, up, with the
// host's address. The namespace may not exist yet (Docker 20.10 mounts it
// at nsPath after Join); it is polled, every 2 ms for the first second and
// every 20 ms after, until ctx ends.
func (d *DataPlane) AwaitStaged(ctx context.Context, id, nsPath string) error {
	idx := d.stagedIndex(id)
	if idx == 0 {
		return fmt.Errorf("container %s: nothing staged", id)
	}
	addr := d.infoNow().IP
	start := time.Now()
	var last error
	for {
		last = d.movedAt(nsPath, idx, &addr)
		if last == nil {
			return nil
		}
		if !errors.Is(last, errNotYet) && !errors.Is(last, errNoNS) {
			return fmt.Errorf("container %s: %w", id, last)
		}
		wait := 2 * time.Millisecond
		if time.Since(start) > time.Second {
			wait = 20 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("container %s: its interface did not arrive in %s: %v (%w)", id, nsPath, last, ctx.Err())
		case <-time.After(wait):
		}
	}
}

var errNoNS = errors.New("no namespace mounted yet")

// movedAt is peerMoved in the namespace at nsPath, errNoNS while there is
// none there (a missing or empty file: the runtime has yet to mount it) or
// it is still the host's. While the host end's peer is still in the host
// namespace (no link netns id: the runtime has not moved it), it answers
// errNotYet from one request on the host's handle, without opening the
// namespace (a handle in it costs two setns and a socket).
func (d *DataPlane) movedAt(nsPath string, idx int, addr *net.IPNet) error {
	d.hmu.RLock()
	defer d.hmu.RUnlock()
	if d.hclosed {
		return ErrClosed
	}
	host, err := d.h.LinkByIndex(idx)
	if err != nil {
		return fmt.Errorf("staged veth (ifindex %d): %w", idx, err)
	}
	if host.Attrs().NetNsID < 0 {
		return fmt.Errorf("%w: the staged veth's peer is still in the host namespace", errNotYet)
	}
	ns, err := nshandle.Open(nsPath)
	if err != nil {
		return fmt.Errorf("%w: %v", errNoNS, err)
	}
	defer ns.Close()
	if ns.SameAs(d.hostNS) {
		return errNoNS
	}
	return d.peerMoved(ns, idx, addr)
}

// infoNow is the host interface as the data plane knows it now.
func (d *DataPlane) infoNow() plane.HostInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.info
}
