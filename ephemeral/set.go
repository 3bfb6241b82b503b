package ephemeral

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Set is an immutable-value sorted set of ports, kept as disjoint,
// non-adjacent (merged) ranges in ascending order. The zero value is the empty
// set. Methods never modify their receiver or arguments; every operation
// returns a new Set, so a Set may be copied and shared freely.
type Set struct {
	rs []Range // sorted, merged (no overlap, no adjacency), never reversed
}

// NewSet returns the set of all ports in rs. The ranges may overlap, touch or
// come in any order; they are merged. Callers pass valid ranges (Begin <= End):
// a reversed range holds no port and is treated as empty. NewSet never panics.
func NewSet(rs ...Range) Set {
	tmp := make([]Range, 0, len(rs))
	for _, r := range rs {
		if r.Begin <= r.End {
			tmp = append(tmp, r)
		}
	}
	return Set{rs: normalize(tmp)}
}

// PortSet returns the set of the given ports (any order, repeats allowed).
func PortSet(ports ...uint16) Set {
	rs := make([]Range, len(ports))
	for i, p := range ports {
		rs[i] = Range{Begin: p, End: p}
	}
	return NewSet(rs...)
}

// normalize sorts and merges rs in place (all ranges valid) and returns the
// merged prefix, or nil when empty.
func normalize(rs []Range) []Range {
	if len(rs) == 0 {
		return nil
	}
	slices.SortFunc(rs, func(a, b Range) int { return int(a.Begin) - int(b.Begin) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		// Merge when r overlaps or touches last (int arithmetic: End may be 65535).
		if int(r.Begin) <= int(last.End)+1 {
			if r.End > last.End {
				last.End = r.End
			}
			continue
		}
		out = append(out, r)
	}
	return slices.Clip(out)
}

// ParseSet parses a comma-separated list of ports and inclusive port ranges,
// such as "31000-31999,32500". Spaces around elements and around the dash are
// allowed; the empty (or all-blank) string is the empty set. Elements may
// overlap or come in any order. Port 0, ports above 65535, reversed ranges
// ("5-3"), empty elements ("1,,2") and anything that is not a number are
// rejected with an error that quotes the offending element.
func ParseSet(s string) (Set, error) {
	if strings.TrimSpace(s) == "" {
		return Set{}, nil
	}
	parts := strings.Split(s, ",")
	rs := make([]Range, 0, len(parts))
	for i, tok := range parts {
		tok = strings.TrimSpace(tok)
		r, err := parseRange(tok)
		if err != nil {
			if tok == "" {
				return Set{}, fmt.Errorf("invalid port range %q (element %d of %q): %w", tok, i+1, s, err)
			}
			return Set{}, fmt.Errorf("invalid port range %q: %w", tok, err)
		}
		rs = append(rs, r)
	}
	return Set{rs: normalize(rs)}, nil
}

// ParseRange parses one port ("32500") or inclusive range ("31000-31999"),
// with the same rules and error messages as ParseSet.
func ParseRange(s string) (Range, error) {
	tok := strings.TrimSpace(s)
	r, err := parseRange(tok)
	if err != nil {
		return Range{}, fmt.Errorf("invalid port range %q: %w", tok, err)
	}
	return r, nil
}

func parseRange(tok string) (Range, error) {
	if tok == "" {
		return Range{}, errors.New("empty element")
	}
	lo, hi, isRange := strings.Cut(tok, "-")
	b, err := parsePort(strings.TrimSpace(lo))
	if err != nil {
		return Range{}, err
	}
	if !isRange {
		return Range{Begin: b, End: b}, nil
	}
	e, err := parsePort(strings.TrimSpace(hi))
	if err != nil {
		return Range{}, err
	}
	if e < b {
		return Range{}, fmt.Errorf("range is reversed (%d > %d)", b, e)
	}
	return Range{Begin: b, End: e}, nil
}

func parsePort(s string) (uint16, error) {
	if s == "" {
		return 0, errors.New("missing port number")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a port number", s)
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 || n > 65535 {
		// Only digits, so a parse error means the value overflowed.
		return 0, fmt.Errorf("port %s out of range 1-65535", s)
	}
	return uint16(n), nil
}

// MustParseSet is ParseSet for constants and tests: it panics on a bad list.
func MustParseSet(s string) Set {
	set, err := ParseSet(s)
	if err != nil {
		panic(err)
	}
	return set
}

// String prints the canonical form, "31000-31999,32500", or "" for the empty
// set. ParseSet(s.String()) equals s.
func (s Set) String() string {
	var b strings.Builder
	for i, r := range s.rs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(r.String())
	}
	return b.String()
}

// Ranges returns a copy of the merged ranges, sorted ascending.
func (s Set) Ranges() []Range { return slices.Clone(s.rs) }

// Len is the number of ports in s.
func (s Set) Len() int {
	n := 0
	for _, r := range s.rs {
		n += r.Size()
	}
	return n
}

// Empty reports whether s holds no port.
func (s Set) Empty() bool { return len(s.rs) == 0 }

// find returns the index of the first range whose End >= p.
func (s Set) find(p uint16) int {
	i, _ := slices.BinarySearchFunc(s.rs, p, func(r Range, p uint16) int {
		if r.End < p {
			return -1
		}
		return 1
	})
	return i
}

// Contains reports whether port p is in s.
func (s Set) Contains(p uint16) bool {
	i := s.find(p)
	return i < len(s.rs) && s.rs[i].Begin <= p
}

// ContainsRange reports whether every port of r is in s. A reversed (empty)
// range is trivially contained.
func (s Set) ContainsRange(r Range) bool {
	if r.End < r.Begin {
		return true
	}
	i := s.find(r.Begin)
	// Ranges are merged, so r must fit in a single one.
	return i < len(s.rs) && s.rs[i].Begin <= r.Begin && r.End <= s.rs[i].End
}

// ContainsSet reports whether o is a subset of s.
func (s Set) ContainsSet(o Set) bool {
	for _, r := range o.rs {
		if !s.ContainsRange(r) {
			return false
		}
	}
	return true
}

// Union returns the ports in s or o.
func (s Set) Union(o Set) Set {
	if len(o.rs) == 0 {
		return s
	}
	if len(s.rs) == 0 {
		return o
	}
	rs := make([]Range, 0, len(s.rs)+len(o.rs))
	rs = append(rs, s.rs...)
	rs = append(rs, o.rs...)
	return Set{rs: normalize(rs)}
}

// Intersect returns the ports in both s and o.
func (s Set) Intersect(o Set) Set {
	var out []Range
	i, j := 0, 0
	for i < len(s.rs) && j < len(o.rs) {
		a, b := s.rs[i], o.rs[j]
		lo, hi := max(a.Begin, b.Begin), min(a.End, b.End)
		if lo <= hi {
			out = append(out, Range{lo, hi})
		}
		if a.End < b.End {
			i++
		} else {
			j++
		}
	}
	return Set{rs: out}
}

// Subtract returns the ports in s that are not in o.
func (s Set) Subtract(o Set) Set {
	var out []Range
	j := 0
	for _, r := range s.rs {
		cur := int(r.Begin) // next port of r not yet emitted or removed
		for j < len(o.rs) && o.rs[j].End < r.Begin {
			j++
		}
		for k := j; k < len(o.rs) && o.rs[k].Begin <= r.End; k++ {
			if int(o.rs[k].Begin) > cur {
				out = append(out, Range{uint16(cur), o.rs[k].Begin - 1})
			}
			cur = max(cur, int(o.rs[k].End)+1)
		}
		if cur <= int(r.End) {
			out = append(out, Range{uint16(cur), r.End})
		}
	}
	return Set{rs: out}
}

// Overlaps reports whether s and o share at least one port.
func (s Set) Overlaps(o Set) bool {
	i, j := 0, 0
	for i < len(s.rs) && j < len(o.rs) {
		a, b := s.rs[i], o.rs[j]
		if a.Overlaps(b) {
			return true
		}
		if a.End < b.End {
			i++
		} else {
			j++
		}
	}
	return false
}

// Equal reports whether s and o hold the same ports.
func (s Set) Equal(o Set) bool { return slices.Equal(s.rs, o.rs) }

// Ports lists every port in s in ascending order. Meant for small sets: a
// full set holds 65536 ports.
func (s Set) Ports() []uint16 {
	out := make([]uint16, 0, s.Len())
	for _, r := range s.rs {
		for p := int(r.Begin); p <= int(r.End); p++ {
			out = append(out, uint16(p))
		}
	}
	return out
}

// MarshalText encodes s in its canonical string form.
func (s Set) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses a list as ParseSet does.
func (s *Set) UnmarshalText(b []byte) error {
	v, err := ParseSet(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalJSON encodes s as a JSON string in canonical form.
func (s Set) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// UnmarshalJSON decodes a JSON string as ParseSet does.
func (s *Set) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return fmt.Errorf("port set must be a JSON string: %w", err)
	}
	return s.UnmarshalText([]byte(str))
}
