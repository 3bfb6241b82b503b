package ephemeral

import (
	"fmt"
	"testing"
)

// BenchmarkAllocateRelease: one Allocate and one Release on a pool of 512
// blocks of 64 ports (32768-65535), half full.
func BenchmarkAllocateRelease(b *testing.B) {
	a, err := NewAllocator(MustParseSet("32768-65535"), 64)
	if err != nil {
		b.Fatal(err)
	}
	for range a.Total() / 2 {
		if _, err := a.Allocate(); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		r, err := a.Allocate()
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Release(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocateReleaseWorstCase: the only free block is the last of the
// largest possible pool (4096 blocks of 16 ports), so first fit scans it all.
func BenchmarkAllocateReleaseWorstCase(b *testing.B) {
	a, err := NewAllocator(NewSet(Range{0, 65535}), 16)
	if err != nil {
		b.Fatal(err)
	}
	for range a.Total() - 1 {
		if _, err := a.Allocate(); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		r, err := a.Allocate()
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Release(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimRelease: recovery's path.
func BenchmarkClaimRelease(b *testing.B) {
	a, err := NewAllocator(MustParseSet("32768-65535"), 64)
	if err != nil {
		b.Fatal(err)
	}
	r := Range{40000 / 64 * 64, 40000/64*64 + 63}
	for b.Loop() {
		if err := a.Claim(r); err != nil {
			b.Fatal(err)
		}
		if err := a.Release(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSplit(b *testing.B) {
	for _, in := range []string{
		"31000-31499",
		"32768-33791",
		"1-65535",
		"1025-2047,3001-4999,10007-19993,31000-31999,40001-40003,50001-65534",
	} {
		s := MustParseSet(in)
		b.Run(fmt.Sprintf("%d_ranges_%d_ports", len(s.Ranges()), s.Len()), func(b *testing.B) {
			for b.Loop() {
				_ = Split(s)
			}
		})
	}
}

func BenchmarkParseSet(b *testing.B) {
	for b.Loop() {
		if _, err := ParseSet("31000-31999,32500,33000-33100,40000"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSetUnionSubtract(b *testing.B) {
	x := MustParseSet("1000-2000,3000-4000,5000-6000,7000-8000")
	y := MustParseSet("1500-3500,5500,7999-9000")
	for b.Loop() {
		_ = x.Union(y).Subtract(y)
	}
}

// BenchmarkLedgerReserveRelease: reserve 10 exclusive and 2 shared ports next
// to 100 other containers, then release.
func BenchmarkLedgerReserveRelease(b *testing.B) {
	l := NewLedger(MustParseSet("31000-31999"), MustParseSet("32768-65535"))
	for i := range 100 {
		p := uint16(31100 + i*5)
		if err := l.Reserve(fmt.Sprint("c", i), Request{Exclusive: NewSet(Range{p, p + 3}), Shared: MustParseSet("31000-31001")}); err != nil {
			b.Fatal(err)
		}
	}
	r := Request{Exclusive: MustParseSet("31010-31019"), Shared: MustParseSet("31000-31001")}
	for b.Loop() {
		if err := l.Reserve("bench", r); err != nil {
			b.Fatal(err)
		}
		l.Release("bench")
	}
}
