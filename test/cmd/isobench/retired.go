package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/dataplane"
	"github.com/isolatord/isolatord/test/sandbox"
)

// waitNoRetired waits until sb's host namespace has no link in the data
// plane's deletion group (teardowns' veth pairs still being deleted in the
// background), at most timeout.
func waitNoRetired(sb *sandbox.Sandbox, timeout time.Duration) error {
	h, err := sb.Host.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	deadline := time.Now().Add(timeout)
	left := -1 // unknown until a dump completes
	for {
		links, err := h.LinkList()
		switch {
		case errors.Is(err, netlink.ErrDumpInterrupted):
			// the links changed during the dump: read again
		case err != nil:
			return err
		default:
			left = 0
			for _, l := range links {
				if l.Attrs().Group == dataplane.RetiredGroup {
					left++
				}
			}
			if left == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("retired links still present after %s (%d at the last complete read; -1: none completed)", timeout, left)
		}
		time.Sleep(20 * time.Millisecond) // poll interval of a condition with a deadline
	}
}
