package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "matmul", Check: checkMatmul}) }

// RefMatmul is the float64 reference of ops.Matmul for one batch item:
// d[M,N] = op(a)·op(b) with a stored [M,K] ([K,M] when ta) and b stored
// [K,N] ([N,K] when tb), row-major.
func RefMatmul(a, b []float64, m, n, k int, ta, tb bool) []float64 {
	d := make([]float64, m*n)
	at := func(i, l int) float64 {
		if ta {
			return a[l*m+i]
		}
		return a[i*k+l]
	}
	bt := func(l, j int) float64 {
		if tb {
			return b[j*k+l]
		}
		return b[l*n+j]
	}
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for l := 0; l < k; l++ {
				s += at(i, l) * bt(l, j)
			}
			d[i*n+j] = s
		}
	}
	return d
}

// RefGELUTanh is the tanh form of GELU in float64.
func RefGELUTanh(z float64) float64 {
	const c, a = 0.7978845608028654, 0.044715
	return 0.5 * z * (1 + math.Tanh(c*(z+a*z*z*z)))
}

func refAct(z float64, act ops.Act) float64 {
	switch act {
	case ops.ActReLU:
		return math.Max(z, 0)
	case ops.ActGELU:
		return RefGELUTanh(z)
	}
	return z
}

// absRef is the reference of |op(a)|·|op(b)|: the scale of the rounding
// error of each element of a product (the forward error bound of a dot
// product), used as the error floor under reduced precision.
func absRef(a, b []float64, m, n, k int, ta, tb bool) []float64 {
	abs := func(v []float64) []float64 {
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = math.Abs(x)
		}
		return out
	}
	return RefMatmul(abs(a), abs(b), m, n, k, ta, tb)
}

func checkMatmul(s *Suite) {
	shapes := [][3]int{{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {61, 130, 31}}
	for _, dt := range s.DTypes() {
		for _, sh := range shapes {
			for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				for _, batch := range []int{0, 3} {
					name := fmt.Sprintf("%v/%dx%dx%d/ta=%v,tb=%v/batch=%d", dt, sh[0], sh[1], sh[2], tr[0], tr[1], batch)
					s.Run(name, func(s *Suite) { matmulPlain(s, dt, sh[0], sh[1], sh[2], tr[0], tr[1], batch) })
				}
			}
		}
		for _, act := range []ops.Act{ops.ActNone, ops.ActReLU, ops.ActGELU} {
			s.Run(fmt.Sprintf("%v/epilogue/%v", dt, act), func(s *Suite) { matmulEpilogue(s, dt, 61, 130, 31, act) })
		}
		s.Run(fmt.Sprintf("%v/accumulate+biasgrad", dt), func(s *Suite) { matmulAccumulate(s, dt, 45, 70, 19) })
		s.Run(fmt.Sprintf("%v/alpha-beta", dt), func(s *Suite) { matmulScaled(s, dt, 29, 37, 11) })
		s.Run(fmt.Sprintf("%v/strided", dt), func(s *Suite) { matmulStrided(s, dt) })
		s.Run(fmt.Sprintf("%v/broadcast-b", dt), func(s *Suite) { matmulBroadcast(s, dt) })
		s.Run(fmt.Sprintf("%v/linear-grad", dt), func(s *Suite) { linearGrad(s, dt) })
		s.Run(fmt.Sprintf("%v/linear-hook", dt), func(s *Suite) { linearHook(s, dt) })
		s.Run(fmt.Sprintf("%v/matmul-grad", dt), func(s *Suite) { batchedMatmulGrad(s, dt) })
		s.Run(fmt.Sprintf("%v/column-sum", dt), func(s *Suite) { columnSum(s, dt) })
	}
	s.Run("validation", matmulValidation)
}

// stored returns the stored shape of op(X) = rows×cols (transposed when t).
func stored(rows, cols int, t bool) []int {
	if t {
		return []int{cols, rows}
	}
	return []int{rows, cols}
}

func withBatch(batch int, shape []int) []int {
	if batch == 0 {
		return shape
	}
	return append([]int{batch}, shape...)
}

