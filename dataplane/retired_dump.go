package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/nlbatch/nlattr"
)

// rtextFilterSkipStats is RTEXT_FILTER_SKIP_STATS: a link dump without
// the links' statistics.
const rtextFilterSkipStats = 1 << 3

// foreignRetired reads the names of the links of RetiredGroup in the host
// namespace that are not ours (ourRetired), from one link dump without
// statistics of which only the name, group and alias are read: with 1,000
// containers a full dump (netlink's LinkList) costs tens of ms of CPU, and
// the background deletion checks the group before every group delete. An
// interrupted dump is taken again (dumpTries).
func (d *DataPlane) foreignRetired() (foreign []string, err error) {
	for try := 0; try < dumpTries; try++ {
		var msgs [][]byte
		err = d.hostNS.Do(func() error {
			req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
			req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
			req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(rtextFilterSkipStats)))
			var err error
			msgs, err = req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
			return err
		})
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list host links: %w", err)
		}
		foreign = nil
		for _, m := range msgs {
			a, ok := linkNameGroupAlias(m)
			if !ok || !isRetired(&a) {
				continue
			}
			if !ourRetired(&a) {
				foreign = append(foreign, a.Name)
			}
		}
		return foreign, nil
	}
	return nil, fmt.Errorf("list host links: %w", err)
}

// linkNameGroupAlias reads a link message's index, name, group and alias.
func linkNameGroupAlias(m []byte) (netlink.LinkAttrs, bool) {
	var a netlink.LinkAttrs
	if len(m) < unix.SizeofIfInfomsg {
		return a, false
	}
	a.Index = int(nl.DeserializeIfInfomsg(m).Index)
	// The attributes are walked in place (a dump of 1,000 links parsed
	// into attribute slices allocated megabytes).
	ok := nlattr.Walk(m[unix.SizeofIfInfomsg:], func(typ uint16, v []byte) bool {
		switch typ {
		case unix.IFLA_IFNAME:
			a.Name = string(trimNUL(v))
		case unix.IFLA_GROUP:
			if len(v) == 4 {
				a.Group = binary.NativeEndian.Uint32(v)
			}
		case unix.IFLA_IFALIAS:
			a.Alias = string(trimNUL(v))
		}
		return true
	})
	return a, ok
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}
