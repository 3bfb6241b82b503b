// Package veth creates the per-container veth pair in one netlink request
// (host end in one namespace, peer directly inside another, both with the
// host's MAC and MTU) and brings up and deletes such links. It is tested
// with real veths between scratch namespaces (root; the tests skip
// otherwise).
package veth

import (
	"errors"
	"fmt"
	"io/fs"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
)

// MaxIfNameLen is the longest interface name the kernel accepts (IFNAMSIZ-1).
const MaxIfNameLen = 15

// Spec describes a veth pair whose host end lives in the namespace of the
// netlink handle used to create it and whose peer is created directly inside
// another namespace.
type Spec struct {
	Name     string           // host end name (at most 15 bytes)
	PeerName string           // peer name inside the peer namespace (e.g. "eth0")
	MAC      net.HardwareAddr // given to BOTH ends at creation time
	MTU      int              // given to both ends
}

// Create creates the pair in one netlink request: the host end in h's
// namespace and the peer inside peer, both down, both with spec.MAC and
// spec.MTU. Setting the MAC in the creation request (not afterwards) avoids
// the race with udev/systemd's MACAddressPolicy rewriting a fresh veth's
// address. It returns the host end's ifindex. If the peer could not be placed,
// nothing is left behind (the kernel creates both ends atomically).
func Create(h *netlink.Handle, peer *nshandle.NS, spec Spec) (int, error) {
	if spec.Name == "" || len(spec.Name) > MaxIfNameLen {
		return 0, fmt.Errorf("veth name %q: must be 1..%d bytes", spec.Name, MaxIfNameLen)
	}
	if spec.PeerName == "" || len(spec.PeerName) > MaxIfNameLen {
		return 0, fmt.Errorf("veth peer name %q: must be 1..%d bytes", spec.PeerName, MaxIfNameLen)
	}
	if len(spec.MAC) != 6 {
		return 0, fmt.Errorf("veth %s: need a 6-byte MAC, got %q", spec.Name, spec.MAC)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = spec.Name
	attrs.MTU = spec.MTU
	attrs.HardwareAddr = spec.MAC
	v := &netlink.Veth{
		LinkAttrs:        attrs,
		PeerName:         spec.PeerName,
		PeerHardwareAddr: spec.MAC,
		PeerNamespace:    netlink.NsFd(peer.Fd()),
	}
	if spec.MTU > 0 {
		v.PeerMTU = uint32(spec.MTU)
	}
	if err := h.LinkAdd(v); err != nil {
		return 0, fmt.Errorf("create veth %s (peer %s in %s): %w", spec.Name, spec.PeerName, peer, err)
	}
	if v.Index == 0 {
		l, err := h.LinkByName(spec.Name)
		if err != nil {
			return 0, fmt.Errorf("look up new veth %s: %w", spec.Name, err)
		}
		v.Index = l.Attrs().Index
	}
	return v.Index, nil
}

// Delete deletes the link with ifindex idx in h's namespace. Deleting one
// end of a veth deletes its peer too. It reports whether the link existed.
func Delete(h *netlink.Handle, idx int) (bool, error) {
	l := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}
	if err := h.LinkDel(l); err != nil {
		if isNoDevice(err) {
			return false, nil
		}
		return true, fmt.Errorf("delete link %d: %w", idx, err)
	}
	return true, nil
}

// DeleteByName deletes the named link and reports whether it existed.
func DeleteByName(h *netlink.Handle, name string) (bool, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		if isNoDevice(err) {
			return false, nil
		}
		return false, fmt.Errorf("look up link %s: %w", name, err)
	}
	return Delete(h, l.Attrs().Index)
}

// Up sets the link with ifindex idx up.
func Up(h *netlink.Handle, idx int) error {
	l := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set link %d up: %w", idx, err)
	}
	return nil
}

// IsNotFound reports whether err says a link, address, route, filter or file
// does not exist.
func IsNotFound(err error) bool { return isNoDevice(err) || errors.Is(err, fs.ErrNotExist) }

func isNoDevice(err error) bool {
	var lnf netlink.LinkNotFoundError
	if errors.As(err, &lnf) {
		return true
	}
	return errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}