func matmulPlain(s *Suite, dt tensor.DType, m, k, n int, ta, tb bool, batch int) {
	a, av := s.Rand(dt, 1, withBatch(batch, stored(m, k, ta))...)
	b, bv := s.Rand(dt, 1, withBatch(batch, stored(k, n, tb))...)
	d := s.Empty(dt, withBatch(batch, []int{m, n})...)
	s.NoErr("matmul", s.E.Matmul(ops.Matmul{A: a, B: b, D: d, TransA: ta, TransB: tb}))
	nb := max(batch, 1)
	var want, mag []float64
	for i := 0; i < nb; i++ {
		ai, bi := av[i*m*k:(i+1)*m*k], bv[i*k*n:(i+1)*k*n]
		want = append(want, RefMatmul(ai, bi, m, n, k, ta, tb)...)
		mag = append(mag, absRef(ai, bi, m, n, k, ta, tb)...)
	}
	s.Close("D", s.Read(d), want, mag, s.GemmTol(dt))
}

func matmulEpilogue(s *Suite, dt tensor.DType, m, k, n int, act ops.Act) {
	a, av := s.Rand(dt, 1, m, k)
	b, bv := s.Rand(dt, 1, n, k) // a weight, [out, in]
	bias, biasv := s.Rand(dt, 1, n)
	d := s.Empty(dt, m, n)
	mm := ops.Matmul{A: a, B: b, D: d, TransB: true, Bias: bias, Act: act}
	var aux *tensor.Tensor
	if act != ops.ActNone {
		aux = s.Empty(dt, m, n)
		mm.Aux = aux
	}
	s.NoErr("matmul", s.E.Matmul(mm))
	z := RefMatmul(av, bv, m, n, k, false, true)
	mag := absRef(av, bv, m, n, k, false, true)
	y := make([]float64, len(z))
	for i := range z {
		z[i] += biasv[i%n]
		y[i] = refAct(z[i], act)
	}
	tol := s.GemmTol(dt)
	s.Close("D", s.Read(d), y, mag, tol)
	if aux != nil {
		s.Close("Aux (pre-activation)", s.Read(aux), z, mag, tol)
	}
}

func matmulAccumulate(s *Suite, dt tensor.DType, m, k, n int) {
	// dw[N,K] += dyᵀ·x and db[N] += Σ_rows dy: a weight gradient with
	// fan-out, the linear layer's backward.
	dy, dyv := s.Rand(dt, 1, m, n)
	x, xv := s.Rand(dt, 1, m, k)
	dw, dwv := s.Rand(dt, 1, n, k)
	db, dbv := s.Rand(dt, 1, n)
	s.NoErr("matmul", s.E.Matmul(ops.Matmul{A: dy, B: x, D: dw, TransA: true, BiasGrad: db, Accumulate: true}))
	want := RefMatmul(dyv, xv, n, k, m, true, false)
	mag := absRef(dyv, xv, n, k, m, true, false)
	for i := range want {
		want[i] += dwv[i]
		mag[i] += math.Abs(dwv[i])
	}
	s.Close("dw (accumulated)", s.Read(dw), want, mag, s.GemmTol(dt))
	wantB := append([]float64(nil), dbv...)
	for i, v := range dyv {
		wantB[i%n] += v
	}
	s.Close("db (accumulated)", s.Read(db), wantB, nil, s.Tol(dt))
	// Without Accumulate, BiasGrad is written.
	s.NoErr("matmul", s.E.Matmul(ops.Matmul{A: dy, B: x, D: dw, TransA: true, BiasGrad: db}))
	wantB = make([]float64, n)
	for i, v := range dyv {
		wantB[i%n] += v
	}
	s.Close("db (written)", s.Read(db), wantB, nil, s.Tol(dt))
}

