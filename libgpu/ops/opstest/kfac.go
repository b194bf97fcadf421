package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "kfac", Check: checkKFAC}) }

// RefCov is X̄ᵀX̄ in float64 for the rows of x ([rows, d]), X̄ = [X, 1]
// with bias ([d+1, d+1]), else X ([d, d]).
func RefCov(x []float64, rows, d int, bias bool) []float64 {
	df := d
	if bias {
		df++
	}
	f := make([]float64, df*df)
	at := func(i, j int) float64 {
		if j == d {
			return 1
		}
		return x[i*d+j]
	}
	for i := 0; i < rows; i++ {
		for a := 0; a < df; a++ {
			for b := 0; b < df; b++ {
				f[a*df+b] += at(i, a) * at(i, b)
			}
		}
	}
	return f
}

func checkKFAC(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, bias := range []bool{false, true} {
			s.Run(fmt.Sprintf("factor/%v/bias=%v", dt, bias), func(s *Suite) { kfacFactorCheck(s, dt, bias) })
		}
	}
	s.Run("damping", kfacDampingCheck)
	for _, bias := range []bool{false, true} {
		s.Run(fmt.Sprintf("precond+clip+apply/bias=%v", bias), func(s *Suite) { kfacStepCheck(s, bias) })
	}
	s.Run("validation", kfacValidation)
}

func kfacFactorCheck(s *Suite, dt tensor.DType, bias bool) {
	const rows, d, alpha, beta = 37, 13, 0.125, 0.9
	df := d
	if bias {
		df++
	}
	// X is a column block of a wider tensor (strided rows), as a layer's
	// input inside a fused activation buffer can be.
	wide, wv := s.Rand(dt, 1, rows, d+5)
	x, err := wide.Narrow(1, 2, d)
	s.NoErr("narrow", err)
	xv := make([]float64, 0, rows*d)
	for i := 0; i < rows; i++ {
		xv = append(xv, wv[i*(d+5)+2:i*(d+5)+2+d]...)
	}
	f := s.Empty(tensor.F32, df, df)
	s.NoErr("factor (overwrite)", s.E.KFACFactor(f, x, alpha, 0, bias))
	cov := RefCov(xv, rows, d, bias)
	want := make([]float64, len(cov))
	for i := range cov {
		want[i] = alpha * cov[i]
	}
	tol := s.GemmTol(tensor.F32) // products of exact (widened) operands
	// Terms: |alpha|·|X̄|ᵀ|X̄| (an off-diagonal covariance can cancel).
	terms := Scaled(alpha, RefCov(Abs(xv), rows, d, bias))
	s.Close("F = alpha·X̄ᵀX̄", s.Read(f), want, terms, tol)
	old := s.Read(f)
	s.NoErr("factor (moving average)", s.E.KFACFactor(f, x, alpha, beta, bias))
	for i := range want {
		want[i] = beta*old[i] + alpha*cov[i]
	}
	s.Close("F = beta·F + alpha·X̄ᵀX̄", s.Read(f), want, Sum(Scaled(beta, old), terms), tol)
}

func kfacDampingCheck(s *Suite) {
	const da, dg, lambda = 5, 3, 0.01
	a := s.Const(tensor.F32, RandSPD(s.R, da, 10, 2), da, da)
	g := s.Const(tensor.F32, RandSPD(s.R, dg, 10, 0.01), dg, dg)
	av, gv := s.Read(a), s.Read(g)
	ra, rg := s.Empty(tensor.F32, 1), s.Empty(tensor.F32, 1)
	s.NoErr("damping", s.E.KFACDamping(ra, rg, a, g, lambda))
	var ta, tg float64
	for i := 0; i < da; i++ {
		ta += av[i*da+i]
	}
	for i := 0; i < dg; i++ {
		tg += gv[i*dg+i]
	}
	pi := math.Sqrt((ta / da) / (tg / dg))
	s.Close("ridge A", s.Read(ra), []float64{pi * math.Sqrt(lambda)}, nil, 1e-5)
	s.Close("ridge G", s.Read(rg), []float64{math.Sqrt(lambda) / pi}, nil, 1e-5)
	// A zero factor: π = 1.
	s.NoErr("damping", s.E.KFACDamping(ra, rg, s.Const(tensor.F32, make([]float64, da*da), da, da), g, lambda))
	s.Close("ridge A (zero A)", s.Read(ra), []float64{math.Sqrt(lambda)}, nil, 1e-6)
}

