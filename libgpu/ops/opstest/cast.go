package opstest

import (
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "cast", Check: checkCast}) }

// castSizes reach every path of the multi-tensor kernel: empty, shorter
// than a vector, vector tails, exactly one block's chunk (4096), one past
// it, and several chunks.
var castSizes = []int{0, 1, 7, 8, 13, 4095, 4096, 4097, 10000, 3 * 4096}

func checkCast(s *Suite) {
	s.Run("one", func(s *Suite) {
		for _, n := range []int{1, 1000, 4097} {
			castPair(s, n, 0, func(d, x *tensor.Tensor) error { return s.E.Cast(d, x) })
		}
	})
	s.Run("multi", func(s *Suite) {
		// 140 tensors: two launches on CUDA (128 per launch); sizes cycle
		// through castSizes; every fifth is a misaligned view (starting one
		// element into its buffer: the kernel's element-by-element path).
		var dst, src []*tensor.Tensor
		var want [][]float64
		for i := 0; i < 140; i++ {
			n, off := castSizes[i%len(castSizes)], 0
			if i%5 == 4 {
				off = 1
			}
			x, xv := castSrc(s, n, off)
			dst = append(dst, castView(s, s.Empty(tensor.BF16, n+off), off, n))
			src = append(src, x)
			var w []float64
			if n > 0 {
				w = s.Read(s.Const(tensor.BF16, xv, n))
			}
			want = append(want, w)
		}
		s.NoErr("casts", s.E.Casts(dst, src))
		for i := range dst {
			s.Close(fmt.Sprintf("tensor %d (%d elements)", i, dst[i].Numel()), s.Read(dst[i]), want[i], nil, 0)
		}
	})
	s.Run("mixed", func(s *Suite) {
		// bf16 → f32 (exact) and f32 → f32 (a copy) beside f32 → bf16.
		x, xv := castSrc(s, 300, 0)
		h := s.Const(tensor.BF16, xv, 300)
		hv := s.Read(h)
		d1, d2, d3 := s.Empty(tensor.BF16, 300), s.Empty(tensor.F32, 300), s.Empty(tensor.F32, 300)
		s.NoErr("casts", s.E.Casts([]*tensor.Tensor{d1, d2, d3}, []*tensor.Tensor{x, h, x}))
		s.Close("f32 → bf16", s.Read(d1), hv, nil, 0)
		s.Close("bf16 → f32", s.Read(d2), hv, nil, 0)
		s.Close("f32 → f32", s.Read(d3), xv, nil, 0)
	})
	s.Run("validation", func(s *Suite) {
		x := s.Empty(tensor.F32, 4, 6)
		d := s.Empty(tensor.BF16, 4, 6)
		tr, _ := s.Empty(tensor.F32, 6, 4).Permute(1, 0)
		for _, c := range []struct {
			what string
			err  error
		}{
			{"lengths differ", s.E.Casts([]*tensor.Tensor{d}, nil)},
			{"shapes differ", s.E.Casts([]*tensor.Tensor{s.Empty(tensor.BF16, 4, 5)}, []*tensor.Tensor{x})},
			{"strided source", s.E.Casts([]*tensor.Tensor{d}, []*tensor.Tensor{tr})},
			{"i32", s.E.Casts([]*tensor.Tensor{s.Empty(tensor.I32, 4, 6)}, []*tensor.Tensor{x})},
			{"missing", s.E.Casts([]*tensor.Tensor{d, d}, []*tensor.Tensor{x, nil})},
		} {
			if c.err == nil {
				s.T.Errorf("%s: accepted", c.what)
			}
		}
	})
	s.Run("graph", castGraph)
}

// castSrc is an f32 [n] tensor starting off elements into its buffer, and
// its values: random draws, every third one made a tie for bf16 rounding
// (low 16 bits 0x8000, so round-to-even must look at bit 16).
func castSrc(s *Suite, n, off int) (*tensor.Tensor, []float64) {
	v := make([]float32, n+off)
	for i := range v {
		v[i] = float32(3 * s.R.NormFloat64())
		if i%3 == 0 {
			v[i] = math.Float32frombits(math.Float32bits(v[i])&0xffff0000 | 0x8000)
		}
	}
	w := s.Empty(tensor.F32, n+off)
	s.NoErr("write", w.WriteFloat32(v))
	return castView(s, w, off, n), F64(v[off:])
}

func castView(s *Suite, t *tensor.Tensor, off, n int) *tensor.Tensor {
	v, err := t.Narrow(0, off, n)
	s.NoErr("narrow", err)
	return v
}

func castPair(s *Suite, n, off int, cast func(d, x *tensor.Tensor) error) {
	x, xv := castSrc(s, n, off)
	d := s.Empty(tensor.BF16, n)
	s.NoErr("cast", cast(d, x))
	s.Close(fmt.Sprintf("cast of %d", n), s.Read(d), s.Read(s.Const(tensor.BF16, xv, n)), nil, 0)
}

// castGraph: under bf16 autocast, the casts of params (leaves) are made
// by one node recorded at the first cast, those of computed values by
// nodes of their own after their producers, and every Linear reads the
// right copy: the outputs equal those of the same products on
// pre-rounded operands.
func castGraph(s *Suite) {
	const m, k, n = 5, 12, 7
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Autocast: tensor.BF16})
	defer g.Free()
	xt, xv := s.Rand(tensor.F32, 1, m, k)
	w1t, w1v := s.Rand(tensor.F32, 1, k, k)
	w2t, w2v := s.Rand(tensor.F32, 1, n, k)
	x := g.Input("x", xt)
	w1 := g.Param("w1", w1t, s.Empty(tensor.F32, k, k))
	w2 := g.Param("w2", w2t, s.Empty(tensor.F32, n, k))
	h := g.Linear(x, w1, nil, ops.ActNone)  // casts x and w1: one node
	hf := g.Cast(h, tensor.F32)             // computed: a node of its own
	y := g.Linear(hf, w2, nil, ops.ActNone) // casts hf (computed) and w2 (batched)
	y2 := g.Linear(x, w2, nil, ops.ActNone) // reuses both copies
	if g.Err() != nil || y == nil || y2 == nil {
		s.T.Fatalf("record: %v", g.Err())
	}
	// linear, cast(h → f32), cast(hf → bf16), linear, linear, and one
	// node for the casts of x, w1 and w2.
	if got := g.Tape().Len(); got != 6 {
		s.T.Errorf("tape has %d nodes, want 6", got)
	}
	s.NoErr("build", g.Build(false))
	s.NoErr("forward", g.Forward())
	r := func(v []float64) []float64 { return s.Read(s.Const(tensor.BF16, v, len(v))) }
	mm := func(a, b []float64, rows, inner, cols int) []float64 {
		out := make([]float64, rows*cols)
		for i := 0; i < rows; i++ {
			for j := 0; j < cols; j++ {
				var acc float64
				for l := 0; l < inner; l++ {
					acc += a[i*inner+l] * b[j*inner+l]
				}
				out[i*cols+j] = acc
			}
		}
		return out
	}
	hRef := r(mm(r(xv), r(w1v), m, k, k))
	s.Close("h", s.Read(h.Value), hRef, nil, 1e-2)
	s.Close("y", s.Read(y.Value), mm(r(s.Read(h.Value)), r(w2v), m, k, n), nil, 1e-2)
	s.Close("y2", s.Read(y2.Value), mm(r(xv), r(w2v), m, k, n), nil, 1e-2)
}