func matmulStrided(s *Suite, dt tensor.DType) {
	// A and D are column blocks of wider tensors (row stride > columns),
	// as the q, k, v parts of a fused qkv projection are.
	const m, k, n = 23, 40, 13
	wide, wv := s.Rand(dt, 1, m, 3*k)
	a, err := wide.Narrow(1, k, k)
	s.NoErr("narrow", err)
	b, bv := s.Rand(dt, 1, k, n)
	dwide := s.Empty(dt, m, 2*n+3)
	d, err := dwide.Narrow(1, n+3, n)
	s.NoErr("narrow", err)
	s.NoErr("matmul", s.E.Matmul(ops.Matmul{A: a, B: b, D: d}))
	av := make([]float64, 0, m*k)
	for i := 0; i < m; i++ {
		av = append(av, wv[i*3*k+k:i*3*k+2*k]...)
	}
	s.Close("D", s.Read(d), RefMatmul(av, bv, m, n, k, false, false), absRef(av, bv, m, n, k, false, false), s.GemmTol(dt))
	// The columns of dwide outside d stay poisoned: nothing else written.
	all := s.Read(dwide)
	for i := 0; i < m; i++ {
		for j := 0; j < 2*n+3; j++ {
			if (j < n+3 || j >= 2*n+3) && !math.IsNaN(all[i*(2*n+3)+j]) {
				s.T.Fatalf("element [%d,%d] outside the view was written", i, j)
			}
		}
	}
}

func matmulBroadcast(s *Suite, dt tensor.DType) {
	const batch, m, k, n = 4, 9, 12, 7
	a, av := s.Rand(dt, 1, batch, m, k)
	b, bv := s.Rand(dt, 1, k, n) // shared by every batch item
	d := s.Empty(dt, batch, m, n)
	s.NoErr("matmul", s.E.Matmul(ops.Matmul{A: a, B: b, D: d}))
	var want, mag []float64
	for i := 0; i < batch; i++ {
		ai := av[i*m*k : (i+1)*m*k]
		want = append(want, RefMatmul(ai, bv, m, n, k, false, false)...)
		mag = append(mag, absRef(ai, bv, m, n, k, false, false)...)
	}
	s.Close("D", s.Read(d), want, mag, s.GemmTol(dt))
}

func linearGrad(s *Suite, dt tensor.DType) {
	const rows, in, out = 2 * 5, 11, 6
	for _, act := range []ops.Act{ops.ActNone, ops.ActReLU, ops.ActGELU} {
		for _, bias := range []bool{false, true} {
			params := [][]int{{2, 5, in}, {out, in}}
			if bias {
				params = append(params, []int{out})
			}
			tolF := s.GemmTol(dt)
			// The differences are of the float64 reference, so a small
			// step costs no accuracy; ReLU needs one, or a pre-activation
			// within the step of 0 straddles the kink (1e-3 failed about
			// one run in five on the host).
			h := 1e-3
			if act == ops.ActReLU {
				h = 1e-7
			}
			s.GradCheck(GradCase{
				Name: fmt.Sprintf("linear act=%v bias=%v", act, bias), DType: dt, Params: params,
				Twice: true, TolF: tolF, TolB: 10 * tolF, H: h,
				Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var {
					var b *ops.Var
					if bias {
						b = p[2]
					}
					return g.Linear(p[0], p[1], b, act)
				},
				Ref: func(p [][]float64) []float64 {
					y := RefMatmul(p[0], p[1], rows, out, in, false, true)
					for i := range y {
						if bias {
							y[i] += p[2][i%out]
						}
						y[i] = refAct(y[i], act)
					}
					return y
				},
			})
		}
	}
}

func batchedMatmulGrad(s *Suite, dt tensor.DType) {
	const batch, m, k, n = 3, 4, 5, 6
	for _, tb := range []bool{false, true} {
		tolF := s.GemmTol(dt)
		s.GradCheck(GradCase{
			Name: fmt.Sprintf("matmul tb=%v", tb), DType: dt,
			Params: [][]int{{batch, m, k}, withBatch(batch, stored(k, n, tb))},
			TolF:   tolF, TolB: 10 * tolF,
			Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.Matmul(p[0], p[1], tb) },
			Ref: func(p [][]float64) []float64 {
				var y []float64
				for i := 0; i < batch; i++ {
					y = append(y, RefMatmul(p[0][i*m*k:(i+1)*m*k], p[1][i*k*n:(i+1)*k*n], m, n, k, false, tb)...)
				}
				return y
			},
		})
	}
}

