package opstest

import (
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/mat"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "newtonschulz", Check: checkNewtonSchulz}) }

// RefNewtonSchulz runs steps of X ← aX + (b·XXᵀ + c·(XXᵀ)²)·X on each r×c
// matrix of x (batch of them) in float64 (Jordan et al. 2024).
func RefNewtonSchulz(x []float64, batch, r, c, steps int, a, b, cc float64) []float64 {
	out := append([]float64(nil), x...)
	for l := 0; l < batch; l++ {
		xm := mat.NewDense(r, c, out[l*r*c:(l+1)*r*c])
		for k := 0; k < steps; k++ {
			var g, g2, p, px mat.Dense
			g.Mul(xm, xm.T())
			g2.Mul(&g, &g)
			p.Scale(b, &g)
			g2.Scale(cc, &g2)
			p.Add(&p, &g2)
			px.Mul(&p, xm)
			xm.Scale(a, xm)
			xm.Add(xm, &px)
		}
	}
	return out
}

// SingularValues are the singular values of the r×c row-major x.
func SingularValues(x []float64, r, c int) []float64 {
	var svd mat.SVD
	if !svd.Factorize(mat.NewDense(r, c, append([]float64(nil), x...)), mat.SVDNone) {
		panic("opstest: SVD failed")
	}
	return svd.Values(nil)
}

// nsTol is the accuracy of 5 Newton–Schulz steps of X's dtype against
// float64: each step stores its products in the dtype (bf16: 2⁻⁹
// relative) and under TF32 computes them at 2⁻¹¹.
func nsTol(s *Suite, dt tensor.DType) float64 {
	if dt == tensor.BF16 {
		return 0.06
	}
	return 20 * s.GemmTol(dt)
}

func checkNewtonSchulz(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, sh := range [][2]int{{1, 1}, {5, 9}, {16, 33}, {12, 12}} {
			for _, batch := range []int{0, 3} {
				s.Run(fmt.Sprintf("%v/%dx%d/batch=%d", dt, sh[0], sh[1], batch), func(s *Suite) { nsCheck(s, dt, sh[0], sh[1], batch) })
			}
		}
		for _, sh := range [][2]int{{9, 5}, {6, 11}} {
			for _, nest := range []bool{false, true} {
				s.Run(fmt.Sprintf("%v/prep+apply/%dx%d/nesterov=%v", dt, sh[0], sh[1], nest), func(s *Suite) { muonStepCheck(s, dt, sh[0], sh[1], nest) })
			}
		}
	}
	s.Run("multi", muonMultiCheck)
	s.Run("validation", nsValidation)
}

// nsCheck compares NewtonSchulz with the float64 iteration from the same
// (stored) input, and checks that the output's singular values are near
// 1 (in [0.5, 1.5], Muon's target band) for inputs whose normalised
// singular values are not tiny.
func nsCheck(s *Suite, dt tensor.DType, r, c, batch int) {
	nb := max(batch, 1)
	in := make([]float64, nb*r*c)
	for l := 0; l < nb; l++ {
		x := s.Weights(r * c)
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		for i, v := range x {
			in[l*r*c+i] = v / math.Sqrt(ss)
		}
	}
	xt := s.Const(dt, in, withBatch(batch, []int{r, c})...)
	in = s.Read(xt)
	s.NoErr("newton-schulz", s.E.NewtonSchulz(ops.NewtonSchulz{X: xt}))
	got := s.Read(xt)
	want := RefNewtonSchulz(in, nb, r, c, 5, float64(ops.MuonA), float64(ops.MuonB), float64(ops.MuonC))
	s.Close("X", got, want, nil, nsTol(s, dt))
	for l := 0; l < nb; l++ {
		sin := SingularValues(in[l*r*c:(l+1)*r*c], r, c)
		if sin[len(sin)-1] < 0.02 {
			continue // a nearly singular draw (square matrices): not pushed to 1 in 5 steps
		}
		for _, sv := range SingularValues(got[l*r*c:(l+1)*r*c], r, c) {
			if sv < 0.5 || sv > 1.5 {
				s.T.Errorf("matrix %d: singular value %.3f outside [0.5, 1.5] (input's %v)", l, sv, sin)
				break
			}
		}
	}
}

func muonStepCheck(s *Suite, dt tensor.DType, m, n int, nesterov bool) {
	const mu, lr, decay, eps = 0.95, 0.02, 0.1, 1e-7
	g, gv := s.Rand(tensor.F32, 1, m, n)
	buf, bv := s.Rand(tensor.F32, 1, m, n)
	tr := m > n
	xs := []int{m, n}
	if tr {
		xs = []int{n, m}
	}
	x := s.Empty(dt, xs...)
	s.NoErr("muon prep", s.E.MuonPrep(ops.MuonPrep{G: g, Buf: buf, X: x, Mu: mu, Nesterov: nesterov}))
	wb, u := make([]float64, len(gv)), make([]float64, len(gv))
	var ss float64
	for k := range gv {
		wb[k] = mu*bv[k] + gv[k]
		u[k] = wb[k]
		if nesterov {
			u[k] = gv[k] + mu*wb[k]
		}
		ss += u[k] * u[k]
	}
	wx := make([]float64, len(u))
	for k := range u {
		o := k
		if tr {
			o = (k%n)*m + k/n
		}
		wx[o] = u[k] / (math.Sqrt(ss) + eps)
	}
	s.Close("buf", s.Read(buf), wb, nil, s.Tol(tensor.F32))
	s.Close("X", s.Read(x), wx, nil, s.Tol(dt))
	// Apply from the stored X.
	xv := s.Read(x)
	p, pv := s.Rand(tensor.F32, 1, m, n)
	scale := float32(math.Sqrt(math.Max(1, float64(m)/float64(n))))
	s.NoErr("muon apply", s.E.MuonApply(p, x, nil, lr, scale, decay))
	wp := make([]float64, len(pv))
	for k := range pv {
		o := k
		if tr {
			o = (k%n)*m + k/n
		}
		wp[k] = pv[k]*(1-lr*decay) - lr*float64(scale)*xv[o]
	}
	s.Close("P", s.Read(p), wp, nil, s.Tol(tensor.F32))
	// With a device scale of the learning rate (a schedule): lr·0.5.
	pv = s.Read(p)
	s.NoErr("muon apply (lr scale)", s.E.MuonApply(p, x, s.Const(tensor.F32, []float64{0.5}, 1), lr, scale, decay))
	for k := range pv {
		o := k
		if tr {
			o = (k%n)*m + k/n
		}
		wp[k] = pv[k]*(1-0.5*lr*decay) - 0.5*lr*float64(scale)*xv[o]
	}
	s.Close("P (lr scale)", s.Read(p), wp, nil, s.Tol(tensor.F32))
}

