package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "rmsnorm", Check: checkRMSNorm}) }

// RefRMSNorm is the float64 reference of ops.Engine.RMSNorm for rows of C
// elements (row-major x): y = x/√(Σx²/C + eps)·w (w nil: ones). It
// returns y and the per-row rstd.
func RefRMSNorm(x, w []float64, rows, C int, eps float64) (y, rstd []float64) {
	y = make([]float64, rows*C)
	rstd = make([]float64, rows)
	for r := 0; r < rows; r++ {
		row := x[r*C : (r+1)*C]
		var q float64
		for _, v := range row {
			q += v * v
		}
		rs := 1 / math.Sqrt(q/float64(C)+eps)
		for j, v := range row {
			o := v * rs
			if w != nil {
				o *= w[j]
			}
			y[r*C+j] = o
		}
		rstd[r] = rs
	}
	return y, rstd
}

// RefRMSNormBackward is the float64 reference of the RMSNorm gradients,
// derived from the forward: with x̂ = x·rstd and g = dy·w,
// dx = rstd·(g − x̂·mean(g·x̂)), dw = Σ_rows dy·x̂ (rstd recomputed from
// x).
func RefRMSNormBackward(dy, x, w []float64, rows, C int, eps float64) (dx, dw []float64) {
	_, rstd := RefRMSNorm(x, nil, rows, C, eps)
	dx = make([]float64, rows*C)
	dw = make([]float64, C)
	xh := make([]float64, C)
	g := make([]float64, C)
	for r := 0; r < rows; r++ {
		var s float64
		for j := 0; j < C; j++ {
			d := dy[r*C+j]
			xh[j] = x[r*C+j] * rstd[r]
			g[j] = d
			if w != nil {
				g[j] *= w[j]
			}
			s += g[j] * xh[j]
			dw[j] += d * xh[j]
		}
		for j := 0; j < C; j++ {
			dx[r*C+j] = rstd[r] * (g[j] - xh[j]*s/float64(C))
		}
	}
	return dx, dw
}

// RefRMSNormTerms is the terms' size (TermsErr) of RefRMSNormBackward's
// dx and dw: with X = |x|·rstd and G = |dy·w|, dx sums rstd·(G +
// X·mean(G·X)) and dw sums |dy|·X over the rows (with C = 1 the exact dx
// is 0). y = x·rstd·w has no sum beyond rstd's sum of squares: its own
// size.
func RefRMSNormTerms(dy, x, w []float64, rows, C int, eps float64) (dx, dw []float64) {
	_, rstd := RefRMSNorm(x, nil, rows, C, eps)
	dx, dw = make([]float64, rows*C), make([]float64, C)
	X, G := make([]float64, C), make([]float64, C)
	for r := 0; r < rows; r++ {
		var s float64
		for j := 0; j < C; j++ {
			i := r*C + j
			X[j] = math.Abs(x[i]) * rstd[r]
			G[j] = math.Abs(dy[i])
			if w != nil {
				G[j] *= math.Abs(w[j])
			}
			s += G[j] * X[j]
			dw[j] += math.Abs(dy[i]) * X[j]
		}
		for j := 0; j < C; j++ {
			dx[r*C+j] = rstd[r] * (G[j] + X[j]*s/float64(C))
		}
	}
	return dx, dw
}

// rmsEps is HRM's rms_norm_eps.
const rmsEps = 1e-5

func checkRMSNorm(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, sh := range lnShapes {
			for _, weight := range []bool{true, false} {
				s.Run(fmt.Sprintf("%v/%dx%d/weight=%v", dt, sh[0], sh[1], weight), func(s *Suite) {
					rmsForwardBackward(s, dt, sh[0], sh[1], weight, false)
				})
			}
			s.Run(fmt.Sprintf("%v/add/%dx%d", dt, sh[0], sh[1]), func(s *Suite) {
				rmsForwardBackward(s, dt, sh[0], sh[1], sh[1]%2 == 0, true)
			})
		}
		// HRM's shape: 82 positions × hidden 512, no weight.
		s.Run(fmt.Sprintf("%v/hrm", dt), func(s *Suite) { rmsForwardBackward(s, dt, 2*82, 512, false, true) })
		s.Run(fmt.Sprintf("%v/strided", dt), func(s *Suite) { rmsStrided(s, dt) })
		s.Run(fmt.Sprintf("%v/in-place", dt), func(s *Suite) { rmsInPlace(s, dt) })
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) { rmsGrad(s, dt) })
	}
	s.Run("validation", rmsValidation)
}

