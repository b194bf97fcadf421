package opstest

import (
	"fmt"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "silu", Check: checkSiLU}) }

// RefSiLU is x·σ(x); RefSiLUGrad its derivative σ(x)(1 + x(1 − σ(x))).
func RefSiLU(x float64) float64     { return x * sigmoid(x) }
func RefSiLUGrad(x float64) float64 { s := sigmoid(x); return s * (1 + x*(1-s)) }

func checkSiLU(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, n := range []int{1, 7, 8, 1003} {
			for _, off := range []int{0, 1} {
				s.Run(fmt.Sprintf("%v/n=%d/off=%d", dt, n, off), func(s *Suite) {
					view := func(t *tensor.Tensor) *tensor.Tensor {
						v, err := t.Narrow(0, off, n)
						s.NoErr("narrow", err)
						return v
					}
					xw, xwv := s.Rand(dt, 4, n+off)
					x, xv := view(xw), xwv[off:]
					y := view(s.Empty(dt, n+off))
					s.NoErr("silu", s.E.SiLU(y, x))
					s.Close("y", s.Read(y), geluMap(xv, RefSiLU), nil, s.Tol(dt))
					dyw, dywv := s.Rand(dt, 1, n+off)
					want := make([]float64, n)
					for i := range want {
						want[i] = dywv[off+i] * RefSiLUGrad(xv[i])
					}
					dx := view(s.Empty(dt, n+off))
					s.NoErr("silu backward", s.E.SiLUBackward(dx, view(dyw), x, false))
					s.Close("dx", s.Read(dx), want, nil, s.Tol(dt))
					dx0w, dx0wv := s.Rand(dt, 1, n+off)
					s.NoErr("silu backward (acc)", s.E.SiLUBackward(view(dx0w), view(dyw), x, true))
					s.CloseAcc("dx (acc)", s.Read(view(dx0w)), dx0wv[off:], want, nil, s.Tol(dt))
				})
			}
		}
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) {
			s.GradCheck(GradCase{
				Name: "silu", DType: dt, Params: [][]int{{3, 11}}, Twice: true, Scale: 3,
				Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.SiLU(p[0]) },
				Ref:    func(p [][]float64) []float64 { return geluMap(p[0], RefSiLU) },
			})
		})
	}
	s.Run("large-negative", func(s *Suite) {
		x := s.Const(tensor.F32, []float64{-100, -30, 30, 100}, 4)
		y := s.Empty(tensor.F32, 4)
		s.NoErr("silu", s.E.SiLU(y, x))
		got := s.Read(y)
		for i, w := range []float64{RefSiLU(-100), RefSiLU(-30), 30, 100} {
			if d := got[i] - w; d > 1e-6*max(1, w) || d < -1e-6*max(1, w) {
				s.T.Errorf("silu(%v) = %v, want %v", []float64{-100, -30, 30, 100}[i], got[i], w)
			}
		}
	})
	s.Run("validation", func(s *Suite) {
		x := s.Empty(tensor.F32, 5)
		if s.E.SiLU(s.Empty(tensor.F32, 6), x) == nil || s.E.SiLU(s.Empty(tensor.BF16, 5), x) == nil ||
			s.E.SiLUBackward(x, s.Empty(tensor.F32, 4), x, false) == nil || s.E.SiLU(s.Empty(tensor.I32, 5), s.Empty(tensor.I32, 5)) == nil {
			s.T.Error("a bad shape or dtype was accepted")
		}
	})
}
