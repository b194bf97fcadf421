package sudoku

import (
	"errors"
	"fmt"
	"strconv"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/tensor"
)

// Format is the value of the "format" metadata key of a set file.
const Format = "gpukit-sudoku/1"

// Set is puzzles and their solutions in memory: Inputs[i] is puzzle i
// (0 blank, 1–9 given), Labels[i] its solution (1–9 everywhere). Meta is
// the file's string metadata (see the package documentation).
type Set struct {
	Inputs, Labels []Grid
	Meta           map[string]string
}

// Len is the number of puzzles.
func (s *Set) Len() int { return len(s.Inputs) }

// Check checks that inputs and labels pair up and that every label is a
// valid solution of its input (CheckSolution), naming the first bad row.
// It does not check uniqueness (Solve does: slow for millions of rows).
func (s *Set) Check() error {
	if len(s.Inputs) != len(s.Labels) {
		return fmt.Errorf("%w: %d inputs, %d labels", ErrFormat, len(s.Inputs), len(s.Labels))
	}
	for i := range s.Inputs {
		if err := s.Inputs[i].Check(); err != nil {
			return fmt.Errorf("puzzle %d: %w", i, err)
		}
		if err := CheckSolution(s.Inputs[i], s.Labels[i]); err != nil {
			return fmt.Errorf("puzzle %d: %w", i, err)
		}
	}
	return nil
}

// Save writes s to path as a safetensors file (the package documentation
// gives the layout) with s.Meta plus "format" and "count", atomically
// (ckpt.WriteFile).
func Save(path string, s *Set) error {
	if err := s.Check(); err != nil {
		return err
	}
	n := s.Len()
	in := make([]byte, 0, n*Cells)
	lab := make([]byte, 0, n*Cells)
	for i := range s.Inputs {
		in = append(in, s.Inputs[i][:]...)
		lab = append(lab, s.Labels[i][:]...)
	}
	meta := map[string]string{}
	for k, v := range s.Meta {
		meta[k] = v
	}
	meta["format"] = Format
	meta["count"] = strconv.Itoa(n)
	return ckpt.WriteFile(path, []ckpt.Entry{
		{Name: "inputs", DType: tensor.U8, Shape: []int{n, Cells}, Data: in},
		{Name: "labels", DType: tensor.U8, Shape: []int{n, Cells}, Data: lab},
	}, meta)
}

// Load reads a set file written by Save (or by anything that follows the
// layout) and checks it: the format key, both tensors U8 [N, 81], the
// count, and every label a valid solution of its input (Set.Check).
func Load(path string) (*Set, error) {
	f, err := ckpt.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := fromFile(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func fromFile(f *ckpt.File) (*Set, error) {
	if got := f.Metadata["format"]; got != Format {
		return nil, fmt.Errorf("%w: metadata format %q, want %q", ErrFormat, got, Format)
	}
	grids := func(name string) ([]Grid, error) {
		info, b, err := f.Bytes(name)
		if err != nil {
			return nil, err
		}
		if info.DType != tensor.U8 || len(info.Shape) != 2 || info.Shape[1] != Cells {
			return nil, fmt.Errorf("%w: %s is %v %v, want U8 [N, %d]", ErrFormat, name, info.DType, info.Shape, Cells)
		}
		g := make([]Grid, info.Shape[0])
		for i := range g {
			copy(g[i][:], b[i*Cells:])
		}
		return g, nil
	}
	in, err := grids("inputs")
	if err != nil {
		return nil, err
	}
	lab, err := grids("labels")
	if err != nil {
		return nil, err
	}
	s := &Set{Inputs: in, Labels: lab, Meta: f.Metadata}
	if c := s.Meta["count"]; c != strconv.Itoa(len(in)) {
		return nil, fmt.Errorf("%w: metadata count %q, file holds %d puzzles", ErrFormat, c, len(in))
	}
	return s, s.Check()
}

// Disjoint checks that no puzzle of a has the Fingerprint of a puzzle of
// b: no puzzle of one set is a Transform of a puzzle of the other.
func Disjoint(a, b *Set) error {
	seen := make(map[uint64]int, a.Len())
	for i := range a.Inputs {
		seen[Fingerprint(a.Inputs[i], a.Labels[i])] = i
	}
	for j := range b.Inputs {
		if i, ok := seen[Fingerprint(b.Inputs[j], b.Labels[j])]; ok {
			return fmt.Errorf("%w: puzzle %d of one set and puzzle %d of the other are copies up to a transform (%s, %s)",
				ErrOverlap, i, j, a.Inputs[i], b.Inputs[j])
		}
	}
	return nil
}

// ErrOverlap reports a training and a test set that share a puzzle.
var ErrOverlap = errors.New("sudoku: train and test sets overlap")