func columnSum(s *Suite, dt tensor.DType) {
	const rows, cols = 300, 45
	wide, wv := s.Rand(dt, 1, rows, cols+5)
	x, err := wide.Narrow(1, 2, cols)
	s.NoErr("narrow", err)
	out := s.Empty(dt, cols)
	s.NoErr("column sum", s.E.ColumnSum(out, x, false))
	want := make([]float64, cols)
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			want[j] += wv[i*(cols+5)+2+j]
		}
	}
	s.Close("column sum", s.Read(out), want, nil, s.Tol(dt))
	s.NoErr("column sum (acc)", s.E.ColumnSum(out, x, true))
	for j := range want {
		want[j] *= 2
	}
	s.Close("column sum (accumulated)", s.Read(out), want, nil, s.Tol(dt))
}

func matmulValidation(s *Suite) {
	a := s.Empty(tensor.F32, 3, 4)
	b := s.Empty(tensor.F32, 4, 5)
	bb := s.Empty(tensor.BF16, 4, 5)
	d := s.Empty(tensor.F32, 3, 5)
	bad := []struct {
		what string
		mm   ops.Matmul
	}{
		{"inner dimensions differ", ops.Matmul{A: a, B: b, D: d, TransB: true}},
		{"mixed operand dtypes", ops.Matmul{A: a, B: bb, D: d}},
		{"wrong D shape", ops.Matmul{A: a, B: b, D: s.Empty(tensor.F32, 5, 3)}},
		{"accumulate with activation", ops.Matmul{A: a, B: b, D: d, Accumulate: true, Act: ops.ActReLU}},
		{"aux without activation", ops.Matmul{A: a, B: b, D: d, Aux: s.Empty(tensor.F32, 3, 5)}},
		{"bias of another dtype", ops.Matmul{A: a, B: b, D: d, Bias: s.Empty(tensor.BF16, 5)}},
		{"bias grad without TransA", ops.Matmul{A: a, B: b, D: d, BiasGrad: s.Empty(tensor.F32, 3)}},
		{"rank 1", ops.Matmul{A: s.Empty(tensor.F32, 4), B: b, D: d}},
		{"missing D", ops.Matmul{A: a, B: b}},
	}
	for _, c := range bad {
		if err := s.E.Matmul(c.mm); err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
	tr, _ := s.Empty(tensor.F32, 4, 3).Transpose(0, 1) // last dim strided
	if err := s.E.Matmul(ops.Matmul{A: tr, B: b, D: d}); err == nil {
		s.T.Error("an operand with a strided last dimension was accepted")
	}
}

// matmulScaled checks Alpha and Beta: D = Alpha·op(A)·op(B) written, then
// D = Beta·D + Alpha·op(A)·op(B) accumulated (batched, Aᵀ), as the
// statistics of second-order optimizers are kept.
func matmulScaled(s *Suite, dt tensor.DType, m, k, n int) {
	const batch, alpha, beta = 2, 0.25, 0.9
	a, av := s.Rand(dt, 1, batch, k, m)
	b, bv := s.Rand(dt, 1, batch, k, n)
	d := s.Empty(dt, batch, m, n)
	s.NoErr("matmul", s.E.Matmul(ops.Matmul{A: a, B: b, D: d, TransA: true, Alpha: alpha}))
	var want, mag []float64
	for i := 0; i < batch; i++ {
		ai, bi := av[i*m*k:(i+1)*m*k], bv[i*k*n:(i+1)*k*n]
		p := RefMatmul(ai, bi, m, n, k, true, false)
		for j := range p {
			p[j] *= alpha
		}
		want = append(want, p...)
		mag = append(mag, absRef(ai, bi, m, n, k, true, false)...)
	}
	tol := s.GemmTol(dt)
	s.Close("D = alpha·AᵀB", s.Read(d), want, Scaled(alpha, mag), tol)
	old := s.Read(d)
	s.NoErr("matmul", s.E.Matmul(ops.Matmul{A: a, B: b, D: d, TransA: true, Alpha: alpha, Beta: beta, Accumulate: true}))
	for j := range want {
		want[j] += beta * old[j]
	}
	// The terms: beta·|D| and alpha·Σ|a·b|; D itself carries the first
	// product's error, alpha·Σ|a·b| again.
	s.Close("D = beta·D + alpha·AᵀB", s.Read(d), want, Sum(Scaled(beta, old), Scaled(2*alpha, mag)), tol)
	// Scales with an epilogue are refused.
	bias := s.Empty(dt, n)
	if err := s.E.Matmul(ops.Matmul{A: a, B: b, D: d, TransA: true, Alpha: 2, Bias: bias}); !errors.Is(err, ops.ErrConfig) {
		s.T.Errorf("Alpha with a bias: %v, want ErrConfig", err)
	}
}

// linearHook: GraphOptions.OnLinear sees, in the backward, the layer's
// weight name, its input as [rows, in] and the gradient of its
// pre-activation as [rows, out] (dy ⊙ act'(z)); an error from it stops the
// backward.
func linearHook(s *Suite, dt tensor.DType) {
	const rows, in, out = 6, 5, 3
	type call struct {
		weight string
		x, dy  []float64
	}
	var calls []call
	hookErr := error(nil)
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Autocast: dt, OnLinear: func(weight string, x, dy *tensor.Tensor) error {
		if x.Rank() != 2 || x.Dim(0) != rows || x.Dim(1) != in || dy.Rank() != 2 || dy.Dim(0) != rows || dy.Dim(1) != out {
			s.T.Errorf("hook shapes x %v, dy %v", x.Shape, dy.Shape)
		}
		calls = append(calls, call{weight, s.Read(x), s.Read(dy)})
		return hookErr
	}})
	defer g.Free()
	xt, xv := s.Rand(dt, 1, 2, 3, in)
	wt, wv := s.Rand(tensor.F32, 1, out, in)
	bt, bv := s.Rand(tensor.F32, 1, out)
	x := g.Input("x", xt)
	w := g.Param("fc.weight", wt, s.Empty(tensor.F32, out, in))
	b := g.Param("fc.bias", bt, s.Empty(tensor.F32, out))
	y := g.Linear(x, w, b, ops.ActGELU)
	var dyv []float64
	DotLoss(s, g, y, func(w []float64) { dyv = w })
	s.NoErr("build", g.Build(true))
	s.NoErr("forward", g.Forward())
	s.NoErr("backward", g.Backward())
	if len(calls) != 1 || calls[0].weight != "fc.weight" {
		s.T.Fatalf("hook calls %+v, want one for fc.weight", calls)
	}
	s.Close("hook x", calls[0].x, xv, nil, 0)
	// dz = dy ⊙ gelu'(z), z from the (autocast) operands.
	xr, wr := xv, wv
	if dt == tensor.BF16 {
		wr = F64(tensor.RoundBF16(F32(wv)))
	}
	z := RefMatmul(xr, wr, rows, out, in, false, true)
	want := make([]float64, len(z))
	for i := range z {
		bi := bv[i%out]
		if dt == tensor.BF16 {
			bi = F64(tensor.RoundBF16(F32([]float64{bi})))[0]
		}
		zz := z[i] + bi
		const h = 1e-4
		want[i] = dyv[i] * (RefGELUTanh(zz+h) - RefGELUTanh(zz-h)) / (2 * h)
	}
	s.Close("hook dy", calls[0].dy, want, nil, 10*s.GemmTol(dt))
	hookErr = errors.New("hook failed")
	s.NoErr("forward", g.Forward())
	if err := g.Backward(); !errors.Is(err, hookErr) {
		s.T.Errorf("backward with a failing hook: %v", err)
	}
}
