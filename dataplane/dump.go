package dataplane

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// dumpTries bounds the retries of an interrupted dump.
const dumpTries = 20

// dump runs a netlink dump again while the kernel reports it interrupted
// (NLM_F_DUMP_INTR: the table changed during the dump, as it does while
// retired links are deleted in the background or other containers are set
// up). A partial list is never used: recovery and the rebuild from the
// kernel decide from these lists what a container has, so a link missing
// from one would be taken for gone.
func dump[T any](what string, list func() ([]T, error)) ([]T, error) {
	var (
		out []T
		err error
	)
	for try := 0; try < dumpTries; try++ {
		if out, err = list(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", what, err)
	}
	return out, nil
}

// hostLinks dumps the host namespace's links, complete.
func (d *DataPlane) hostLinks() ([]netlink.Link, error) {
	return dump("host links", d.h.LinkList)
}