// rmsForwardBackward checks the forward (outputs poisoned; with add, the
// stored sum exactly) and the backward: written, accumulated flag by flag,
// and with only some gradients wanted.
func rmsForwardBackward(s *Suite, dt tensor.DType, rows, C int, weight, add bool) {
	x, xv := lnShifted(s, dt, 1.5, 0.5, rows, C)
	var w *tensor.Tensor
	var wv []float64
	if weight {
		w, wv = s.Rand(tensor.F32, 1, C)
	}
	y := s.Empty(dt, rows, C)
	rstd := s.Empty(tensor.F32, rows)
	norm0, normv := x, xv // the normalised input
	if add {
		r, rv := s.Rand(dt, 1, rows, C)
		sum := s.Empty(dt, rows, C)
		s.NoErr("addrmsnorm", s.E.AddRMSNorm(sum, y, rstd, x, r, w, rmsEps))
		normv = s.Read(s.Const(dt, lnSum(xv, rv), rows*C)) // x + r rounded to dt
		s.Close("sum", s.Read(sum), normv, nil, 0)
		norm0 = sum
	} else {
		s.NoErr("rmsnorm", s.E.RMSNorm(y, rstd, x, w, rmsEps))
	}
	wantY, wantR := RefRMSNorm(normv, wv, rows, C, rmsEps)
	s.Close("y", s.Read(y), wantY, nil, s.Tol(dt))
	s.Close("rstd", s.Read(rstd), wantR, nil, 1e-5)

	dy, dyv := s.Rand(dt, 1, rows, C)
	wdx, wdw := RefRMSNormBackward(dyv, normv, wv, rows, C, rmsEps)
	tdx, tdw := RefRMSNormTerms(dyv, normv, wv, rows, C, rmsEps)
	var dw *tensor.Tensor
	if weight {
		dw = s.Empty(tensor.F32, C)
	}
	dx, dr := s.Empty(dt, rows, C), s.Empty(dt, rows, C)
	s.NoErr("rmsnorm backward", s.E.RMSNormBackward(dx, dr, dw, dy, norm0, w, rstd, [3]bool{}))
	s.Close("dx", s.Read(dx), wdx, tdx, s.Tol(dt))
	s.Close("dr", s.Read(dr), wdx, tdx, s.Tol(dt))
	if weight {
		s.Close("dw", s.Read(dw), wdw, tdw, 1e-5)
	}
	for _, acc := range [][3]bool{{true, false, false}, {false, true, false}, {false, false, true}, {true, true, true}} {
		outs := make([]*tensor.Tensor, 3)
		olds := make([][]float64, 3)
		outs[0], olds[0] = s.Rand(dt, 1, rows, C)
		outs[1], olds[1] = s.Rand(dt, 1, rows, C)
		if weight {
			outs[2], olds[2] = s.Rand(tensor.F32, 1, C)
		}
		s.NoErr("rmsnorm backward (acc)", s.E.RMSNormBackward(outs[0], outs[1], outs[2], dy, norm0, w, rstd, acc))
		terms := [][]float64{tdx, tdx, tdw}
		for i, want := range [][]float64{wdx, wdx, wdw} {
			if outs[i] == nil {
				continue
			}
			ti := terms[i]
			if acc[i] {
				want, ti = lnSum(olds[i], want), Sum(olds[i], ti)
			}
			what := fmt.Sprintf("%s (acc=%v)", []string{"dx", "dr", "dw"}[i], acc)
			tol := 1e-5
			if i < 2 {
				tol = s.Tol(dt)
			}
			s.Close(what, s.Read(outs[i]), want, ti, tol)
		}
	}
	if weight {
		dw1 := s.Empty(tensor.F32, C)
		s.NoErr("rmsnorm backward (dw only)", s.E.RMSNormBackward(nil, nil, dw1, dy, norm0, w, rstd, [3]bool{}))
		s.Close("dw (alone)", s.Read(dw1), wdw, tdw, 1e-5)
	}
	// dx written over dy itself.
	s.NoErr("rmsnorm backward (dx = dy)", s.E.RMSNormBackward(dy, nil, nil, dy, norm0, w, rstd, [3]bool{}))
	s.Close("dx = dy", s.Read(dy), wdx, tdx, s.Tol(dt))
}

