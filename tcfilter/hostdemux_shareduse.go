package tcfilter

import (
	"time"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/ephemeral/spread"
)

// Last use of a shared port's nodes: the host's own evidence of a flow.
//
// Every node of a spread table (a bucket's redirect and a pin) has a mirred
// action of its own (node.own), not the shared "redirect to this veth"
// action, so the action's last use (which mirred stamps on every packet it
// redirects, as it does anyway: no cost is added per packet) tells when
// that node last steered a packet; a new or replaced node counts as used
// when it was installed. A tenant fabricates sockets in its namespace for
// free; packets through the host's filters it sends only as a client
// could (from its own ports, or from clients it controls).

// userHZ is the unit of the ages the kernel reports for an action
// (jiffies_to_clock_t: USER_HZ, 100 on every Linux ABI).
const userHZ = 100

// SpreadUse is how long ago each node of a shared port's spread steered a
// packet (or was installed, if it steered none since). A node whose action
// is shared or reports no time shows 0: the evidence then errs on the side
// of keeping flows.
type SpreadUse struct {
	Buckets [spread.Buckets]time.Duration
	Pins    map[spread.Flow]time.Duration // pinned client -> age
}

// SpreadUse reads the last use of the spread nodes of the shared ports
// listed (one dump of the ingress hook). Ports that are not shared are
// left out.
func (x *HostDemux) SpreadUse(ports ...uint16) (map[uint16]*SpreadUse, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ensureReady(); err != nil {
		return nil, err
	}
	out := map[uint16]*SpreadUse{}
	byTable := map[uint32]*SpreadUse{}
	for _, p := range ports {
		if sp := x.shared[p]; sp != nil && out[p] == nil {
			out[p] = &SpreadUse{Pins: map[spread.Flow]time.Duration{}}
			byTable[sp.table] = out[p]
		}
	}
	if len(out) == 0 {
		return out, nil
	}
	fs, err := x.d.list()
	if err != nil {
		return nil, err
	}
	for _, f := range fs {
		htid, bkt, nid := SplitU32Handle(f.Handle)
		u := byTable[htid]
		if u == nil || f.Priority != PrioIP || !isSpreadNode(bkt, nid) {
			continue
		}
		age := lastUse(f)
		if nid == nodeSpread {
			u.Buckets[bkt] = age
		} else if p, ok := pinOf(f, bkt); ok {
			u.Pins[p] = age
		}
	}
	return out, nil
}

// lastUse is how long ago f's own mirred action last redirected a packet
// (0 when shared or unknown).
func lastUse(f *netlink.U32) time.Duration {
	for _, a := range f.Actions {
		m, ok := a.(*netlink.MirredAction)
		if !ok {
			continue
		}
		if m.Timestamp == nil || redirectIndex(m.Ifindex) != 0 && uint32(m.Index) == redirectIndex(m.Ifindex) {
			return 0
		}
		return time.Duration(m.Timestamp.LastUsed) * time.Second / userHZ
	}
	return 0
}
