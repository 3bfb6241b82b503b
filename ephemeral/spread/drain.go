package spread

import "maps"

// Draining holders.
//
// A holder that drains a port keeps the flows it has and gets no new ones:
// AssignDraining gives every bucket to the holders that do not drain (their
// consistent assignment among themselves), and PlanFacts pins the
// draining holder's live flows in the buckets it loses, as it does for any
// holder that stays, but never holds a bucket back for it (a held bucket
// would send it new flows). Its pins go as its flows end, as any pin does;
// a port whose draining holders have no pins left is settled.
//
// When every holder drains, every bucket goes to Refuse: no holder, the
// host's own stack, which answers as for a port nobody listens on.

// Refuse is the bucket target of a port whose holders all drain: slot 0,
// no device (tcfilter installs it as "deliver to the host").
var Refuse = Holder{}

// AssignDraining is Assign over the holders that do not drain; with none
// left, every bucket is Refuse.
func AssignDraining(port uint16, holders []Holder, draining map[uint16]bool) ([Buckets]Holder, error) {
	if len(draining) == 0 {
		return Assign(port, holders)
	}
	var active []Holder
	for _, h := range holders {
		if !draining[h.Slot] {
			active = append(active, h)
		}
	}
	if len(active) == 0 {
		if _, err := checkHolders(port, holders); err != nil {
			return [Buckets]Holder{}, err
		}
		var out [Buckets]Holder
		for b := range out {
			out[b] = Refuse
		}
		return out, nil
	}
	return Assign(port, active)
}

// drainingOf is the part of draining that holders hold (nil if none).
func drainingOf(holders []Holder, draining map[uint16]bool) map[uint16]bool {
	var out map[uint16]bool
	for _, h := range holders {
		if draining[h.Slot] {
			if out == nil {
				out = map[uint16]bool{}
			}
			out[h.Slot] = true
		}
	}
	return out
}

// sameDraining compares two draining sets, nil and empty alike.
func sameDraining(a, b map[uint16]bool) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return maps.Equal(a, b)
}

// LivePins counts the pins of slot: the flows of a draining holder that
// still reach it.
func (s *Spread) LivePins(slot uint16) int {
	n := 0
	for _, h := range s.Pins {
		if h.Slot == slot {
			n++
		}
	}
	return n
}
