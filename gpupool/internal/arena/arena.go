package arena

import (
	"errors"
	"fmt"
	"sort"
)

// Errors of Alloc and Free.
var (
	ErrNoSpace = errors.New("arena: no free range large enough")
	ErrBadSize = errors.New("arena: size must be positive")
	ErrBadFree = errors.New("arena: free of a range that is not allocated")
)

type extent struct{ off, n int64 }

// Arena hands out aligned byte ranges of [0, Size). Not safe for concurrent
// use; gpupool holds its lock around it.
type Arena struct {
	size, align int64
	free        []extent        // sorted by off, never adjacent (coalesced)
	used        map[int64]int64 // off -> length of each allocation
	usedBytes   int64
}

// New returns an empty arena of size bytes (rounded down to align) whose
// allocations are aligned to align bytes (a power of two).
func New(size, align int64) *Arena {
	if align <= 0 || align&(align-1) != 0 {
		align = 1
	}
	size = size / align * align
	a := &Arena{size: size, align: align, used: map[int64]int64{}}
	if size > 0 {
		a.free = []extent{{0, size}}
	}
	return a
}

// Size is the arena's length in bytes.
func (a *Arena) Size() int64 { return a.size }

// Used is the number of bytes allocated (aligned lengths).
func (a *Arena) Used() int64 { return a.usedBytes }

// Len is the number of live allocations.
func (a *Arena) Len() int { return len(a.used) }

// Round returns n rounded up to the alignment: the bytes Alloc(n) takes.
func (a *Arena) Round(n int64) int64 { return (n + a.align - 1) / a.align * a.align }

// Fit returns the length of the free range Alloc(n) would use, and false
// when none is large enough. gpupool uses it to pick the best slab.
func (a *Arena) Fit(n int64) (int64, bool) {
	i := a.best(a.Round(n))
	if i < 0 {
		return 0, false
	}
	return a.free[i].n, true
}

func (a *Arena) best(n int64) int {
	bi := -1
	for i, e := range a.free {
		if e.n >= n && (bi < 0 || e.n < a.free[bi].n) {
			bi = i
		}
	}
	return bi
}

// Alloc takes n bytes (rounded up to the alignment) from the smallest free
// range that holds them (lowest offset on ties) and returns their offset.
func (a *Arena) Alloc(n int64) (int64, error) {
	if n <= 0 {
		return 0, fmt.Errorf("%w: %d", ErrBadSize, n)
	}
	if n > a.size {
		return 0, fmt.Errorf("%w: %d bytes in an arena of %d", ErrNoSpace, n, a.size)
	}
	n = a.Round(n)
	i := a.best(n)
	if i < 0 {
		return 0, fmt.Errorf("%w: %d bytes", ErrNoSpace, n)
	}
	off := a.free[i].off
	if a.free[i].n == n {
		a.free = append(a.free[:i], a.free[i+1:]...)
	} else {
		a.free[i].off += n
		a.free[i].n -= n
	}
	a.used[off] = n
	a.usedBytes += n
	return off, nil
}

// Free returns the allocation at off, merging it with free neighbours.
func (a *Arena) Free(off int64) error {
	n, ok := a.used[off]
	if !ok {
		return fmt.Errorf("%w: offset %d", ErrBadFree, off)
	}
	delete(a.used, off)
	a.usedBytes -= n
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	mergeLeft := i > 0 && a.free[i-1].off+a.free[i-1].n == off
	mergeRight := i < len(a.free) && off+n == a.free[i].off
	switch {
	case mergeLeft && mergeRight:
		a.free[i-1].n += n + a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	case mergeLeft:
		a.free[i-1].n += n
	case mergeRight:
		a.free[i].off = off
		a.free[i].n += n
	default:
		a.free = append(a.free, extent{})
		copy(a.free[i+1:], a.free[i:])
		a.free[i] = extent{off, n}
	}
	return nil
}

// FreeRanges returns the free list as (offset, length) pairs, sorted by
// offset: a copy, for tests and reports.
func (a *Arena) FreeRanges() [][2]int64 {
	out := make([][2]int64, len(a.free))
	for i, e := range a.free {
		out[i] = [2]int64{e.off, e.n}
	}
	return out
}

// Largest is the length of the largest free range.
func (a *Arena) Largest() int64 {
	var m int64
	for _, e := range a.free {
		m = max(m, e.n)
	}
	return m
}
