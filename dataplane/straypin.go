package dataplane

import (
	"strings"

	"github.com/isolatord/isolatord/netns/nspin"
)

// strayPinOwned reports whether the namespace pin called name in the netns
// directory, found for a stray veth (host ifindex veth), is isolatord's
// own, so that RemoveStrays may unmount it. Isolatord removes only the
// pins it made: <id>@isolatord (only isolatord pins there), or <id> when
// the veth's alias says PinOwned and no pin of ours stands beside it at
// <id>@isolatord (then <id> is a runtime's pin of another namespace). A
// veth without our alias (ownership lost) leaves <id> in place.
func (d *DataPlane) strayPinOwned(name string, veth int, mounts map[string]uint64) bool {
	id, alt := strings.CutSuffix(name, nspin.Suffix)
	if alt {
		return true
	}
	if _, beside := mounts[id+nspin.Suffix]; beside {
		return false
	}
	l, err := d.h.LinkByIndex(veth)
	if err != nil {
		return false
	}
	m, ok := parseAlias(l.Attrs().Alias)
	return ok && m.ID == id && m.PinOwned
}