func kfacStepCheck(s *Suite, bias bool) {
	const out, in, lr, mu, wd, kappa = 6, 9, 0.1, 0.9, 0.01, 1e-3
	din := in
	if bias {
		din++
	}
	ginv, giv := s.Rand(tensor.F32, 1, out, out)
	ainv, aiv := s.Rand(tensor.F32, 1, din, din)
	gw, gwv := s.Rand(tensor.F32, 1, out, in)
	var gb *tensor.Tensor
	var gbv []float64
	if bias {
		gb, gbv = s.Rand(tensor.F32, 1, out)
	}
	grad := make([]float64, out*din)
	for i := 0; i < out; i++ {
		copy(grad[i*din:], gwv[i*in:(i+1)*in])
		if bias {
			grad[i*din+in] = gbv[i]
		}
	}
	v := s.Empty(tensor.F32, out, din)
	dots := s.Empty(tensor.F32, 2)
	dot0, err := dots.Narrow(0, 0, 1)
	s.NoErr("narrow", err)
	s.NoErr("precond", s.E.KFACPrecond(v, ginv, gw, gb, ainv, dot0))
	want := RefMatmul(RefMatmul(giv, grad, out, din, out, false, false), aiv, out, din, din, false, false)
	tol := 4 * s.GemmTol(tensor.F32)
	s.Close("V", s.Read(v), want, nil, tol)
	var dot float64
	for i := range want {
		dot += want[i] * grad[i]
	}
	// The dot of V·grad: relative to Σ|V·grad| (cancellation).
	var mag float64
	for i := range want {
		mag += math.Abs(want[i] * grad[i])
	}
	s.Close("dot", s.Read(dots)[:1], []float64{dot}, []float64{mag}, tol)

	// KLClip with a second layer's dot.
	dv := []float64{math.Abs(dot) + 1, 3}
	dots = s.Const(tensor.F32, dv, 2)
	dv = s.Read(dots)
	nu := s.Empty(tensor.F32, 1)
	s.NoErr("kl clip", s.E.KLClip(nu, dots, lr, kappa))
	wantNu := math.Min(1, math.Sqrt(kappa/(lr*lr*(dv[0]+dv[1]))))
	s.Close("nu", s.Read(nu), []float64{wantNu}, nil, 1e-6)
	s.NoErr("kl clip (negative)", s.E.KLClip(nu, s.Const(tensor.F32, []float64{-1, 0.5}, 2), lr, kappa))
	s.Close("nu (sum ≤ 0)", s.Read(nu), []float64{1}, nil, 0)
	nuT := s.Const(tensor.F32, []float64{0.5}, 1)

	// Apply, from the stored V.
	vv := s.Read(v)
	w, wv := s.Rand(tensor.F32, 1, out, in)
	bw, bwv := s.Rand(tensor.F32, 1, out, in)
	var b, bb *tensor.Tensor
	var bv, bbv []float64
	if bias {
		b, bv = s.Rand(tensor.F32, 1, out)
		bb, bbv = s.Rand(tensor.F32, 1, out)
	}
	s.NoErr("apply", s.E.KFACApply(w, b, bw, bb, v, nuT, lr, mu, wd))
	ww, wbw := make([]float64, len(wv)), make([]float64, len(wv))
	wb, wbb := make([]float64, len(bv)), make([]float64, len(bv))
	for i := 0; i < out; i++ {
		for j := 0; j < din; j++ {
			u := 0.5 * vv[i*din+j]
			if j < in {
				o := i*in + j
				wbw[o] = mu*bwv[o] + u + wd*wv[o]
				ww[o] = wv[o] - lr*wbw[o]
			} else {
				wbb[i] = mu*bbv[i] + u
				wb[i] = bv[i] - lr*wbb[i]
			}
		}
	}
	ft := s.Tol(tensor.F32)
	s.Close("W", s.Read(w), ww, nil, ft)
	s.Close("BufW", s.Read(bw), wbw, nil, ft)
	if bias {
		s.Close("B", s.Read(b), wb, nil, ft)
		s.Close("BufB", s.Read(bb), wbb, nil, ft)
	}
}

func kfacValidation(s *Suite) {
	x := s.Empty(tensor.F32, 8, 4)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"factor F shape", s.E.KFACFactor(s.Empty(tensor.F32, 4, 4), x, 1, 0, true), tensor.ErrShape},
		{"factor X rank", s.E.KFACFactor(s.Empty(tensor.F32, 4, 4), s.Empty(tensor.F32, 32), 1, 0, false), tensor.ErrShape},
		{"factor beta", s.E.KFACFactor(s.Empty(tensor.F32, 4, 4), x, 1, -1, false), ops.ErrConfig},
		{"damping λ", s.E.KFACDamping(s.Empty(tensor.F32, 1), s.Empty(tensor.F32, 1), s.Empty(tensor.F32, 2, 2), s.Empty(tensor.F32, 2, 2), -1), ops.ErrConfig},
		{"precond V shape", s.E.KFACPrecond(s.Empty(tensor.F32, 8, 4), s.Empty(tensor.F32, 8, 8), x, s.Empty(tensor.F32, 8), s.Empty(tensor.F32, 5, 5), nil), tensor.ErrShape},
		{"clip κ", s.E.KLClip(s.Empty(tensor.F32, 1), s.Empty(tensor.F32, 2), 1, 0), ops.ErrConfig},
		{"apply μ", s.E.KFACApply(x, nil, x, nil, x, nil, 1, 1, 0), ops.ErrConfig},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			s.T.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
}
