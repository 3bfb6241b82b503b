// Package ifb makes the ifb devices of a namespace that isolatord uses as
// drop sinks (package tcfilter puts the programs and filters on them).
package ifb

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Ensure returns the ifb device named name in the namespace of h,
// creating it (down) if there is none; an existing device of another
// kind is an error.
func Ensure(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) && !errors.Is(err, unix.ENODEV) {
			return nil, fmt.Errorf("look up drop sink %s: %w", name, err)
		}
		if err := h.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name, TxQLen: 0}}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create drop sink %s: %w", name, err)
		}
		if l, err = h.LinkByName(name); err != nil {
			return nil, fmt.Errorf("drop sink %s: %w", name, err)
		}
	}
	if l.Type() != "ifb" {
		return nil, fmt.Errorf("drop sink %s exists and is a %s device, not ifb", name, l.Type())
	}
	return l, nil
}
