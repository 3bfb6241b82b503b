package tcfilter

import (
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
)

func TestFormatHandle(t *testing.T) {
	for h, want := range map[uint32]string{
		0:                             "none",
		0x80000800:                    "800::800",
		MakeU32Handle(2, 0x80, 0x20a): "2:80:20a",
		MakeU32Handle(0x100, 0, 0):    "100:",
		MakeU32Handle(0x120, 0, 4):    "120::4",
		MakeU32Handle(0, 0, 5):        ":5",
		MakeU32Handle(0x200, 0x3f, 0): "200:3f",
	} {
		if got := FormatHandle(h); got != want {
			t.Errorf("FormatHandle(%#x) = %q, want %q", h, got, want)
		}
	}
}

// TestRangeNodeIDUnique checks, for every aligned range meeting a 256-port
// chunk, that no two distinct ranges share a node id, and that ids fit in
// 12 bits and never collide with the infrastructure ids used in the same
// tables (H2 link 0x800, shared-port links 0x4xx).
func TestRangeNodeIDUnique(t *testing.T) {
	seen := map[uint32]ephemeral.Range{}
	chunk := uint16(0x1f00)
	for k := 0; k <= 16; k++ {
		size := 1 << k
		var begins []int
		if k >= 8 {
			begins = []int{int(chunk) &^ (size - 1)}
		} else {
			for b := int(chunk); b < int(chunk)+256; b += size {
				begins = append(begins, b)
			}
		}
		for _, b := range begins {
			r := ephemeral.Range{Begin: uint16(b), End: uint16(b + size - 1)}
			if !r.IsAligned() {
				t.Fatalf("%s not aligned", r)
			}
			id := RangeNodeID(r)
			if id == 0 || id > 0xfff || id&0xf00 == nodeSharedBase || id == nodeH2Link {
				t.Fatalf("%s: bad node id %#x", r, id)
			}
			if o, dup := seen[id]; dup {
				t.Fatalf("%s and %s share node id %#x", o, r, id)
			}
			seen[id] = r
		}
	}
	if len(seen) != 510+9 { // sizes 1..128 in a chunk: 256+128+...+2; sizes 256..65536: 9
		t.Fatalf("%d ids", len(seen))
	}
}

func TestRangeNodesPlacement(t *testing.T) {
	cases := []struct {
		r    ephemeral.Range
		want []uint32
	}{
		{rg(0x8000, 0x83ff), []uint32{MakeU32Handle(TableH1, 0x80, 0x20a), MakeU32Handle(TableH1, 0x81, 0x20a), MakeU32Handle(TableH1, 0x82, 0x20a), MakeU32Handle(TableH1, 0x83, 0x20a)}},
		{rg(0, 65535), nil}, // 256 nodes, checked by count below
		{rg(0x1f90, 0x1f90), []uint32{MakeU32Handle(0x11f, 9, 0x190)}},
		{rg(0x2000, 0x203f), []uint32{MakeU32Handle(0x120, 0, 4), MakeU32Handle(0x120, 1, 4), MakeU32Handle(0x120, 2, 4), MakeU32Handle(0x120, 3, 4)}},
	}
	for _, c := range cases {
		ns := rangeNodes(1, 5, c.r)
		if c.want == nil {
			if len(ns) != 256 {
				t.Errorf("%s: %d nodes", c.r, len(ns))
			}
			continue
		}
		if len(ns) != len(c.want) {
			t.Fatalf("%s: %d nodes, want %d", c.r, len(ns), len(c.want))
		}
		for i, n := range ns {
			if n.handle != c.want[i] {
				t.Errorf("%s node %d: %s, want %s", c.r, i, FormatHandle(n.handle), FormatHandle(c.want[i]))
			}
			if n.classid != ClassID(1) || n.target != 5 || n.act != actRedirect {
				t.Errorf("%s: node %+v", c.r, n)
			}
		}
	}
}
