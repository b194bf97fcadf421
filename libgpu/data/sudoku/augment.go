package sudoku

import (
	"math/rand/v2"

	"gpukit/libgpu/data"
)

// Transform is one of Sudoku's validity-preserving symmetries, as
// sapientinc/HRM's dataset/build_sudoku_dataset.py (shuffle_sudoku) draws
// them: a relabelling of the digits 1–9, a permutation of the rows that
// shuffles the three bands and the three rows inside each band, the same
// for the columns (stacks), and an optional transpose. Apply maps a valid
// puzzle and its solution to a valid puzzle and its solution.
type Transform struct {
	Digits    [10]uint8 // Digits[d]: the new digit of d; Digits[0] = 0 (blanks stay blank)
	Rows      [9]uint8  // output row r takes input row Rows[r]
	Cols      [9]uint8  // output column c takes input column Cols[c]
	Transpose bool      // transpose the input first
}

// Identity is the transform that changes nothing.
func Identity() Transform {
	var t Transform
	for i := range t.Digits {
		t.Digits[i] = uint8(i)
	}
	for i := range t.Rows {
		t.Rows[i], t.Cols[i] = uint8(i), uint8(i)
	}
	return t
}

// RandomTransform draws a transform with r as shuffle_sudoku does: a
// uniform permutation of 1–9, a fair coin for the transpose, a uniform
// order of the bands and, for each band in that order, a uniform order of
// its rows; the same for stacks and columns. All 9!·2·6⁸ transforms are
// equally likely.
func RandomTransform(r *rand.Rand) Transform {
	var t Transform
	for i, d := range r.Perm(9) {
		t.Digits[i+1] = uint8(d + 1)
	}
	t.Transpose = r.IntN(2) == 1
	lines := func(dst *[9]uint8) {
		for k, b := range r.Perm(3) {
			for j, x := range r.Perm(3) {
				dst[k*3+j] = uint8(b*3 + x)
			}
		}
	}
	lines(&t.Rows)
	lines(&t.Cols)
	return t
}

// Apply returns g transformed: cell (r, c) of the result holds
// Digits[x[Rows[r]][Cols[c]]], where x is g, or g transposed when
// Transpose is set (the order of build_sudoku_dataset.py).
func (t Transform) Apply(g Grid) Grid {
	var out Grid
	for i := range out {
		sr, sc := int(t.Rows[i/9]), int(t.Cols[i%9])
		if t.Transpose {
			sr, sc = sc, sr
		}
		out[i] = t.Digits[g[sr*9+sc]]
	}
	return out
}

// Augmenter gives each training puzzle a fixed family of NumAug augmented
// copies, as the reference's 1k setting builds its data (1000 puzzles,
// --num-aug 1000: each puzzle and 1000 shuffles of it form one group),
// without storing them: copy k of puzzle i is Transform(i, k), drawn from
// a generator seeded by (Seed, i, k), so a logged seed recomputes any of
// them. Copy 0 is the puzzle itself.
type Augmenter struct {
	Seed   uint64
	NumAug int // augmented copies per puzzle besides the original; 0: no augmentation
}

// Transform is copy k (0 ≤ k ≤ NumAug) of puzzle i: the identity for
// k = 0, else RandomTransform with a PCG generator (math/rand/v2) seeded
// by (data.EpochSeed(Seed, i), k).
func (a Augmenter) Transform(i, k int) Transform {
	if k == 0 {
		return Identity()
	}
	return RandomTransform(rand.New(rand.NewPCG(data.EpochSeed(a.Seed, i), uint64(k))))
}
