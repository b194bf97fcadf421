package sudoku

import (
	"slices"
)

// Fingerprint is a 64-bit invariant of a puzzle and its solution under
// every Transform: a puzzle and any of its augmented copies have the same
// fingerprint, so the split and the generator's deduplication, which keep
// one puzzle per fingerprint, never put a puzzle in the training set and
// a relabelled, shuffled or transposed copy of it in the test set.
//
// It is the colour refinement (1-dimensional Weisfeiler–Leman; Shervashidze
// et al., "Weisfeiler-Lehman Graph Kernels", JMLR 2011) of the grid's
// incidence graph: a node per cell (coloured given or blank), per row and
// column (one colour), per box, per band and stack (one colour) and per
// digit; edges cell–row, cell–column, cell–box, cell–its solution's digit,
// row–band, column–stack, box–band and box–stack. Transforms are
// isomorphisms of this graph (a transpose swaps rows with columns and bands
// with stacks, which share colours), so the multiset of refined colours is
// invariant. Refinement may give two inequivalent puzzles the same
// fingerprint (it does not decide isomorphism): deduplication by it is
// conservative, dropping at worst a puzzle that was not a copy.
func Fingerprint(puzzle, solution Grid) uint64 {
	const (
		rows   = Cells
		cols   = rows + 9
		boxes  = cols + 9
		chutes = boxes + 9 // 3 bands, then 3 stacks
		digits = chutes + 6
		nodes  = digits + 9
	)
	var adj [nodes][]int
	link := func(a, b int) {
		adj[a] = append(adj[a], b)
		adj[b] = append(adj[b], a)
	}
	for i := 0; i < Cells; i++ {
		link(i, rows+i/9)
		link(i, cols+i%9)
		link(i, boxes+box(i))
		link(i, digits+int(solution[i])-1)
	}
	for k := 0; k < 9; k++ {
		link(rows+k, chutes+k/3)
		link(cols+k, chutes+3+k/3)
		link(boxes+k, chutes+k/3)
		link(boxes+k, chutes+3+k%3)
	}
	var color, next [nodes]uint64
	for v := range color {
		switch {
		case v < rows:
			color[v] = 1
			if puzzle[v] != 0 {
				color[v] = 2
			}
		case v < boxes:
			color[v] = 3
		case v < chutes:
			color[v] = 4
		case v < digits:
			color[v] = 5
		default:
			color[v] = 6
		}
	}
	classes := func(c *[nodes]uint64) int {
		s := slices.Clone(c[:])
		slices.Sort(s)
		return len(slices.Compact(s))
	}
	buf := make([]uint64, 0, 16)
	for n := classes(&color); ; {
		for v := range next {
			buf = buf[:0]
			for _, u := range adj[v] {
				buf = append(buf, color[u])
			}
			slices.Sort(buf)
			h := mix(color[v])
			for _, x := range buf {
				h = mix(h ^ x)
			}
			next[v] = h
		}
		color = next
		m := classes(&color)
		if m == n {
			break
		}
		n = m
	}
	all := color[:]
	slices.Sort(all)
	h := mix(nodes)
	for _, x := range all {
		h = mix(h ^ x)
	}
	return h
}

// mix is SplitMix64's finaliser (Steele, Lea & Flood 2014).
func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
