package tcfilter

// Muting a container's veth at teardown.
//
// A torn-down container's host veth stays up until it is deleted in the
// background (setting a link down waits for an RCU grace period under the
// kernel's rtnl lock). Muting it drops everything the container sends: a
// second cls_bpf filter in the VLAN check's classifier (priority 1, all
// protocols, before every u32 priority), in direct-action mode, whose
// program returns TC_ACT_SHOT for every frame. cls_bpf runs its programs
// in turn until one returns something other than TC_ACT_UNSPEC, and the
// VLAN check returns TC_ACT_UNSPEC for every frame, so whichever runs
// first, the mute's verdict ends the classification: no later priority
// (no redirect) sees the frame. The kernel counts the frames it drops in
// the veth's ingress qdisc statistics (dropped). Adding a filter waits for
// no grace period.
//
// It needs cls_bpf (the VLAN check's classifier at priority 1); without
// it the caller sets the link down instead.

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// bpfNameMute is the name of the mute filter (a dump reports it).
const bpfNameMute = "isolatord_mute"

// muteHandle is the mute filter's handle in the priority-1 classifier
// (the VLAN check has 1).
const muteHandle = 2

var muteFilter = bpfFilter{bpfNameMute, loadShot, netlink.HANDLE_MIN_INGRESS, PrioVethVLAN}

// muteRequest is the request that adds the mute filter to veth.
func muteRequest(veth int) (request, error) {
	f, err := muteFilter.filter(veth)
	if err != nil {
		return request{}, err
	}
	f.Handle = muteHandle
	return request{cmd: unix.RTM_NEWTFILTER, flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, f: f}, nil
}

// MuteMessage is the netlink message (RTM_NEWTFILTER with NLM_F_ACK,
// sequence number 0: the caller sets its own) that mutes veth, for a
// caller that sends it with other requests in one write. An answer EEXIST
// means the veth is muted already.
func MuteMessage(veth int) ([]byte, error) {
	r, err := muteRequest(veth)
	if err != nil {
		return nil, fmt.Errorf("mute ifindex %d: %w", veth, err)
	}
	return r.encode()
}

// Mute mutes veth through h; a veth muted already is not an error.
func Mute(h *netlink.Handle, veth int) error {
	r, err := muteRequest(veth)
	if err == nil {
		err = h.FilterAdd(r.f)
	}
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mute ifindex %d: %w", veth, err)
	}
	return nil
}

// Muted reports whether veth has the mute filter.
func Muted(h *netlink.Handle, veth int) (bool, error) {
	fs, err := h.FilterList(linkRef(veth), muteFilter.parent)
	if err != nil {
		return false, fmt.Errorf("list filters of ifindex %d: %w", veth, err)
	}
	for _, x := range fs {
		if b, ok := x.(*netlink.BpfFilter); ok && b.Priority == muteFilter.prio && b.Handle == muteHandle && b.DirectAction && b.Name == bpfNameMute {
			return true, nil
		}
	}
	return false, nil
}
