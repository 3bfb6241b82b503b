package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// MaxIfNameLen is the longest interface name the kernel accepts (IFNAMSIZ-1).
const MaxIfNameLen = 15

// VethSpec describes a veth pair whose host end lives in the namespace of the
// netlink handle used to create it and whose peer is created directly inside
// another namespace.
type VethSpec struct {
	Name     string           // host end name (at most 15 bytes)
	PeerName string           // peer name inside the peer namespace (e.g. "eth0")
	MAC      net.HardwareAddr // given to BOTH ends at creation time
	MTU      int              // given to both ends
}

// CreateVeth creates the pair in one netlink request: the host end in h's
// namespace and the peer inside peer, both down, both with spec.MAC and
// spec.MTU. Setting the MAC in the creation request (not afterwards) avoids
// the race with udev/systemd's MACAddressPolicy rewriting a fresh veth's
// address. It returns the host end's ifindex. If the peer could not be placed,
// nothing is left behind (the kernel creates both ends atomically).
func CreateVeth(h *netlink.Handle, peer *NS, spec VethSpec) (int, error) {
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

// DeleteLink deletes the link with ifindex idx in h's namespace. Deleting one
// end of a veth deletes its peer too. It reports whether the link existed.
func DeleteLink(h *netlink.Handle, idx int) (bool, error) {
	l := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}
	if err := h.LinkDel(l); err != nil {
		if isNoDevice(err) {
			return false, nil
		}
		return true, fmt.Errorf("delete link %d: %w", idx, err)
	}
	return true, nil
}

// DeleteLinkByName deletes the named link and reports whether it existed.
func DeleteLinkByName(h *netlink.Handle, name string) (bool, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		if isNoDevice(err) {
			return false, nil
		}
		return false, fmt.Errorf("look up link %s: %w", name, err)
	}
	return DeleteLink(h, l.Attrs().Index)
}

// LinkUp sets the link with ifindex idx up.
func LinkUp(h *netlink.Handle, idx int) error {
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

// DisableIPv6Here turns IPv6 off for interface ifname in the calling
// thread's namespace (use inside NS.Do). A kernel without IPv6 is fine.
func DisableIPv6Here(ifname string) error { return SysctlDir{}.DisableIPv6(ifname) }

// DisableIPv6 is DisableIPv6Here through s.
func (s SysctlDir) DisableIPv6(ifname string) error {
	err := s.Write("net/ipv6/conf/"+ifname+"/disable_ipv6", "1")
	if err != nil && errors.Is(err, fs.ErrNotExist) && !s.ipv6Present() {
		return nil
	}
	return err
}

func (s SysctlDir) ipv6Present() bool {
	_, err := s.Read("net/ipv6/conf/all/disable_ipv6")
	return err == nil
}
