package ephemeral

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync/atomic"
)

// Errors from the Allocator (and, for ErrNotManaged, the Ledger). Test them
// with errors.Is; the returned errors wrap them with details.
var (
	// ErrExhausted: no free block is left in the pool.
	ErrExhausted = errors.New("ephemeral port pool exhausted")
	// ErrUnaligned: a range is not one block (wrong size or not aligned to
	// the block size).
	ErrUnaligned = errors.New("range is not an aligned block")
	// ErrNotManaged: a port or range lies outside the ports this package
	// manages (the ephemeral pool, or the static ports of a Ledger).
	ErrNotManaged = errors.New("not managed")
	// ErrTaken: Claim of a block that is already allocated.
	ErrTaken = errors.New("block already allocated")
	// ErrNotAllocated: Release of a block that is not allocated.
	ErrNotAllocated = errors.New("block not allocated")
)

// MinBlockSize is the smallest ephemeral block a container can get.
const MinBlockSize = 16

// Allocator hands out fixed-size ephemeral port blocks from a pool. Every
// block has BlockSize ports (a power of two, at least MinBlockSize) and begins
// on a multiple of BlockSize, so a container's range is matched by one u32
// value/mask key, and its ip_local_port_range is exactly the block. The
// blocks are all the aligned blocks lying wholly inside the pool; Allocate
// picks the lowest free one (first fit), so allocation is deterministic.
//
// An Allocator is not safe for concurrent use: the caller serialises access
// (the lifecycle does so under its own lock). Only BlockSize, Total and Used
// may be called at any time (a status read that takes no lock). No method panics on bad input;
// double claims and double releases are reported as errors.
type Allocator struct {
	pool      Set
	blockSize int
	blocks    []uint16 // Begin of each block, ascending
	used      []uint64 // bitmap over blocks: bit i set = blocks[i] allocated
	nUsed     atomic.Int64
}

// NewAllocator builds an allocator over pool with blocks of blockSize ports.
// It fails when blockSize is not a power of two, is below MinBlockSize, or when
// no block of that size, aligned to it, fits wholly inside the pool.
func NewAllocator(pool Set, blockSize int) (*Allocator, error) {
	switch {
	case blockSize < MinBlockSize:
		return nil, fmt.Errorf("ephemeral block size %d is below the minimum %d", blockSize, MinBlockSize)
	case blockSize&(blockSize-1) != 0:
		return nil, fmt.Errorf("ephemeral block size %d is not a power of two", blockSize)
	case blockSize > 1<<16:
		return nil, fmt.Errorf("ephemeral block size %d is larger than the port space", blockSize)
	case pool.Empty():
		return nil, errors.New("ephemeral port pool is empty")
	}
	a := &Allocator{pool: pool, blockSize: blockSize}
	for _, r := range pool.rs {
		// First multiple of blockSize at or after r.Begin.
		b := (int(r.Begin) + blockSize - 1) &^ (blockSize - 1)
		for ; b+blockSize-1 <= int(r.End); b += blockSize {
			a.blocks = append(a.blocks, uint16(b))
		}
	}
	if len(a.blocks) == 0 {
		largest := 0
		for _, r := range Split(pool) {
			largest = max(largest, r.Size())
		}
		return nil, fmt.Errorf("no aligned block of %d ports fits in ephemeral pool %s (largest aligned block: %d ports)",
			blockSize, pool, largest)
	}
	a.used = make([]uint64, (len(a.blocks)+63)/64)
	return a, nil
}

// Pool is the set of ports the allocator was built over.
func (a *Allocator) Pool() Set { return a.pool }

// BlockSize is the number of ports in each block.
func (a *Allocator) BlockSize() int { return a.blockSize }

// Total is the number of blocks in the pool.
func (a *Allocator) Total() int { return len(a.blocks) }

// Used is the number of allocated blocks.
func (a *Allocator) Used() int { return int(a.nUsed.Load()) }

// Free is the number of blocks left to allocate.
func (a *Allocator) Free() int { return len(a.blocks) - a.Used() }