// rmsStrided: x, r, sum, y, dy, dx, dr are column blocks of wider tensors,
// whose other columns must stay untouched.
func rmsStrided(s *Suite, dt tensor.DType) {
	const b0, t0, C, W, off = 2, 5, 40, 56, 8
	rows := b0 * t0
	cols := func(wide []float64) []float64 {
		out := make([]float64, 0, rows*C)
		for r := 0; r < rows; r++ {
			out = append(out, wide[r*W+off:r*W+off+C]...)
		}
		return out
	}
	view := func(t *tensor.Tensor) *tensor.Tensor {
		v, err := t.Narrow(2, off, C)
		s.NoErr("narrow", err)
		return v
	}
	rnd := func() (*tensor.Tensor, []float64) {
		t, v := s.Rand(dt, 1, b0, t0, W)
		return view(t), cols(v)
	}
	x, xv := rnd()
	r, rv := rnd()
	w, wv := s.Rand(tensor.F32, 1, C)
	sumw, yw := s.Empty(dt, b0, t0, W), s.Empty(dt, b0, t0, W)
	sum, y := view(sumw), view(yw)
	rstd := s.Empty(tensor.F32, b0, t0)
	s.NoErr("addrmsnorm", s.E.AddRMSNorm(sum, y, rstd, x, r, w, rmsEps))
	sv := s.Read(s.Const(dt, lnSum(xv, rv), rows*C))
	wantY, _ := RefRMSNorm(sv, wv, rows, C, rmsEps)
	s.Close("sum (strided)", s.Read(sum), sv, nil, 0)
	s.Close("y (strided)", s.Read(y), wantY, nil, s.Tol(dt))
	lnUntouched(s, "sum", s.Read(sumw), rows, W, off, C)
	lnUntouched(s, "y", s.Read(yw), rows, W, off, C)

	dy, dyv := rnd()
	dxw, drw := s.Empty(dt, b0, t0, W), s.Empty(dt, b0, t0, W)
	dw := s.Empty(tensor.F32, C)
	s.NoErr("rmsnorm backward", s.E.RMSNormBackward(view(dxw), view(drw), dw, dy, sum, w, rstd, [3]bool{}))
	wdx, wdw := RefRMSNormBackward(dyv, sv, wv, rows, C, rmsEps)
	tdx, tdw := RefRMSNormTerms(dyv, sv, wv, rows, C, rmsEps)
	s.Close("dx (strided)", s.Read(view(dxw)), wdx, tdx, s.Tol(dt))
	s.Close("dr (strided)", s.Read(view(drw)), wdx, tdx, s.Tol(dt))
	s.Close("dw (strided)", s.Read(dw), wdw, tdw, 1e-5)
	lnUntouched(s, "dx", s.Read(dxw), rows, W, off, C)
	lnUntouched(s, "dr", s.Read(drw), rows, W, off, C)
}

// rmsInPlace: y written over x, and the sum over x (x = x + r).
func rmsInPlace(s *Suite, dt tensor.DType) {
	const rows, C = 37, 512
	x, xv := s.Rand(dt, 1, rows, C)
	s.NoErr("rmsnorm in place", s.E.RMSNorm(x, nil, x, nil, rmsEps))
	want, _ := RefRMSNorm(xv, nil, rows, C, rmsEps)
	s.Close("y = x", s.Read(x), want, nil, s.Tol(dt))
	x2, x2v := s.Rand(dt, 1, rows, C)
	r, rv := s.Rand(dt, 1, rows, C)
	y := s.Empty(dt, rows, C)
	s.NoErr("addrmsnorm in place", s.E.AddRMSNorm(x2, y, nil, x2, r, nil, rmsEps))
	sv := s.Read(s.Const(dt, lnSum(x2v, rv), rows*C))
	s.Close("sum = x", s.Read(x2), sv, nil, 0)
	wantY, _ := RefRMSNorm(sv, nil, rows, C, rmsEps)
	s.Close("y", s.Read(y), wantY, nil, s.Tol(dt))
}

// rmsGrad: Graph.RMSNorm and Graph.AddRMSNorm against finite differences,
// with and without a weight, twice (fan-out), and with x and r the same
// Var.
func rmsGrad(s *Suite, dt tensor.DType) {
	const b0, t0, C = 2, 3, 7
	rows := b0 * t0
	for _, weight := range []bool{true, false} {
		params := [][]int{{b0, t0, C}}
		if weight {
			params = append(params, []int{C})
		}
		s.GradCheck(GradCase{
			Name: fmt.Sprintf("rmsnorm weight=%v", weight), DType: dt, Params: params,
			PDTypes: []tensor.DType{0, tensor.F32}, Twice: true,
			Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var {
				if weight {
					return g.RMSNorm(p[0], p[1], rmsEps)
				}
				return g.RMSNorm(p[0], nil, rmsEps)
			},
			Ref: func(p [][]float64) []float64 {
				var w []float64
				if weight {
					w = p[1]
				}
				y, _ := RefRMSNorm(p[0], w, rows, C, rmsEps)
				return y
			},
		})
		params = [][]int{{b0, t0, C}, {b0, t0, C}}
		if weight {
			params = append(params, []int{C})
		}
		s.GradCheck(GradCase{
			Name: fmt.Sprintf("addrmsnorm weight=%v", weight), DType: dt, Params: params,
			PDTypes: []tensor.DType{0, 0, tensor.F32}, Twice: true,
			Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var {
				if weight {
					return g.AddRMSNorm(p[0], p[1], p[2], rmsEps)
				}
				return g.AddRMSNorm(p[0], p[1], nil, rmsEps)
			},
			Ref: func(p [][]float64) []float64 {
				var w []float64
				if weight {
					w = p[2]
				}
				y, _ := RefRMSNorm(lnSum(p[0], p[1]), w, rows, C, rmsEps)
				return y
			},
		})
	}
	s.GradCheck(GradCase{
		Name: "addrmsnorm x+x", DType: dt, Params: [][]int{{b0, t0, C}}, Twice: true,
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.AddRMSNorm(p[0], p[0], nil, rmsEps) },
		Ref: func(p [][]float64) []float64 {
			y, _ := RefRMSNorm(lnSum(p[0], p[0]), nil, rows, C, rmsEps)
			return y
		},
	})
}

