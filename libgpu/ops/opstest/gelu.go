package opstest

import (
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "gelu", Check: checkGELU}) }

// RefGELU is GELU in float64 in either form (Hendrycks & Gimpel 2016):
// x·Φ(x) = ½x·erfc(−x/√2), or the tanh approximation
// ½x(1 + tanh u) = x/(1 + e^(−2u)), u = √(2/π)(x + 0.044715x³) — forms
// that keep their digits for negative x, where 1 + tanh and 1 + erf cancel.
func RefGELU(x float64, form ops.GELUForm) float64 {
	if form == ops.GELUTanh {
		const c, a = 0.7978845608028654, 0.044715
		return x / (1 + math.Exp(-2*c*(x+a*x*x*x)))
	}
	return 0.5 * x * math.Erfc(-x/math.Sqrt2)
}

// RefGELUGrad is d/dx of RefGELU: Φ(x) + x·φ(x) for erf; for tanh,
// ½(1+t) + ½x(1−t²)·√(2/π)(1 + 3·0.044715x²) with t = tanh u, written as
// s + 2x·s(1−s)·√(2/π)(1 + 3·0.044715x²), s = σ(2u), s(1−s) = 1/(2+e+1/e),
// e = e^(−2u).
func RefGELUGrad(x float64, form ops.GELUForm) float64 {
	if form == ops.GELUTanh {
		const c, a = 0.7978845608028654, 0.044715
		e := math.Exp(-2 * c * (x + a*x*x*x))
		return 1/(1+e) + 2*x/(2+e+1/e)*c*(1+3*a*x*x)
	}
	return 0.5*math.Erfc(-x/math.Sqrt2) + x*math.Exp(-0.5*x*x)/math.Sqrt(2*math.Pi)
}

func geluMap(v []float64, f func(float64) float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = f(x)
	}
	return out
}

func checkGELU(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, form := range []ops.GELUForm{ops.GELUTanh, ops.GELUErf} {
			// n: below, at and past the vector width, with tails.
			for _, n := range []int{1, 7, 8, 1003, 4096} {
				s.Run(fmt.Sprintf("%v/%v/n=%d", dt, form, n), func(s *Suite) { geluCheck(s, dt, form, n, 0) })
			}
			// A view starting one element in: misaligned, the scalar instance.
			s.Run(fmt.Sprintf("%v/%v/misaligned", dt, form), func(s *Suite) { geluCheck(s, dt, form, 1003, 1) })
			s.Run(fmt.Sprintf("%v/%v/in-place", dt, form), func(s *Suite) { geluInPlace(s, dt, form) })
			s.Run(fmt.Sprintf("%v/%v/grad", dt, form), func(s *Suite) {
				s.GradCheck(GradCase{
					Name: "gelu " + form.String(), DType: dt, Params: [][]int{{3, 11}}, Twice: true, Scale: 2,
					Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.GELU(p[0], form) },
					Ref: func(p [][]float64) []float64 {
						return geluMap(p[0], func(x float64) float64 { return RefGELU(x, form) })
					},
				})
			})
		}
	}
	s.Run("forms-differ", func(s *Suite) {
		// The two forms differ by up to ~1e-3 near |x| = 2: a check that
		// each backend computes the form it is asked for.
		x := s.Const(tensor.F32, []float64{-2, 2}, 2)
		ya, yb := s.Empty(tensor.F32, 2), s.Empty(tensor.F32, 2)
		s.NoErr("gelu", s.E.GELU(ya, x, ops.GELUTanh))
		s.NoErr("gelu", s.E.GELU(yb, x, ops.GELUErf))
		a, b := s.Read(ya), s.Read(yb)
		s.Close("tanh form", a, []float64{RefGELU(-2, ops.GELUTanh), RefGELU(2, ops.GELUTanh)}, nil, 1e-6)
		s.Close("erf form", b, []float64{RefGELU(-2, ops.GELUErf), RefGELU(2, ops.GELUErf)}, nil, 1e-6)
	})
	s.Run("validation", func(s *Suite) {
		x := s.Empty(tensor.F32, 5)
		for _, c := range []struct {
			what string
			err  error
		}{
			{"unknown form", s.E.GELU(x, x, ops.GELUForm(7))},
			{"y of another shape", s.E.GELU(s.Empty(tensor.F32, 6), x, ops.GELUErf)},
			{"y of another dtype", s.E.GELU(s.Empty(tensor.BF16, 5), x, ops.GELUErf)},
			{"i32", s.E.GELU(s.Empty(tensor.I32, 5), s.Empty(tensor.I32, 5), ops.GELUErf)},
			{"backward dy of another shape", s.E.GELUBackward(x, s.Empty(tensor.F32, 4), x, ops.GELUErf, false)},
		} {
			if c.err == nil {
				s.T.Errorf("%s: accepted", c.what)
			}
		}
	})
}

// geluCheck runs forward and backward (written, then accumulated) over n
// elements that start off elements into their buffers.
func geluCheck(s *Suite, dt tensor.DType, form ops.GELUForm, n, off int) {
	view := func(t *tensor.Tensor) *tensor.Tensor {
		v, err := t.Narrow(0, off, n)
		s.NoErr("narrow", err)
		return v
	}
	xw, xwv := s.Rand(dt, 2, n+off)
	x, xv := view(xw), xwv[off:]
	y := view(s.Empty(dt, n+off))
	s.NoErr("gelu", s.E.GELU(y, x, form))
	s.Close("y", s.Read(y), geluMap(xv, func(v float64) float64 { return RefGELU(v, form) }), nil, s.Tol(dt))
	dyw, dywv := s.Rand(dt, 1, n+off)
	dy, dyv := view(dyw), dywv[off:]
	want := make([]float64, n)
	for i := range want {
		want[i] = dyv[i] * RefGELUGrad(xv[i], form)
	}
	dx := view(s.Empty(dt, n+off))
	s.NoErr("gelu backward", s.E.GELUBackward(dx, dy, x, form, false))
	s.Close("dx", s.Read(dx), want, nil, s.Tol(dt))
	dx0w, dx0wv := s.Rand(dt, 1, n+off)
	s.NoErr("gelu backward (acc)", s.E.GELUBackward(view(dx0w), dy, x, form, true))
	s.CloseAcc("dx (acc)", s.Read(view(dx0w)), dx0wv[off:], want, nil, s.Tol(dt))
}

func geluInPlace(s *Suite, dt tensor.DType, form ops.GELUForm) {
	const n = 300
	x, xv := s.Rand(dt, 2, n)
	dy, dyv := s.Rand(dt, 1, n)
	want := make([]float64, n)
	for i := range want {
		want[i] = dyv[i] * RefGELUGrad(xv[i], form)
	}
	s.NoErr("gelu backward in place", s.E.GELUBackward(dy, dy, x, form, false))
	s.Close("dx = dy in place", s.Read(dy), want, nil, s.Tol(dt))
	s.NoErr("gelu in place", s.E.GELU(x, x, form))
	s.Close("y = x in place", s.Read(x), geluMap(xv, func(v float64) float64 { return RefGELU(v, form) }), nil, s.Tol(dt))
}