// muonMultiCheck runs MuonPreps and MuonApplies over 34 weights (two
// launches on a GPU: 32 per launch) of shapes wide, tall (X transposed)
// and larger than a block's chunk, each against its float64 reference.
func muonMultiCheck(s *Suite) {
	const n, mu, lr, decay, eps = 34, 0.95, 0.02, 0.1, 1e-7
	shapes := [][2]int{{6, 10}, {10, 6}, {48, 64}}
	type weight struct {
		m, n      int
		g, buf, x *tensor.Tensor
		p         *tensor.Tensor
		gv, bv    []float64
		pv        []float64
		scale     float32
	}
	ws := make([]*weight, n)
	preps := make([]ops.MuonPrep, n)
	applies := make([]ops.MuonWeight, n)
	for i := range ws {
		sh := shapes[i%len(shapes)]
		w := &weight{m: sh[0], n: sh[1]}
		w.g, w.gv = s.Rand(tensor.F32, 1, w.m, w.n)
		w.buf, w.bv = s.Rand(tensor.F32, 1, w.m, w.n)
		xs := []int{w.m, w.n}
		if w.m > w.n {
			xs = []int{w.n, w.m}
		}
		w.x = s.Empty(tensor.F32, xs...)
		w.p, w.pv = s.Rand(tensor.F32, 1, w.m, w.n)
		w.scale = float32(math.Sqrt(math.Max(1, float64(w.m)/float64(w.n))))
		preps[i] = ops.MuonPrep{G: w.g, Buf: w.buf, X: w.x, Mu: mu, Nesterov: i%2 == 0}
		applies[i] = ops.MuonWeight{P: w.p, X: w.x, Scale: w.scale}
		ws[i] = w
	}
	preps[1].Nesterov = true // differing settings are refused
	if err := s.E.MuonPreps(preps); !errors.Is(err, ops.ErrConfig) {
		s.T.Errorf("MuonPreps with differing Nesterov: %v, want %v", err, ops.ErrConfig)
	}
	for i := range preps {
		preps[i].Nesterov = false
	}
	s.NoErr("muon preps", s.E.MuonPreps(preps))
	s.NoErr("muon applies", s.E.MuonApplies(applies, nil, lr, decay))
	for i, w := range ws {
		tr := w.m > w.n
		wb, u := make([]float64, len(w.gv)), make([]float64, len(w.gv))
		var ss float64
		for k := range w.gv {
			wb[k] = mu*w.bv[k] + w.gv[k]
			u[k] = wb[k]
			ss += u[k] * u[k]
		}
		wx, wp := make([]float64, len(u)), make([]float64, len(u))
		for k := range u {
			o := k
			if tr {
				o = (k%w.n)*w.m + k/w.n
			}
			wx[o] = u[k] / (math.Sqrt(ss) + eps)
		}
		for k := range u {
			o := k
			if tr {
				o = (k%w.n)*w.m + k/w.n
			}
			wp[k] = w.pv[k]*(1-lr*decay) - lr*float64(w.scale)*wx[o]
		}
		s.Close(fmt.Sprintf("weight %d buf", i), s.Read(w.buf), wb, nil, s.Tol(tensor.F32))
		s.Close(fmt.Sprintf("weight %d X", i), s.Read(w.x), wx, nil, s.Tol(tensor.F32))
		s.Close(fmt.Sprintf("weight %d P", i), s.Read(w.p), wp, nil, s.Tol(tensor.F32))
	}
}

func nsValidation(s *Suite) {
	p := s.Empty(tensor.F32, 4, 6)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"tall X", s.E.NewtonSchulz(ops.NewtonSchulz{X: s.Empty(tensor.F32, 6, 4)}), tensor.ErrShape},
		{"rank 1", s.E.NewtonSchulz(ops.NewtonSchulz{X: s.Empty(tensor.F32, 6)}), tensor.ErrShape},
		{"steps", s.E.NewtonSchulz(ops.NewtonSchulz{X: p, Steps: -1}), ops.ErrConfig},
		{"prep X shape", s.E.MuonPrep(ops.MuonPrep{G: p, Buf: p, X: s.Empty(tensor.F32, 5, 4), Mu: 0.9}), tensor.ErrShape},
		{"prep μ", s.E.MuonPrep(ops.MuonPrep{G: p, Buf: p, X: p, Mu: 1}), ops.ErrConfig},
		{"apply P dtype", s.E.MuonApply(s.Empty(tensor.BF16, 4, 6), p, nil, 1, 1, 0), tensor.ErrDType},
		{"apply lr scale shape", s.E.MuonApply(p, p, s.Empty(tensor.F32, 2), 1, 1, 0), tensor.ErrShape},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			s.T.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
}
