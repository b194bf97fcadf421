package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "bce", Check: checkBCE}) }

// RefBCE is the float64 reference of ops.Engine.BCEWithLogits, straight
// from the definition −y·log σ(x) − (1 − y)·log(1 − σ(x)) (log σ(x) =
// −log(1 + e^−x), log(1 − σ(x)) = −x − log(1 + e^−x), evaluated stably),
// summed and scaled, and its gradient scale·(σ(x) − y).
func RefBCE(x, y []float64, scale float64) (loss float64, grad []float64) {
	grad = make([]float64, len(x))
	for i := range x {
		// log(1 + e^−x) without overflow for very negative x.
		sp := math.Log1p(math.Exp(-math.Abs(x[i]))) + math.Max(-x[i], 0)
		loss += y[i]*sp + (1-y[i])*(x[i]+sp)
		grad[i] = scale * (1/(1+math.Exp(-x[i])) - y[i])
	}
	return scale * loss, grad
}

// RefBCETerms is the terms' size (TermsErr) of RefBCE's results: the loss
// sums scale·(|max(x,0)| + |x·y| + log1p(e^−|x|)) (softplus and the rest
// taken apart), the gradient scale·(σ(x) − y) sums scale·(σ(x) + |y|).
func RefBCETerms(x, y []float64, scale float64) (loss float64, grad []float64) {
	grad = make([]float64, len(x))
	for i := range x {
		loss += math.Max(x[i], 0) + math.Abs(x[i]*y[i]) + math.Log1p(math.Exp(-math.Abs(x[i])))
		grad[i] = math.Abs(scale) * (1/(1+math.Exp(-x[i])) + math.Abs(y[i]))
	}
	return math.Abs(scale) * loss, grad
}

func checkBCE(s *Suite) {
	for _, xdt := range s.DTypes() {
		for _, ydt := range s.DTypes() {
			for _, n := range []int{1, 2 * 7, 2 * 768, 5000} {
				s.Run(fmt.Sprintf("x=%v,y=%v/n=%d", xdt, ydt, n), func(s *Suite) {
					bceCase(s, xdt, ydt, n, 3, 0.5, false)
					bceCase(s, xdt, ydt, n, 3, 1, true)
				})
			}
		}
		s.Run(fmt.Sprintf("%v/large-logits", xdt), func(s *Suite) { bceCase(s, xdt, tensor.F32, 64, 60, 0.5, false) })
		s.Run(fmt.Sprintf("%v/grad", xdt), func(s *Suite) {
			const B = 5
			y0 := bceTargets(s, tensor.F32, B*2)
			yv := s.Read(y0)
			y, err := y0.View(B, 2)
			s.NoErr("view", err)
			s.LossGradCheck(LossCase{
				Name: "bce", DType: xdt, Params: [][]int{{B, 2}}, Scale: 3, Consts: []*tensor.Tensor{y},
				Record: func(g *ops.Graph, p, c []*ops.Var) []*ops.Var {
					return []*ops.Var{g.BCEWithLogits(p[0], c[0], 0.5)}
				},
				Ref: func(p [][]float64) float64 { l, _ := RefBCE(p[0], yv, 0.5); return l },
			})
		})
	}
	s.Run("validation", bceValidation)
}

// bceTargets: half hard {0, 1} targets (HRM's halt target: the sequence is
// right), half soft in (0, 1) (its continue target, a sigmoid).
func bceTargets(s *Suite, dt tensor.DType, n int) *tensor.Tensor {
	v := make([]float64, n)
	for i := range v {
		if i%2 == 0 {
			v[i] = float64(s.R.IntN(2))
		} else {
			v[i] = s.R.Float64()
		}
	}
	return s.Const(dt, v, n)
}

func bceCase(s *Suite, xdt, ydt tensor.DType, n int, scale float64, lscale float32, acc bool) {
	x, xv := s.Rand(xdt, scale, n)
	y := bceTargets(s, ydt, n)
	yv := s.Read(y)
	loss := s.Empty(tensor.F32, 1)
	var dx *tensor.Tensor
	var old []float64
	if acc {
		dx, old = s.Rand(xdt, 1, n)
	} else {
		dx = s.Empty(xdt, n)
	}
	s.NoErr("bce", s.E.BCEWithLogits(loss, dx, x, y, lscale, acc))
	want, grad := RefBCE(xv, yv, float64(lscale))
	tl, tg := RefBCETerms(xv, yv, float64(lscale))
	s.Close("loss", s.Read(loss), []float64{want}, []float64{tl}, 1e-6)
	if acc {
		grad, tg = lnSum(grad, old), Sum(tg, old)
	}
	s.Close("dx", s.Read(dx), grad, tg, s.Tol(xdt))
	l2 := s.Empty(tensor.F32, 1)
	s.NoErr("bce (loss only)", s.E.BCEWithLogits(l2, nil, x, y, lscale, false))
	s.Close("loss (alone)", s.Read(l2), []float64{want}, []float64{tl}, 1e-6)
	if !acc {
		s.NoErr("bce (dx = x)", s.E.BCEWithLogits(nil, x, x, y, lscale, false))
		s.Close("dx = x", s.Read(x), grad, tg, s.Tol(xdt))
	}
}

func bceValidation(s *Suite) {
	x := s.Empty(tensor.F32, 4, 2)
	y := s.Empty(tensor.F32, 4, 2)
	loss := s.Empty(tensor.F32, 1)
	col, err := x.Narrow(1, 0, 1)
	s.NoErr("narrow", err)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"target of another shape", s.E.BCEWithLogits(loss, nil, x, s.Empty(tensor.F32, 8), 1, false), tensor.ErrShape},
		{"dx of another dtype", s.E.BCEWithLogits(loss, s.Empty(tensor.BF16, 4, 2), x, y, 1, false), tensor.ErrDType},
		{"i32 x", s.E.BCEWithLogits(loss, nil, s.Empty(tensor.I32, 4, 2), y, 1, false), tensor.ErrDType},
		{"loss of two", s.E.BCEWithLogits(s.Empty(tensor.F32, 2), nil, x, y, 1, false), tensor.ErrShape},
		{"strided x", s.E.BCEWithLogits(loss, nil, col, s.Empty(tensor.F32, 4, 1), 1, false), tensor.ErrLayout},
		{"infinite scale", s.E.BCEWithLogits(loss, nil, x, y, float32(math.Inf(1)), false), ops.ErrConfig},
		{"missing target", s.E.BCEWithLogits(loss, nil, x, nil, 1, false), tensor.ErrShape},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			s.T.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if !math.IsNaN(s.Read(loss)[0]) {
		s.T.Error("a rejected call wrote the loss")
	}
}