func rmsValidation(s *Suite) {
	x := s.Empty(tensor.F32, 4, 6)
	y := s.Empty(tensor.F32, 4, 6)
	w := s.Empty(tensor.F32, 6)
	st := s.Empty(tensor.F32, 4)
	perm, _ := s.Empty(tensor.F32, 3, 4, 6).Permute(1, 0, 2) // leading dims do not merge
	yperm := s.Empty(tensor.F32, 4, 3, 6)
	bad := []struct {
		what string
		err  error
	}{
		{"y of another shape", s.E.RMSNorm(s.Empty(tensor.F32, 4, 5), st, x, w, rmsEps)},
		{"y of another dtype", s.E.RMSNorm(s.Empty(tensor.BF16, 4, 6), st, x, w, rmsEps)},
		{"w of the wrong length", s.E.RMSNorm(y, st, x, s.Empty(tensor.F32, 5), rmsEps)},
		{"bf16 w", s.E.RMSNorm(y, st, x, s.Empty(tensor.BF16, 6), rmsEps)},
		{"rstd of the wrong length", s.E.RMSNorm(y, s.Empty(tensor.F32, 3), x, w, rmsEps)},
		{"i32 x", s.E.RMSNorm(y, st, s.Empty(tensor.I32, 4, 6), w, rmsEps)},
		{"negative eps", s.E.RMSNorm(y, st, x, w, -1)},
		{"NaN eps", s.E.RMSNorm(y, st, x, w, float32(math.NaN()))},
		{"missing y", s.E.RMSNorm(nil, st, x, w, rmsEps)},
		{"scalar x", s.E.RMSNorm(s.Empty(tensor.F32), nil, s.Empty(tensor.F32), nil, rmsEps)},
		{"add without sum", s.E.AddRMSNorm(nil, y, st, x, x, w, rmsEps)},
		{"add r of another shape", s.E.AddRMSNorm(y, y, st, x, s.Empty(tensor.F32, 4, 5), w, rmsEps)},
		{"backward without rstd", s.E.RMSNormBackward(y, nil, nil, y, x, w, nil, [3]bool{})},
		{"backward dy of another shape", s.E.RMSNormBackward(y, nil, nil, s.Empty(tensor.F32, 4, 5), x, w, st, [3]bool{})},
		{"backward dx of another dtype", s.E.RMSNormBackward(s.Empty(tensor.BF16, 4, 6), nil, nil, y, x, w, st, [3]bool{})},
		{"backward dw of the wrong length", s.E.RMSNormBackward(y, nil, s.Empty(tensor.F32, 7), y, x, w, st, [3]bool{})},
		{"backward dw without w", s.E.RMSNormBackward(y, nil, w, y, x, nil, st, [3]bool{})},
		{"backward dx and dr overlap", s.E.RMSNormBackward(y, y, nil, x, x, nil, st, [3]bool{})},
	}
	for _, c := range bad {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
	if err := s.E.RMSNorm(yperm, nil, perm, nil, rmsEps); !errors.Is(err, tensor.ErrLayout) {
		s.T.Errorf("unmergeable rows: %v, want ErrLayout", err)
	}
	for _, v := range s.Read(y) {
		if !math.IsNaN(v) {
			s.T.Fatal("a rejected call wrote y")
		}
	}
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{})
	defer g.Free()
	xv := g.Input("x", x)
	if g.RMSNorm(xv, g.Input("w", s.Empty(tensor.BF16, 6)), rmsEps) != nil || g.Err() == nil {
		s.T.Error("graph rmsnorm with a bf16 weight was recorded")
	}
}
