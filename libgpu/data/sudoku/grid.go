package sudoku

import (
	"errors"
	"fmt"
)

// Cells is the number of cells of a 9×9 Sudoku grid, stored row-major
// (cell i is row i/9, column i%9; box (i/27)*3 + (i%9)/3).
const Cells = 81

// Grid is one 9×9 grid, row-major: 0 for a blank cell, 1–9 for a digit.
type Grid [Cells]uint8

// ErrFormat reports a grid, file or CSV row that is not in the documented
// format (see the package documentation).
var ErrFormat = errors.New("sudoku: bad format")

// ParseGrid reads an 81-character grid: '1'–'9' for digits, '.' or '0'
// for blanks (qqwing's one-line form and the Sudoku-Extreme CSV's).
func ParseGrid(s string) (Grid, error) {
	var g Grid
	if len(s) != Cells {
		return g, fmt.Errorf("%w: grid of %d characters, want %d", ErrFormat, len(s), Cells)
	}
	for i := 0; i < Cells; i++ {
		switch c := s[i]; {
		case c == '.' || c == '0':
		case c >= '1' && c <= '9':
			g[i] = c - '0'
		default:
			return g, fmt.Errorf("%w: grid character %d is %q, want 1-9, '.' or '0'", ErrFormat, i, c)
		}
	}
	return g, nil
}

// String is the grid in 81 characters, '.' for blanks.
func (g Grid) String() string {
	b := make([]byte, Cells)
	for i, v := range g {
		if v == 0 {
			b[i] = '.'
		} else {
			b[i] = '0' + v
		}
	}
	return string(b)
}

// Givens is the number of non-blank cells.
func (g Grid) Givens() int {
	n := 0
	for _, v := range g {
		if v != 0 {
			n++
		}
	}
	return n
}

// box is the 3×3 box of cell i (0–8, row-major over boxes).
func box(i int) int { return (i/27)*3 + (i%9)/3 }

// Check reports the first broken rule of a partial grid: a value above 9,
// or a digit twice in a row, a column or a box (blanks are allowed).
func (g Grid) Check() error {
	var rows, cols, boxes [9]uint16
	for i, v := range g {
		if v == 0 {
			continue
		}
		if v > 9 {
			return fmt.Errorf("%w: cell %d holds %d", ErrInvalid, i, v)
		}
		bit := uint16(1) << v
		r, c, b := i/9, i%9, box(i)
		if rows[r]&bit != 0 || cols[c]&bit != 0 || boxes[b]&bit != 0 {
			return fmt.Errorf("%w: digit %d repeats at row %d, column %d", ErrInvalid, v, r+1, c+1)
		}
		rows[r] |= bit
		cols[c] |= bit
		boxes[b] |= bit
	}
	return nil
}

// ErrInvalid reports a grid that breaks Sudoku's rules, or a solution that
// does not solve its puzzle.
var ErrInvalid = errors.New("sudoku: invalid grid")

// CheckSolution reports whether sol is a complete valid grid (every row,
// column and box holds 1–9 once) that keeps every given of puzzle.
func CheckSolution(puzzle, sol Grid) error {
	if n := sol.Givens(); n != Cells {
		return fmt.Errorf("%w: solution has %d blank cells", ErrInvalid, Cells-n)
	}
	if err := sol.Check(); err != nil {
		return fmt.Errorf("solution: %w", err)
	}
	for i, v := range puzzle {
		if v != 0 && v != sol[i] {
			return fmt.Errorf("%w: solution has %d at cell %d where the puzzle gives %d", ErrInvalid, sol[i], i, v)
		}
	}
	return nil
}
