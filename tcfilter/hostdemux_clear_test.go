package tcfilter

import (
	"errors"
	"maps"
	"slices"

	"golang.org/x/sys/unix"
)

// clearAll removes all our filters and tables from the device, in an order
// the kernel accepts: the root nodes (which unlink every table), our tables
// from the top down (deleting a table deletes its nodes; each level waits
// out the EBUSY of the links just removed), then both priorities. The qdisc
// stays. Tests use it to leave a device as they found it.
func (x *HostDemux) clearAll() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.ready = false
	if x.dst != nil {
		x.dropEcho6()
		x.dropEcho()
	}
	fs, err := x.d.list()
	if err != nil {
		return err
	}
	var errs []error
	h2 := map[uint32]bool{}
	spread := map[uint32]bool{}
	for _, t := range x.stale {
		switch {
		case t.htid >= TableSpreadFirst:
			spread[t.htid] = true
		case t.htid >= TableH2Base:
			h2[t.htid] = true
		}
	}
	x.stale = nil
	for _, f := range fs {
		htid, _, _ := SplitU32Handle(f.Handle)
		switch {
		case htid >= 0x800:
			if err := x.d.del(kindOf(f.Priority, f.Handle), f.Priority, f.Handle); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
		case htid >= TableSpreadFirst && htid <= TableSpreadLast:
			spread[htid] = true
		case htid >= TableH2Base && htid < TableH2Base+256:
			h2[htid] = true
		}
		if f.Link>>20 >= TableH2Base && f.Link>>20 < TableH2Base+256 {
			h2[f.Link>>20] = true
		}
		if f.Link>>20 >= TableSpreadFirst && f.Link>>20 <= TableSpreadLast {
			spread[f.Link>>20] = true
		}
	}
	levels := [][]tableRef{
		{{KindIP, PrioIP, TableL}, {KindICMP, PrioIP, TableICMP}, {KindICMP, PrioIP6, TableICMP6}},
		{{KindIP, PrioIP, TableH1}, {KindICMP, PrioIP, TableICMPFn}, {KindICMP, PrioIP, TablePort}},
		nil, nil,
	}
	for _, t := range slices.Sorted(maps.Keys(h2)) {
		levels[2] = append(levels[2], tableRef{KindIP, PrioIP, t})
	}
	for _, t := range slices.Sorted(maps.Keys(spread)) {
		levels[3] = append(levels[3], tableRef{KindIP, PrioIP, t})
	}
	for _, l := range levels {
		if len(l) == 0 {
			continue
		}
		if _, err := x.d.delTables(l, tableBusyTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range []struct {
		kind string
		prio uint16
	}{{KindARP, PrioARP}, {KindIP, PrioIP6}, {KindIP, PrioIP}} {
		if err := x.d.delPrio(p.kind, p.prio); err != nil {
			errs = append(errs, err)
		}
	}
	x.index(nil)
	return errors.Join(errs...)
}
