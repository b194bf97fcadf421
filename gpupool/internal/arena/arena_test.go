package arena

import (
	"errors"
	"math/rand/v2"
	"sort"
	"testing"
	"testing/quick"
)

const align = 256

// check verifies the invariants against a reference: allocations inside the
// arena, aligned, disjoint; free list sorted, disjoint, never adjacent;
// allocated plus free bytes equal the size.
func check(t *testing.T, a *Arena, live map[int64]int64) {
	t.Helper()
	type rng struct{ off, n int64 }
	var all []rng
	var used int64
	for off, n := range live {
		if off%align != 0 || off < 0 || off+a.Round(n) > a.Size() {
			t.Fatalf("allocation [%d,+%d) misaligned or outside %d", off, n, a.Size())
		}
		all = append(all, rng{off, a.Round(n)})
		used += a.Round(n)
	}
	if used != a.Used() {
		t.Fatalf("used %d, reference %d", a.Used(), used)
	}
	var free int64
	fr := a.FreeRanges()
	for i, f := range fr {
		if i > 0 && fr[i-1][0]+fr[i-1][1] >= f[0] {
			t.Fatalf("free ranges %v and %v overlap or touch (not coalesced)", fr[i-1], f)
		}
		all = append(all, rng{f[0], f[1]})
		free += f[1]
	}
	if used+free != a.Size() {
		t.Fatalf("used %d + free %d != size %d", used, free, a.Size())
	}
	sort.Slice(all, func(i, j int) bool { return all[i].off < all[j].off })
	for i := 1; i < len(all); i++ {
		if all[i-1].off+all[i-1].n > all[i].off {
			t.Fatalf("ranges [%d,+%d) and [%d,+%d) overlap", all[i-1].off, all[i-1].n, all[i].off, all[i].n)
		}
	}
}

func TestRandomAllocFree(t *testing.T) {
	r := rand.New(rand.NewPCG(7, uint64(rand.Int64())))
	a := New(1<<20, align)
	live := map[int64]int64{}
	for step := 0; step < 5000; step++ {
		if len(live) > 0 && r.IntN(2) == 0 {
			for off := range live {
				if err := a.Free(off); err != nil {
					t.Fatal(err)
				}
				delete(live, off)
				break
			}
		} else {
			n := 1 + r.Int64N(32<<10)
			off, err := a.Alloc(n)
			if errors.Is(err, ErrNoSpace) {
				if a.Largest() >= a.Round(n) {
					t.Fatalf("no space for %d with a free range of %d", n, a.Largest())
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			live[off] = n
		}
		check(t, a, live)
	}
	for off := range live {
		a.Free(off)
	}
	if fr := a.FreeRanges(); len(fr) != 1 || fr[0] != [2]int64{0, a.Size()} {
		t.Fatalf("after freeing everything the free list is %v", fr)
	}
}

func TestBestFitAndCoalescing(t *testing.T) {
	a := New(10*align, align)
	offs := make([]int64, 10)
	for i := range offs {
		offs[i], _ = a.Alloc(align)
	}
	// Holes of 1, 3 and 2 units.
	a.Free(offs[1])
	a.Free(offs[3])
	a.Free(offs[4])
	a.Free(offs[5])
	a.Free(offs[7])
	a.Free(offs[8])
	off, err := a.Alloc(2 * align)
	if err != nil || off != offs[7] {
		t.Fatalf("best fit for 2 units at %d, want %d (%v)", off, offs[7], err)
	}
	off, _ = a.Alloc(1)
	if off != offs[1] {
		t.Fatalf("best fit for 1 byte at %d, want %d", off, offs[1])
	}
	// Freeing 2 between holes 3..5 and 6 coalesces into one range.
	a.Free(offs[6])
	if fr := a.FreeRanges(); len(fr) != 1 || fr[0] != [2]int64{offs[3], 4 * align} {
		t.Fatalf("free ranges %v", fr)
	}
	if err := a.Free(offs[6]); !errors.Is(err, ErrBadFree) {
		t.Fatalf("double free: %v", err)
	}
	if _, err := a.Alloc(0); !errors.Is(err, ErrBadSize) {
		t.Fatalf("alloc 0: %v", err)
	}
	if _, err := a.Alloc(11 * align); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("alloc too big: %v", err)
	}
}

// TestPropertyAllocFreeAll: for any sequence of sizes, allocating them all
// and freeing in any order leaves one free range of the whole arena, and
// every allocation succeeds while the sum fits.
func TestPropertyAllocFreeAll(t *testing.T) {
	f := func(sizes []uint16, perm uint64) bool {
		a := New(1<<24, align)
		live := map[int64]int64{}
		var offs []int64
		for _, s := range sizes {
			n := int64(s) + 1
			off, err := a.Alloc(n)
			if err != nil {
				return false
			}
			live[off] = n
			offs = append(offs, off)
		}
		check(t, a, live)
		r := rand.New(rand.NewPCG(perm, 1))
		r.Shuffle(len(offs), func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
		for _, off := range offs {
			if a.Free(off) != nil {
				return false
			}
			delete(live, off)
			check(t, a, live)
		}
		fr := a.FreeRanges()
		return len(fr) == 1 && fr[0] == [2]int64{0, a.Size()} && a.Used() == 0
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 200}); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkAllocFree(b *testing.B) {
	a := New(64<<20, align)
	r := rand.New(rand.NewPCG(1, 2))
	var live []int64
	for i := 0; i < b.N; i++ {
		if len(live) > 64 {
			j := r.IntN(len(live))
			a.Free(live[j])
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		if off, err := a.Alloc(1 + r.Int64N(1<<16)); err == nil {
			live = append(live, off)
		}
	}
}
