package sudoku

import "math/bits"

// Solve searches puzzle's solutions by depth-first backtracking over
// candidate bitmasks, always branching on the blank cell with the fewest
// candidates (the "minimum remaining values" rule; Norvig, "Solving Every
// Sudoku Puzzle", 2006, uses the same). It stops after limit solutions
// (limit < 1 counts as 1) and returns the first solution found and the
// number found, at most limit: Solve(p, 2) tells a unique puzzle (1) from
// one with none (0) or several (2). A puzzle that breaks the rules
// (p.Check() fails) has 0 solutions. It is the ground truth for the
// generator's checks and for tests of trained models.
func Solve(puzzle Grid, limit int) (first Grid, count int) {
	if puzzle.Check() != nil {
		return Grid{}, 0
	}
	s := solver{g: puzzle, limit: max(limit, 1)}
	for i, v := range puzzle {
		if v != 0 {
			s.set(i, v)
		}
	}
	s.search()
	return s.first, s.count
}

// Unique reports whether puzzle has exactly one solution, and returns it.
func Unique(puzzle Grid) (Grid, bool) {
	sol, n := Solve(puzzle, 2)
	return sol, n == 1
}

type solver struct {
	g                 Grid
	rows, cols, boxes [9]uint16 // bit d set: digit d used
	limit, count      int
	first             Grid
}

func (s *solver) set(i int, v uint8) {
	bit := uint16(1) << v
	s.g[i] = v
	s.rows[i/9] |= bit
	s.cols[i%9] |= bit
	s.boxes[box(i)] |= bit
}

func (s *solver) clear(i int) {
	bit := uint16(1) << s.g[i]
	s.g[i] = 0
	s.rows[i/9] &^= bit
	s.cols[i%9] &^= bit
	s.boxes[box(i)] &^= bit
}

// all is the candidate mask of an empty unit: bits 1–9.
const all = uint16(0x3fe)

func (s *solver) search() {
	best, bestMask, bestN := -1, uint16(0), 10
	for i, v := range s.g {
		if v != 0 {
			continue
		}
		m := all &^ (s.rows[i/9] | s.cols[i%9] | s.boxes[box(i)])
		n := bits.OnesCount16(m)
		if n == 0 {
			return
		}
		if n < bestN {
			best, bestMask, bestN = i, m, n
			if n == 1 {
				break
			}
		}
	}
	if best < 0 {
		if s.count == 0 {
			s.first = s.g
		}
		s.count++
		return
	}
	for m := bestMask; m != 0 && s.count < s.limit; m &= m - 1 {
		s.set(best, uint8(bits.TrailingZeros16(m)))
		s.search()
		s.clear(best)
	}
}