func (a *Allocator) block(i int) Range {
	b := a.blocks[i]
	return Range{Begin: b, End: b + uint16(a.blockSize-1)}
}

func (a *Allocator) isUsed(i int) bool { return a.used[i/64]&(1<<(i%64)) != 0 }

// Allocate reserves the lowest free block and returns it, or an error
// wrapping ErrExhausted when every block is in use.
func (a *Allocator) Allocate() (Range, error) {
	for w, word := range a.used {
		if word == ^uint64(0) {
			continue
		}
		i := w*64 + bits.TrailingZeros64(^word)
		if i >= len(a.blocks) {
			break
		}
		a.used[w] |= 1 << (i % 64)
		a.nUsed.Add(1)
		return a.block(i), nil
	}
	return Range{}, fmt.Errorf("%w: all %d blocks of %d ports in %s are in use",
		ErrExhausted, len(a.blocks), a.blockSize, a.pool)
}

// IsManaged reports whether every port of r lies inside the pool.
func (a *Allocator) IsManaged(r Range) bool {
	return r.Begin <= r.End && a.pool.ContainsRange(r)
}

// index finds the block equal to r, or explains why r is not a block: the
// error wraps ErrNotManaged (r not inside the pool) or ErrUnaligned.
func (a *Allocator) index(r Range) (int, error) {
	if !a.IsManaged(r) {
		return -1, fmt.Errorf("ephemeral range %s: %w: outside the ephemeral pool %s", r, ErrNotManaged, a.pool)
	}
	if r.Size() != a.blockSize || int(r.Begin)%a.blockSize != 0 {
		return -1, fmt.Errorf("ephemeral range %s: %w: blocks are %d ports starting at a multiple of %d",
			r, ErrUnaligned, a.blockSize, a.blockSize)
	}
	i, found := slices.BinarySearch(a.blocks, r.Begin)
	if !found {
		// Unreachable: every aligned block inside the pool is listed.
		return -1, fmt.Errorf("ephemeral range %s: %w: not a block of ephemeral pool %s", r, ErrNotManaged, a.pool)
	}
	return i, nil
}

// Claim marks block r as allocated; recovery uses it to re-adopt the ranges
// of running containers. It fails, changing nothing, when r lies outside the
// pool (ErrNotManaged), is not exactly one aligned block (ErrUnaligned), or
// is already allocated (ErrTaken).
func (a *Allocator) Claim(r Range) error {
	i, err := a.index(r)
	if err != nil {
		return fmt.Errorf("cannot claim %w", err)
	}
	if a.isUsed(i) {
		return fmt.Errorf("cannot claim ephemeral range %s: %w", r, ErrTaken)
	}
	a.used[i/64] |= 1 << (i % 64)
	a.nUsed.Add(1)
	return nil
}

// Release frees block r. Releasing a block that is not allocated (a double
// release) returns an error wrapping ErrNotAllocated and changes nothing; so
// does releasing a range that is not a block of the pool, whose error also
// wraps ErrNotManaged or ErrUnaligned.
func (a *Allocator) Release(r Range) error {
	i, err := a.index(r)
	if err != nil {
		return fmt.Errorf("cannot release %w (%w)", err, ErrNotAllocated)
	}
	if !a.isUsed(i) {
		return fmt.Errorf("cannot release ephemeral range %s: %w", r, ErrNotAllocated)
	}
	a.used[i/64] &^= 1 << (i % 64)
	a.nUsed.Add(-1)
	return nil
}

// IsAllocated reports whether r is an allocated block.
func (a *Allocator) IsAllocated(r Range) bool {
	i, err := a.index(r)
	return err == nil && a.isUsed(i)
}

// Allocated lists the allocated blocks in ascending order.
func (a *Allocator) Allocated() []Range {
	out := make([]Range, 0, a.Used())
	for i := range a.blocks {
		if a.isUsed(i) {
			out = append(out, a.block(i))
		}
	}
	return out
}
