package isolator

import "github.com/isolatord/isolatord/isolator/plane"

// slotSet hands out container slots 1..MaxSlot, lowest first.
type slotSet struct {
	used [plane.MaxSlot + 1]bool
	n    int
}

func (s *slotSet) take() (uint16, bool) {
	for i := 1; i <= plane.MaxSlot; i++ {
		if !s.used[i] {
			s.used[i] = true
			s.n++
			return uint16(i), true
		}
	}
	return 0, false
}

func (s *slotSet) claim(i uint16) bool {
	if i == 0 || int(i) > plane.MaxSlot || s.used[i] {
		return false
	}
	s.used[i] = true
	s.n++
	return true
}

func (s *slotSet) put(i uint16) {
	if i != 0 && int(i) <= plane.MaxSlot && s.used[i] {
		s.used[i] = false
		s.n--
	}
}
