package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "clipsplit", Check: checkClipSplit}) }

// checkClipSplit: the global gradient norm of gradients split across
// ranks (ZeRO-1): each "rank" (a group of the tensors) computes its sum of
// squares with Engine.SumSquares, the sums are added as an all-reduce
// would (in f32, rank order, on the host here), and
// Engine.ClipCoefFromSumSquares gives the norm and the coefficient — against
// ClipGradNormRef over all tensors in float64 (relative 1e-6), and within
// 1e-6 of Engine.ClipCoef over the whole list. Tensors span several
// 2048-element blocks and more than one 32-tensor launch; a rank may hold
// nothing (sum 0). Outputs are poisoned first. Then the validation errors.
func checkClipSplit(s *Suite) {
	sizes := []int{1, 2047, 2048, 2049, 7000}
	for len(sizes) < 40 {
		sizes = append(sizes, 1+s.R.IntN(3000))
	}
	gs := make([]*tensor.Tensor, len(sizes))
	vals := make([][]float64, len(sizes))
	for i, n := range sizes {
		gs[i], vals[i] = s.Rand(tensor.F32, 1, n)
	}
	n0 := ClipGradNormRef(clone2(vals), 1)
	for _, ranks := range []int{1, 2, 3, 5} {
		for _, ratio := range []float64{0.5, 2} {
			what := fmt.Sprintf("%d ranks, max norm %.2g×norm", ranks, ratio)
			maxNorm := float32(ratio * n0)
			total := float32(0)
			for r := range ranks + 1 { // the last "rank" holds nothing
				var part []*tensor.Tensor
				for i := r; i < len(gs) && r < ranks; i += ranks {
					part = append(part, gs[i])
				}
				ss := s.Empty(tensor.F32, 1)
				s.NoErr("sum of squares", s.E.SumSquares(part, ss))
				got := s.Read(ss)[0]
				want := 0.0
				for _, g := range part {
					for _, v := range s.Read(g) {
						want += v * v
					}
				}
				if math.Abs(got-want) > 1e-6*want || (want == 0 && got != 0) {
					s.T.Errorf("%s: rank %d's sum of squares %v, want %v", what, r, got, want)
				}
				total += float32(got)
			}
			sumsq := s.Const(tensor.F32, []float64{float64(total)}, 1)
			norm, coef := s.Empty(tensor.F32, 1), s.Empty(tensor.F32, 1)
			s.NoErr("clip from sum of squares", s.E.ClipCoefFromSumSquares(sumsq, maxNorm, norm, coef))
			want := clone2(vals)
			wantNorm := ClipGradNormRef(want, float64(maxNorm))
			wantCoef := math.Min(float64(maxNorm)/(wantNorm+ops.ClipEps), 1)
			gotNorm, gotCoef := s.Read(norm)[0], s.Read(coef)[0]
			if math.Abs(gotNorm-wantNorm) > 1e-6*wantNorm || math.Abs(gotCoef-wantCoef) > 1e-6*wantCoef {
				s.T.Errorf("%s: norm %v coef %v, want %v and %v", what, gotNorm, gotCoef, wantNorm, wantCoef)
			}
			whole, wcoef := s.Empty(tensor.F32, 1), s.Empty(tensor.F32, 1)
			s.NoErr("clip coefficient", s.E.ClipCoef(gs, maxNorm, whole, wcoef))
			if w := s.Read(whole)[0]; math.Abs(gotNorm-w) > 1e-6*w {
				s.T.Errorf("%s: norm %v, ClipCoef's %v", what, gotNorm, w)
			}
		}
	}
	// A NaN gradient gives a NaN norm and coefficient.
	nanSum := s.Const(tensor.F32, []float64{math.NaN()}, 1)
	norm, coef := s.Empty(tensor.F32, 1), s.Empty(tensor.F32, 1)
	s.NoErr("clip from NaN", s.E.ClipCoefFromSumSquares(nanSum, 1, norm, coef))
	if n, c := s.Read(norm)[0], s.Read(coef)[0]; !math.IsNaN(n) || !math.IsNaN(c) {
		s.T.Errorf("NaN sum of squares: norm %v coef %v, want NaN", n, c)
	}
	// Validation.
	one := s.Empty(tensor.F32, 1)
	two := s.Empty(tensor.F32, 2)
	i32 := s.Empty(tensor.I32, 1)
	for _, c := range []struct {
		what string
		err  error
		got  error
	}{
		{"nil grad", tensor.ErrShape, s.E.SumSquares([]*tensor.Tensor{gs[0], nil}, one)},
		{"i32 grad", tensor.ErrDType, s.E.SumSquares([]*tensor.Tensor{i32}, one)},
		{"nil sum", tensor.ErrShape, s.E.SumSquares(gs, nil)},
		{"sum of 2", tensor.ErrShape, s.E.SumSquares(gs, two)},
		{"zero max norm", ops.ErrConfig, s.E.ClipCoefFromSumSquares(one, 0, one, one)},
		{"infinite max norm", ops.ErrConfig, s.E.ClipCoefFromSumSquares(one, float32(math.Inf(1)), one, one)},
		{"nil coef", tensor.ErrShape, s.E.ClipCoefFromSumSquares(one, 1, one, nil)},
		{"i32 norm", tensor.ErrDType, s.E.ClipCoefFromSumSquares(one, 1, i32, one)},
	} {
		if !errors.Is(c.got, c.err) {
			s.T.Errorf("%s: error %v, want %v", c.what, c.got, c.err)
		}
	}
}

// clone2 is a deep copy of vs.
func clone2(vs [][]float64) [][]float64 {
	out := make([][]float64, len(vs))
	for i, v := range vs {
		out[i] = append([]float64(nil), v...)
	}
	return out
}
