package ephemeral

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
)

func req(excl, shared string) Request {
	return Request{Exclusive: MustParseSet(excl), Shared: MustParseSet(shared)}
}

// snapshot captures everything observable about a ledger.
func snapshot(l *Ledger, ports Set) string {
	s := ""
	for _, c := range l.Containers() {
		r, _ := l.Holding(c)
		s += fmt.Sprintf("%s:x=%s,s=%s;", c, r.Exclusive, r.Shared)
	}
	for _, p := range ports.Ports() {
		if hs := l.Holders(p); len(hs) > 0 {
			s += fmt.Sprintf("%d:%v;", p, hs)
		}
	}
	x, sh := l.Counts()
	return s + fmt.Sprintf("counts=%d/%d", x, sh)
}

func TestLedgerRules(t *testing.T) {
	managed := MustParseSet("31000-31999")
	l := NewLedger(managed, MustParseSet("32768-33791"))
	type step struct {
		op        string // "reserve", "update", "release"
		container string
		req       Request
		is        error  // nil = success
		msg       string // exact error text when set
	}
	steps := []step{
		{"reserve", "c1", req("31001", ""), nil, ""},
		{"reserve", "c2", req("31001", ""), ErrConflict, "port 31001 is held exclusively by c1"},
		{"reserve", "c2", req("", "31001"), ErrConflict, "port 31001 is held exclusively by c1"},
		{"reserve", "c2", req("31005", "31002"), nil, ""},
		{"reserve", "c3", req("", "31002-31003"), nil, ""},
		{"reserve", "c4", req("31002", ""), ErrConflict, "port 31002 is shared by c2, c3; an exclusive request cannot take it"},
		{"reserve", "c4", req("31010-31020", "31002,31005"), ErrConflict, "port 31005 is held exclusively by c2"},
		{"reserve", "c4", req("", "40000"), ErrNotManaged, "port 40000 is not a managed static port (managed: 31000-31999)"},
		{"reserve", "c4", req("32768", ""), ErrInEphemeralPool, "port 32768 is in the ephemeral pool"},
		{"reserve", "c4", req("31010", "31010"), ErrInvalidRequest, "invalid port request: port 31010 is requested both exclusive and shared"},
		{"reserve", "", req("31010", ""), ErrInvalidRequest, "invalid port request: empty container name"},
		{"reserve", "c1", req("31011", ""), ErrAlreadyHolding, `container "c1": container already holds a reservation; use Update to change it`},
		{"update", "c9", req("31011", ""), ErrUnknownContainer, `container "c9": container holds no reservation; use Reserve`},
		{"reserve", "c4", req("", "31002"), nil, ""},
		{"reserve", "c5", Request{}, nil, ""},
		// A large request (more ports than are held) reports the lowest conflict.
		{"update", "c5", req("31000-31999", ""), ErrConflict, "port 31001 is held exclusively by c1"},
		{"update", "c5", req("", "31000-31999"), ErrConflict, "port 31001 is held exclusively by c1"},
		// Update is checked against others only: c1 may turn 31001 shared.
		{"update", "c1", req("", "31001"), nil, ""},
		{"update", "c5", req("31100", "31001"), nil, ""},
		// c2 cannot take 31002 exclusively while c3 and c4 share it...
		{"update", "c2", req("31002,31005", ""), ErrConflict, "port 31002 is shared by c3, c4; an exclusive request cannot take it"},
		{"release", "c3", Request{}, nil, ""},
		{"release", "c4", Request{}, nil, ""},
		{"release", "c4", Request{}, nil, ""}, // idempotent
		// ...but can once they are gone.
		{"update", "c2", req("31002,31005", ""), nil, ""},
		{"update", "c2", req("31002,31005", ""), nil, ""}, // no-op
	}
	for i, s := range steps {
		before := snapshot(l, managed)
		var err error
		switch s.op {
		case "reserve":
			err = l.Reserve(s.container, s.req)
		case "update":
			err = l.Update(s.container, s.req)
		case "release":
			l.Release(s.container)
		}
		if s.is == nil {
			if err != nil {
				t.Fatalf("step %d %s %s: %v", i, s.op, s.container, err)
			}
			if s.op != "release" {
				if got, ok := l.Holding(s.container); !ok || !got.Equal(s.req) {
					t.Fatalf("step %d: holding %v %v", i, got, ok)
				}
			}
			continue
		}
		if !errors.Is(err, s.is) || err.Error() != s.msg {
			t.Fatalf("step %d %s %s: error %v, want %q (%v)", i, s.op, s.container, err, s.msg, s.is)
		}
		var ce *ConflictError
		if errors.As(err, &ce) != (s.is == ErrConflict) {
			t.Fatalf("step %d: ConflictError %v for %v", i, ce, s.is)
		}
		if after := snapshot(l, managed); after != before {
			t.Fatalf("step %d: failed %s changed the ledger:\n%s\n%s", i, s.op, before, after)
		}
	}
	if got := l.Holders(31001); !slices.Equal(got, []Holder{{"c1", true}, {"c5", true}}) {
		t.Errorf("Holders(31001) = %v", got)
	}
	if got := l.Holders(31002); !slices.Equal(got, []Holder{{"c2", false}}) {
		t.Errorf("Holders(31002) = %v", got)
	}
	if l.Holders(31999) != nil {
		t.Error("Holders of a free port")
	}
	if x, sh := l.Counts(); x != 3 || sh != 1 { // 31002, 31005, 31100 exclusive; 31001 shared
		t.Errorf("Counts = %d, %d", x, sh)
	}
	if got := l.Containers(); !slices.Equal(got, []string{"c1", "c2", "c5"}) {
		t.Errorf("Containers = %v", got)
	}
	var ce *ConflictError
	err := l.Reserve("c6", req("31001", ""))
	if !errors.As(err, &ce) || ce.Port != 31001 || !slices.Equal(ce.Holders, []Holder{{"c1", true}, {"c5", true}}) {
		t.Errorf("ConflictError = %+v", ce)
	}
	ce.Holders[0].Container = "mutated"
	if l.Holders(31001)[0].Container != "c1" {
		t.Error("ConflictError shares the ledger's holder slice")
	}
}

