package opstest

import (
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "clipfuse", Check: checkClipFuse}) }

// checkClipFuse: clipping fused into AdamW (Engine.ClipCoef, then AdamW
// with the coefficient as GradScale) gives bitwise the parameters, moments
// and norm of clipping first (ClipGradNorm, then AdamW), for a norm above
// and below the bound.
func checkClipFuse(s *Suite) {
	shapes := [][]int{{37, 11}, {5}, {130}}
	for _, maxNorm := range []float32{0.5, 1e6} {
		var out [2][]float64
		var norms [2]float32
		vals := make([][]float64, len(shapes))
		grads := make([][]float64, len(shapes))
		for i, sh := range shapes {
			_, vals[i] = s.Rand(tensor.F32, 1, sh...)
			_, grads[i] = s.Rand(tensor.F32, 1, sh...)
		}
		for path := 0; path < 2; path++ {
			var ps, gs, ms, vs []*tensor.Tensor
			for i, sh := range shapes {
				ps = append(ps, s.Const(tensor.F32, vals[i], sh...))
				gs = append(gs, s.Const(tensor.F32, grads[i], sh...))
				m, v := s.Empty(tensor.F32, sh...), s.Empty(tensor.F32, sh...)
				s.NoErr("fill", s.E.Fill(m, 0))
				s.NoErr("fill", s.E.Fill(v, 0))
				ms, vs = append(ms, m), append(vs, v)
			}
			step := UploadI32(s.T, s.A, []int32{3}, 1)
			norm := s.Empty(tensor.F32, 1)
			cfg := ops.AdamWConfig{LR: 1e-2, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.1}
			if path == 0 {
				s.NoErr("clip", s.E.ClipGradNorm(gs, maxNorm, norm))
			} else {
				coef := s.Empty(tensor.F32, 1)
				s.NoErr("clip coefficient", s.E.ClipCoef(gs, maxNorm, norm, coef))
				cfg.GradScale = coef
			}
			s.NoErr("adamw", s.E.AdamW(ps, gs, ms, vs, step, cfg))
			for i := range ps {
				out[path] = append(append(append(out[path], s.Read(ps[i])...), s.Read(ms[i])...), s.Read(vs[i])...)
			}
			norms[path] = float32(s.Read(norm)[0])
		}
		if norms[0] != norms[1] {
			s.T.Errorf("max norm %v: norm %v clipping first, %v fused", maxNorm, norms[0], norms[1])
		}
		for i := range out[0] {
			if out[0][i] != out[1][i] {
				s.T.Fatalf("max norm %v: element %d is %v clipping first, %v fused", maxNorm, i, out[0][i], out[1][i])
			}
		}
	}
}