func TestLedgerEphemeralWinsOverManaged(t *testing.T) {
	// A misconfiguration (ValidatePools rejects it) must still never let a
	// static reservation take an ephemeral port, shared or not.
	l := NewLedger(MustParseSet("1024-65535"), MustParseSet("32768-33791"))
	for _, r := range []Request{req("33000", ""), req("", "33000"), req("32000-40000", "")} {
		if err := l.Reserve("c", r); !errors.Is(err, ErrInEphemeralPool) {
			t.Errorf("Reserve(%v): %v", r, err)
		}
	}
	empty := NewLedger(Set{}, Set{})
	if err := empty.Reserve("c", req("80", "")); err == nil || err.Error() != "port 80 is not a managed static port (managed: none)" {
		t.Errorf("empty ledger: %v", err)
	}
}

// TestLedgerProperties runs random Reserve/Update/Release against a model
// of the sharing rules, checking errors, atomicity and invariants.
func TestLedgerProperties(t *testing.T) {
	for seed := range uint64(20) {
		rng := newRand(100 + seed)
		runLedgerModel(t, func(n int) int { return rng.IntN(n) }, 300)
	}
}

// runLedgerModel applies steps random operations to a small ledger (managed
// 31000-31023 plus 31040-31047; ephemeral pool 31020-31031, overlapping on
// purpose) and checks each against an independent model.
func runLedgerModel(t testing.TB, choose func(int) int, steps int) {
	t.Helper()
	managed := MustParseSet("31000-31023,31040-31047")
	eph := MustParseSet("31020-31031")
	universe := NewSet(Range{30998, 31049})
	l := NewLedger(managed, eph)
	model := map[string]Request{}
	containers := []string{"a", "b", "c", "d"}
	randSet := func() Set {
		var rs []Range
		for range choose(3) {
			b := 30998 + choose(52)
			rs = append(rs, Range{uint16(b), uint16(b + choose(3))})
		}
		return NewSet(rs...)
	}
	for range steps {
		c := containers[choose(len(containers))]
		if choose(6) == 0 {
			l.Release(c)
			delete(model, c)
		} else {
			r := Request{Exclusive: randSet(), Shared: randSet()}
			if choose(3) > 0 {
				r.Shared = r.Shared.Subtract(r.Exclusive)
			}
			_, holding := model[c]
			update := holding && choose(4) > 0
			want := expectLedger(model, managed, eph, c, r, update)
			before := snapshot(l, universe)
			var err error
			if update {
				err = l.Update(c, r)
			} else {
				err = l.Reserve(c, r)
			}
			if (err == nil) != (want == nil) || want != nil && !errors.Is(err, want) {
				t.Fatalf("%s %v (update=%v) with %v: got %v, model %v", c, r, update, model, err, want)
			}
			if err != nil {
				if after := snapshot(l, universe); after != before {
					t.Fatalf("failed request changed the ledger:\n%s\n%s", before, after)
				}
			} else {
				model[c] = r
			}
		}
		// Invariants: the ledger's per-port view matches the model, each port
		// is held by one exclusive holder or only by sharers, counts add up.
		exclusive, shared := 0, 0
		for _, p := range universe.Ports() {
			var want []Holder
			for _, name := range slices.Sorted(maps.Keys(model)) {
				r := model[name]
				if r.Exclusive.Contains(p) || r.Shared.Contains(p) {
					want = append(want, Holder{name, r.Shared.Contains(p)})
				}
			}
			got := l.Holders(p)
			if !slices.Equal(got, want) {
				t.Fatalf("Holders(%d) = %v, model %v", p, got, want)
			}
			if len(got) > 0 && (eph.Contains(p) || !managed.Contains(p)) {
				t.Fatalf("port %d held outside the managed static ports", p)
			}
			for _, h := range got {
				if !h.Shared && len(got) > 1 {
					t.Fatalf("port %d: exclusive holder among %v", p, got)
				}
			}
			if len(got) > 0 && got[0].Shared {
				shared++
			} else if len(got) > 0 {
				exclusive++
			}
		}
		if x, s := l.Counts(); x != exclusive || s != shared {
			t.Fatalf("Counts %d/%d, model %d/%d", x, s, exclusive, shared)
		}
	}
}

// expectLedger is the model: the sentinel the ledger must return, or nil.
func expectLedger(model map[string]Request, managed, eph Set, c string, r Request, update bool) error {
	if _, ok := model[c]; ok && !update {
		return ErrAlreadyHolding
	}
	if r.Exclusive.Overlaps(r.Shared) {
		return ErrInvalidRequest
	}
	for _, p := range r.All().Ports() {
		if eph.Contains(p) {
			return ErrInEphemeralPool
		}
	}
	for _, p := range r.All().Ports() {
		if !managed.Contains(p) {
			return ErrNotManaged
		}
	}
	for _, p := range r.All().Ports() {
		for name, o := range model {
			if name == c {
				continue
			}
			heldShared, heldExcl := o.Shared.Contains(p), o.Exclusive.Contains(p)
			if heldExcl || heldShared && r.Exclusive.Contains(p) {
				return ErrConflict
			}
		}
	}
	return nil
}
