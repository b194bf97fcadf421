package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "layernorm", Check: checkLayerNorm}) }

// RefLayerNorm is the float64 reference of ops.Engine.LayerNorm for rows of
// C elements (row-major x): y = (x−μ)/√(σ² + eps)·w + b with the biased
// variance; w, b nil mean ones, zeros. It returns y and the per-row mean
// and rstd.
func RefLayerNorm(x, w, b []float64, rows, C int, eps float64) (y, mean, rstd []float64) {
	y = make([]float64, rows*C)
	mean = make([]float64, rows)
	rstd = make([]float64, rows)
	for r := 0; r < rows; r++ {
		row := x[r*C : (r+1)*C]
		var s float64
		for _, v := range row {
			s += v
		}
		mu := s / float64(C)
		var q float64
		for _, v := range row {
			q += (v - mu) * (v - mu)
		}
		rs := 1 / math.Sqrt(q/float64(C)+eps)
		for j, v := range row {
			o := (v - mu) * rs
			if w != nil {
				o *= w[j]
			}
			if b != nil {
				o += b[j]
			}
			y[r*C+j] = o
		}
		mean[r], rstd[r] = mu, rs
	}
	return y, mean, rstd
}

// RefLayerNormBackward is the float64 reference of the LayerNorm gradients
// (derived from the forward: g = dy·w, x̂ = (x−μ)·rstd,
// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), dw = Σ_rows dy·x̂, db = Σ_rows dy),
// recomputing μ and rstd from x.
func RefLayerNormBackward(dy, x, w []float64, rows, C int, eps float64) (dx, dw, db []float64) {
	_, mean, rstd := RefLayerNorm(x, nil, nil, rows, C, eps)
	dx = make([]float64, rows*C)
	dw = make([]float64, C)
	db = make([]float64, C)
	xh := make([]float64, C)
	g := make([]float64, C)
	for r := 0; r < rows; r++ {
		var s1, s2 float64
		for j := 0; j < C; j++ {
			d := dy[r*C+j]
			xh[j] = (x[r*C+j] - mean[r]) * rstd[r]
			g[j] = d
			if w != nil {
				g[j] *= w[j]
			}
			s1 += g[j]
			s2 += g[j] * xh[j]
			dw[j] += d * xh[j]
			db[j] += d
		}
		for j := 0; j < C; j++ {
			dx[r*C+j] = rstd[r] * (g[j] - s1/float64(C) - xh[j]*s2/float64(C))
		}
	}
	return dx, dw, db
}

// RefLayerNormTerms is the terms' size (TermsErr) of RefLayerNorm's y and
// RefLayerNormBackward's dx, dw and db: x − μ sums |x| and |μ|, so x̂'s
// terms are X = (|x| + |μ|)·rstd (with C = 1 the exact dx is 0 and rstd =
// 1/√eps amplifies the rounding of x − μ); y sums X·|w| and |b|; dx =
// rstd·(g − mean(g) − x̂·mean(g·x̂)) sums rstd·(|g| + mean|g| +
// X·mean(|g|·X)) with g = dy·w; dw and db sum |dy|·X and |dy| over the
// rows. w and b may be nil.
func RefLayerNormTerms(dy, x, w, b []float64, rows, C int, eps float64) (y, dx, dw, db []float64) {
	_, mean, rstd := RefLayerNorm(x, nil, nil, rows, C, eps)
	y, dx = make([]float64, rows*C), make([]float64, rows*C)
	dw, db = make([]float64, C), make([]float64, C)
	X, G := make([]float64, C), make([]float64, C)
	for r := 0; r < rows; r++ {
		var sg, sgx float64
		for j := 0; j < C; j++ {
			i := r*C + j
			X[j] = (math.Abs(x[i]) + math.Abs(mean[r])) * rstd[r]
			wj := 1.0
			if w != nil {
				wj = math.Abs(w[j])
			}
			y[i] = X[j] * wj
			if b != nil {
				y[i] += math.Abs(b[j])
			}
			if dy == nil {
				continue
			}
			G[j] = math.Abs(dy[i]) * wj
			sg += G[j]
			sgx += G[j] * X[j]
			dw[j] += math.Abs(dy[i]) * X[j]
			db[j] += math.Abs(dy[i])
		}
		if dy == nil {
			continue
		}
		for j := 0; j < C; j++ {
			dx[r*C+j] = rstd[r] * (G[j] + sg/float64(C) + X[j]*sgx/float64(C))
		}
	}
	return y, dx, dw, db
}

// RefLayerNormMeanTerms is the terms' size of the rows' means: Σ|x|/C.
func RefLayerNormMeanTerms(x []float64, rows, C int) []float64 {
	m := make([]float64, rows)
	for r := 0; r < rows; r++ {
		for _, v := range x[r*C : (r+1)*C] {
			m[r] += math.Abs(v)
		}
		m[r] /= float64(C)
	}
	return m
}

// lnYTerms is RefLayerNormTerms' y alone.
func lnYTerms(x, w, b []float64, rows, C int) []float64 {
	y, _, _, _ := RefLayerNormTerms(nil, x, w, b, rows, C, lnEps)
	return y
}

// lnShapes are (rows, C) pairs that reach every kernel instance: warp rows
// caching 8, 16 and 32 elements per lane, scalar (C not a multiple of 8)
// and vectorised, block rows, and rows wider than a block's cache (C >
// 8192, read again per pass); row counts that leave partial blocks and
// give each warp of the backward several rows.
var lnShapes = [][2]int{{3, 1}, {7, 5}, {13, 67}, {9, 256}, {5, 384}, {4, 1000}, {3, 1024},
	{3, 1032}, {2, 3001}, {2, 8200}, {2, 8201}, {600, 96}, {2100, 24}, {2049, 264}}

const lnEps = 1e-5

func checkLayerNorm(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, sh := range lnShapes {
			for _, affine := range []bool{true, false} {
				s.Run(fmt.Sprintf("%v/%dx%d/affine=%v", dt, sh[0], sh[1], affine), func(s *Suite) {
					lnForwardBackward(s, dt, sh[0], sh[1], affine)
				})
			}
		}
		s.Run(fmt.Sprintf("%v/strided", dt), func(s *Suite) { lnStrided(s, dt) })
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) { lnGrad(s, dt) })
		for _, sh := range lnShapes {
			s.Run(fmt.Sprintf("%v/add/%dx%d", dt, sh[0], sh[1]), func(s *Suite) { addlnForwardBackward(s, dt, sh[0], sh[1], true) })
		}
		s.Run(fmt.Sprintf("%v/add/no-affine", dt), func(s *Suite) { addlnForwardBackward(s, dt, 600, 96, false) })
		s.Run(fmt.Sprintf("%v/add/in-place", dt), func(s *Suite) { addlnInPlace(s, dt) })
		s.Run(fmt.Sprintf("%v/add/strided", dt), func(s *Suite) { addlnStrided(s, dt) })
		s.Run(fmt.Sprintf("%v/add/grad", dt), func(s *Suite) { addlnGrad(s, dt) })
	}
	s.Run("validation", lnValidation)
	s.Run("add/validation", addlnValidation)
}

// lnForwardBackward checks the forward (outputs poisoned) and the backward
// twice: written, then accumulated onto random values.
func lnForwardBackward(s *Suite, dt tensor.DType, rows, C int, affine bool) {
	// An offset mean, so that a one-pass variance would lose digits.
	x, xv := lnShifted(s, dt, 1.5, 3, rows, C)
	var w, b *tensor.Tensor
	var wv, bv []float64
	if affine {
		w, wv = s.Rand(tensor.F32, 1, C)
		b, bv = s.Rand(tensor.F32, 1, C)
	}
	y := s.Empty(dt, rows, C)
	mean := s.Empty(tensor.F32, rows)
	rstd := s.Empty(tensor.F32, rows)
	s.NoErr("layernorm", s.E.LayerNorm(y, mean, rstd, x, w, b, lnEps))
	wantY, wantM, wantR := RefLayerNorm(xv, wv, bv, rows, C, lnEps)
	ty, _, _, _ := RefLayerNormTerms(nil, xv, wv, bv, rows, C, lnEps)
	s.Close("y", s.Read(y), wantY, ty, s.Tol(dt))
	s.Close("mean", s.Read(mean), wantM, RefLayerNormMeanTerms(xv, rows, C), 1e-5)
	s.Close("rstd", s.Read(rstd), wantR, nil, 1e-5)

	dy, dyv := s.Rand(dt, 1, rows, C)
	dx := s.Empty(dt, rows, C)
	dw := s.Empty(tensor.F32, C)
	db := s.Empty(tensor.F32, C)
	s.NoErr("layernorm backward", s.E.LayerNormBackward(dx, dw, db, dy, x, w, mean, rstd, [3]bool{}))
	wdx, wdw, wdb := RefLayerNormBackward(dyv, xv, wv, rows, C, lnEps)
	_, tdx, tdw, tdb := RefLayerNormTerms(dyv, xv, wv, bv, rows, C, lnEps)
	s.Close("dx", s.Read(dx), wdx, tdx, s.Tol(dt))
	s.Close("dw", s.Read(dw), wdw, tdw, 1e-5)
	s.Close("db", s.Read(db), wdb, tdb, 1e-5)

	// Accumulate onto what is there; each flag alone, then all.
	for _, acc := range [][3]bool{{true, false, false}, {false, true, false}, {false, false, true}, {true, true, true}} {
		dx0, dx0v := s.Rand(dt, 1, rows, C)
		dw0, dw0v := s.Rand(tensor.F32, 1, C)
		db0, db0v := s.Rand(tensor.F32, 1, C)
		s.NoErr("layernorm backward (acc)", s.E.LayerNormBackward(dx0, dw0, db0, dy, x, w, mean, rstd, acc))
		for i, c := range []struct {
			what             string
			t                *tensor.Tensor
			old, want, terms []float64
			tol              float64
		}{{"dx", dx0, dx0v, wdx, tdx, s.Tol(dt)}, {"dw", dw0, dw0v, wdw, tdw, 1e-5}, {"db", db0, db0v, wdb, tdb, 1e-5}} {
			want, terms := c.want, c.terms
			if acc[i] {
				want, terms = lnSum(c.old, c.want), Sum(c.old, c.terms)
			}
			s.Close(fmt.Sprintf("%s (acc=%v)", c.what, acc), s.Read(c.t), want, terms, c.tol)
		}
	}
	// Only some gradients wanted.
	dw1 := s.Empty(tensor.F32, C)
	s.NoErr("layernorm backward (dw only)", s.E.LayerNormBackward(nil, dw1, nil, dy, x, w, mean, rstd, [3]bool{}))
	s.Close("dw (alone)", s.Read(dw1), wdw, tdw, 1e-5)
	dx1 := s.Empty(dt, rows, C)
	s.NoErr("layernorm backward (dx only)", s.E.LayerNormBackward(dx1, nil, nil, dy, x, w, mean, rstd, [3]bool{}))
	s.Close("dx (alone)", s.Read(dx1), wdx, tdx, s.Tol(dt))
}

// lnShifted is Suite.Rand with c added to every draw.
func lnShifted(s *Suite, dt tensor.DType, scale, c float64, shape ...int) (*tensor.Tensor, []float64) {
	v := make([]float64, tensor.Numel(shape))
	for i := range v {
		v[i] = c + scale*s.R.NormFloat64()
	}
	t := s.Const(dt, v, shape...)
	return t, s.Read(t)
}

func lnSum(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// lnStrided: x, y, dy and dx are column blocks of wider [2, 5, W] tensors,
// whose other columns must stay untouched.
func lnStrided(s *Suite, dt tensor.DType) {
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
	xw, xwv := s.Rand(dt, 1, b0, t0, W)
	x := view(xw)
	xv := cols(xwv)
	w, wv := s.Rand(tensor.F32, 1, C)
	b, bv := s.Rand(tensor.F32, 1, C)
	yw := s.Empty(dt, b0, t0, W)
	y := view(yw)
	mean := s.Empty(tensor.F32, b0, t0)
	rstd := s.Empty(tensor.F32, b0, t0)
	s.NoErr("layernorm", s.E.LayerNorm(y, mean, rstd, x, w, b, lnEps))
	want, _, _ := RefLayerNorm(xv, wv, bv, rows, C, lnEps)
	ty, _, _, _ := RefLayerNormTerms(nil, xv, wv, bv, rows, C, lnEps)
	s.Close("y (strided)", s.Read(y), want, ty, s.Tol(dt))
	lnUntouched(s, "y", s.Read(yw), rows, W, off, C)

	dyw, dywv := s.Rand(dt, 1, b0, t0, W)
	dy := view(dyw)
	dxw := s.Empty(dt, b0, t0, W)
	dx := view(dxw)
	dw := s.Empty(tensor.F32, C)
	db := s.Empty(tensor.F32, C)
	s.NoErr("layernorm backward", s.E.LayerNormBackward(dx, dw, db, dy, x, w, mean, rstd, [3]bool{}))
	wdx, wdw, wdb := RefLayerNormBackward(cols(dywv), xv, wv, rows, C, lnEps)
	_, tdx, tdw, tdb := RefLayerNormTerms(cols(dywv), xv, wv, bv, rows, C, lnEps)
	s.Close("dx (strided)", s.Read(dx), wdx, tdx, s.Tol(dt))
	s.Close("dw (strided)", s.Read(dw), wdw, tdw, 1e-5)
	s.Close("db (strided)", s.Read(db), wdb, tdb, 1e-5)
	lnUntouched(s, "dx", s.Read(dxw), rows, W, off, C)
}

// lnUntouched fails unless every element of a poisoned [rows, W] tensor
// outside columns [off, off+C) is still NaN.
func lnUntouched(s *Suite, what string, all []float64, rows, W, off, C int) {
	s.T.Helper()
	for r := 0; r < rows; r++ {
		for j := 0; j < W; j++ {
			if (j < off || j >= off+C) && !math.IsNaN(all[r*W+j]) {
				s.T.Fatalf("%s: element [%d,%d] outside the view was written", what, r, j)
			}
		}
	}
}

func lnGrad(s *Suite, dt tensor.DType) {
	const b0, t0, C = 2, 3, 7
	for _, affine := range []bool{true, false} {
		params := [][]int{{b0, t0, C}}
		if affine {
			params = append(params, []int{C}, []int{C})
		}
		s.GradCheck(GradCase{
			Name: fmt.Sprintf("layernorm affine=%v", affine), DType: dt, Params: params,
			PDTypes: []tensor.DType{0, tensor.F32, tensor.F32}, Twice: true,
			Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var {
				if affine {
					return g.LayerNorm(p[0], p[1], p[2], lnEps)
				}
				return g.LayerNorm(p[0], nil, nil, lnEps)
			},
			Ref: func(p [][]float64) []float64 {
				var w, b []float64
				if affine {
					w, b = p[1], p[2]
				}
				y, _, _ := RefLayerNorm(p[0], w, b, b0*t0, C, lnEps)
				return y
			},
		})
	}
}

func lnValidation(s *Suite) {
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
		{"y of another shape", s.E.LayerNorm(s.Empty(tensor.F32, 4, 5), st, st, x, w, nil, lnEps)},
		{"y of another dtype", s.E.LayerNorm(s.Empty(tensor.BF16, 4, 6), st, st, x, w, nil, lnEps)},
		{"w of the wrong length", s.E.LayerNorm(y, st, st, x, s.Empty(tensor.F32, 5), nil, lnEps)},
		{"bf16 w", s.E.LayerNorm(y, st, st, x, s.Empty(tensor.BF16, 6), nil, lnEps)},
		{"mean of the wrong length", s.E.LayerNorm(y, s.Empty(tensor.F32, 3), st, x, w, nil, lnEps)},
		{"bf16 rstd", s.E.LayerNorm(y, st, s.Empty(tensor.BF16, 4), x, w, nil, lnEps)},
		{"i32 x", s.E.LayerNorm(y, st, st, s.Empty(tensor.I32, 4, 6), w, nil, lnEps)},
		{"negative eps", s.E.LayerNorm(y, st, st, x, w, nil, -1)},
		{"NaN eps", s.E.LayerNorm(y, st, st, x, w, nil, float32(math.NaN()))},
		{"missing y", s.E.LayerNorm(nil, st, st, x, w, nil, lnEps)},
		{"unmergeable rows", s.E.LayerNorm(yperm, nil, nil, perm, nil, nil, lnEps)},
		{"backward without mean", s.E.LayerNormBackward(y, w, w, y, x, w, nil, st, [3]bool{})},
		{"backward dy of another shape", s.E.LayerNormBackward(y, w, w, s.Empty(tensor.F32, 4, 5), x, w, st, st, [3]bool{})},
		{"backward dx of another dtype", s.E.LayerNormBackward(s.Empty(tensor.BF16, 4, 6), w, w, y, x, w, st, st, [3]bool{})},
		{"backward dw of the wrong length", s.E.LayerNormBackward(y, s.Empty(tensor.F32, 7), nil, y, x, w, st, st, [3]bool{})},
	}
	for _, c := range bad {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
	if err := s.E.LayerNorm(yperm, nil, nil, perm, nil, nil, lnEps); !errors.Is(err, tensor.ErrLayout) {
		s.T.Errorf("unmergeable rows: %v, want ErrLayout", err)
	}
	// The graph refuses parameters that are not f32 [C] when recording.
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{})
	defer g.Free()
	xv := g.Input("x", x)
	if g.LayerNorm(xv, g.Input("w", s.Empty(tensor.BF16, 6)), nil, lnEps) != nil || g.Err() == nil {
		s.T.Error("graph layernorm with a bf16 weight was recorded")
	}
}

// addlnRef is AddLayerNorm's reference: the stored sum (x + r rounded to
// dt, as the op stores it), and the LayerNorm of that sum.
func addlnRef(s *Suite, dt tensor.DType, xv, rv, wv, bv []float64, rows, C int) (sum, y, mean, rstd []float64) {
	sum = make([]float64, len(xv))
	for i := range sum {
		sum[i] = xv[i] + rv[i]
	}
	sum = s.Read(s.Const(dt, sum, len(sum)))
	y, mean, rstd = RefLayerNorm(sum, wv, bv, rows, C, lnEps)
	return sum, y, mean, rstd
}

// addlnForwardBackward checks AddLayerNorm (outputs poisoned; sum exact)
// and AddLayerNormBackward: written, accumulated flag by flag, without
// dsum, and with only some gradients wanted.
func addlnForwardBackward(s *Suite, dt tensor.DType, rows, C int, affine bool) {
	x, xv := lnShifted(s, dt, 1.5, 3, rows, C)
	r, rv := s.Rand(dt, 1, rows, C)
	var w, b *tensor.Tensor
	var wv, bv []float64
	if affine {
		w, wv = s.Rand(tensor.F32, 1, C)
		b, bv = s.Rand(tensor.F32, 1, C)
	}
	sum, y := s.Empty(dt, rows, C), s.Empty(dt, rows, C)
	mean, rstd := s.Empty(tensor.F32, rows), s.Empty(tensor.F32, rows)
	s.NoErr("addlayernorm", s.E.AddLayerNorm(sum, y, mean, rstd, x, r, w, b, lnEps))
	wantS, wantY, wantM, wantR := addlnRef(s, dt, xv, rv, wv, bv, rows, C)
	s.Close("sum", s.Read(sum), wantS, nil, 0)
	s.Close("y", s.Read(y), wantY, lnYTerms(wantS, wv, bv, rows, C), s.Tol(dt))
	s.Close("mean", s.Read(mean), wantM, RefLayerNormMeanTerms(wantS, rows, C), 1e-5)
	s.Close("rstd", s.Read(rstd), wantR, nil, 1e-5)

	dy, dyv := s.Rand(dt, 1, rows, C)
	dsum, dsumv := s.Rand(dt, 1, rows, C)
	wdx, wdw, wdb := RefLayerNormBackward(dyv, wantS, wv, rows, C, lnEps)
	_, tdx, tdw, tdb := RefLayerNormTerms(dyv, wantS, wv, bv, rows, C, lnEps)
	wt, tt := lnSum(wdx, dsumv), Sum(tdx, dsumv)
	dx, dr := s.Empty(dt, rows, C), s.Empty(dt, rows, C)
	dw, db := s.Empty(tensor.F32, C), s.Empty(tensor.F32, C)
	s.NoErr("addlayernorm backward", s.E.AddLayerNormBackward(dx, dr, dw, db, dy, dsum, sum, w, mean, rstd, [4]bool{}))
	s.Close("dx", s.Read(dx), wt, tt, s.Tol(dt))
	s.Close("dr", s.Read(dr), wt, tt, s.Tol(dt))
	s.Close("dw", s.Read(dw), wdw, tdw, 1e-5)
	s.Close("db", s.Read(db), wdb, tdb, 1e-5)

	for _, acc := range [][4]bool{{true, false, false, false}, {false, true, false, false}, {false, false, true, false},
		{false, false, false, true}, {true, true, true, true}} {
		outs := make([]*tensor.Tensor, 4)
		olds := make([][]float64, 4)
		outs[0], olds[0] = s.Rand(dt, 1, rows, C)
		outs[1], olds[1] = s.Rand(dt, 1, rows, C)
		outs[2], olds[2] = s.Rand(tensor.F32, 1, C)
		outs[3], olds[3] = s.Rand(tensor.F32, 1, C)
		s.NoErr("addlayernorm backward (acc)", s.E.AddLayerNormBackward(outs[0], outs[1], outs[2], outs[3], dy, dsum, sum, w, mean, rstd, acc))
		terms := [][]float64{tt, tt, tdw, tdb}
		for i, want := range [][]float64{wt, wt, wdw, wdb} {
			ti := terms[i]
			if acc[i] {
				want, ti = lnSum(olds[i], want), Sum(olds[i], ti)
			}
			what := fmt.Sprintf("%s (acc=%v)", []string{"dx", "dr", "dw", "db"}[i], acc)
			tol := 1e-5
			if i < 2 {
				tol = s.Tol(dt)
			}
			s.Close(what, s.Read(outs[i]), want, ti, tol)
		}
	}
	// No dsum (sum's gradient is LayerNorm's alone); only some outputs.
	dx1, dw1 := s.Empty(dt, rows, C), s.Empty(tensor.F32, C)
	s.NoErr("addlayernorm backward (no dsum)", s.E.AddLayerNormBackward(dx1, nil, dw1, nil, dy, nil, sum, w, mean, rstd, [4]bool{}))
	s.Close("dx (no dsum)", s.Read(dx1), wdx, tdx, s.Tol(dt))
	s.Close("dw (no dsum)", s.Read(dw1), wdw, tdw, 1e-5)
	dr2 := s.Empty(dt, rows, C)
	s.NoErr("addlayernorm backward (dr only)", s.E.AddLayerNormBackward(nil, dr2, nil, nil, dy, dsum, sum, w, mean, rstd, [4]bool{}))
	s.Close("dr (alone)", s.Read(dr2), wt, tt, s.Tol(dt))
	db3 := s.Empty(tensor.F32, C)
	s.NoErr("addlayernorm backward (db only)", s.E.AddLayerNormBackward(nil, nil, nil, db3, dy, dsum, sum, w, mean, rstd, [4]bool{}))
	s.Close("db (alone)", s.Read(db3), wdb, tdb, 1e-5)
	// dx written over dsum itself (in place).
	s.NoErr("addlayernorm backward (dx = dsum)", s.E.AddLayerNormBackward(dsum, nil, nil, nil, dy, dsum, sum, w, mean, rstd, [4]bool{}))
	s.Close("dx = dsum", s.Read(dsum), wt, tt, s.Tol(dt))
}

// addlnInPlace: sum written over x (x = x + r), as a residual stream does.
func addlnInPlace(s *Suite, dt tensor.DType) {
	const rows, C = 37, 384
	x, xv := lnShifted(s, dt, 1, 1, rows, C)
	r, rv := s.Rand(dt, 1, rows, C)
	w, wv := s.Rand(tensor.F32, 1, C)
	y := s.Empty(dt, rows, C)
	mean, rstd := s.Empty(tensor.F32, rows), s.Empty(tensor.F32, rows)
	s.NoErr("addlayernorm in place", s.E.AddLayerNorm(x, y, mean, rstd, x, r, w, nil, lnEps))
	wantS, wantY, _, _ := addlnRef(s, dt, xv, rv, wv, nil, rows, C)
	s.Close("sum = x", s.Read(x), wantS, nil, 0)
	s.Close("y", s.Read(y), wantY, lnYTerms(wantS, wv, nil, rows, C), s.Tol(dt))
}

// addlnStrided: x, r, sum, y, dy, dsum, dx, dr are column blocks of wider
// tensors whose other columns must stay untouched.
func addlnStrided(s *Suite, dt tensor.DType) {
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
	b, bv := s.Rand(tensor.F32, 1, C)
	sumw, yw := s.Empty(dt, b0, t0, W), s.Empty(dt, b0, t0, W)
	sum, y := view(sumw), view(yw)
	mean, rstd := s.Empty(tensor.F32, b0, t0), s.Empty(tensor.F32, b0, t0)
	s.NoErr("addlayernorm", s.E.AddLayerNorm(sum, y, mean, rstd, x, r, w, b, lnEps))
	wantS, wantY, _, _ := addlnRef(s, dt, xv, rv, wv, bv, rows, C)
	s.Close("sum (strided)", s.Read(sum), wantS, nil, 0)
	s.Close("y (strided)", s.Read(y), wantY, lnYTerms(wantS, wv, bv, rows, C), s.Tol(dt))
	lnUntouched(s, "sum", s.Read(sumw), rows, W, off, C)
	lnUntouched(s, "y", s.Read(yw), rows, W, off, C)

	dy, dyv := rnd()
	dsum, dsumv := rnd()
	dxw, drw := s.Empty(dt, b0, t0, W), s.Empty(dt, b0, t0, W)
	dw, db := s.Empty(tensor.F32, C), s.Empty(tensor.F32, C)
	s.NoErr("addlayernorm backward", s.E.AddLayerNormBackward(view(dxw), view(drw), dw, db, dy, dsum, sum, w, mean, rstd, [4]bool{}))
	wdx, wdw, wdb := RefLayerNormBackward(dyv, wantS, wv, rows, C, lnEps)
	_, tdx, tdw, tdb := RefLayerNormTerms(dyv, wantS, wv, bv, rows, C, lnEps)
	wt, tt := lnSum(wdx, dsumv), Sum(tdx, dsumv)
	s.Close("dx (strided)", s.Read(view(dxw)), wt, tt, s.Tol(dt))
	s.Close("dr (strided)", s.Read(view(drw)), wt, tt, s.Tol(dt))
	s.Close("dw (strided)", s.Read(dw), wdw, tdw, 1e-5)
	s.Close("db (strided)", s.Read(db), wdb, tdb, 1e-5)
	lnUntouched(s, "dx", s.Read(dxw), rows, W, off, C)
	lnUntouched(s, "dr", s.Read(drw), rows, W, off, C)
}

// addlnGrad: Graph.AddLayerNorm against finite differences, with the
// gradient reaching sum from another consumer (sum + y), from y alone and
// from sum alone, twice (fan-out), and with x and r the same Var.
func addlnGrad(s *Suite, dt tensor.DType) {
	const b0, t0, C = 2, 3, 7
	rows := b0 * t0
	ref := func(p [][]float64, affine bool) (sum, y []float64) {
		sum = lnSum(p[0], p[1])
		var w, b []float64
		if affine {
			w, b = p[2], p[3]
		}
		y, _, _ = RefLayerNorm(sum, w, b, rows, C, lnEps)
		return sum, y
	}
	for _, c := range []struct {
		name   string
		affine bool
		out    func(g *ops.Graph, sum, y *ops.Var) *ops.Var
		ref    func(sum, y []float64) []float64
	}{
		{"sum+y", true, func(g *ops.Graph, sum, y *ops.Var) *ops.Var { return g.Add(sum, y) }, lnSum},
		{"y", true, func(g *ops.Graph, _, y *ops.Var) *ops.Var { return y }, func(_, y []float64) []float64 { return y }},
		{"sum", true, func(g *ops.Graph, sum, _ *ops.Var) *ops.Var { return sum }, func(sum, _ []float64) []float64 { return sum }},
		{"sum+y no affine", false, func(g *ops.Graph, sum, y *ops.Var) *ops.Var { return g.Add(sum, y) }, lnSum},
	} {
		params := [][]int{{b0, t0, C}, {b0, t0, C}}
		if c.affine {
			params = append(params, []int{C}, []int{C})
		}
		s.GradCheck(GradCase{
			Name: "addlayernorm " + c.name, DType: dt, Params: params,
			PDTypes: []tensor.DType{0, 0, tensor.F32, tensor.F32}, Twice: true,
			Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var {
				var sum, y *ops.Var
				if c.affine {
					sum, y = g.AddLayerNorm(p[0], p[1], p[2], p[3], lnEps)
				} else {
					sum, y = g.AddLayerNorm(p[0], p[1], nil, nil, lnEps)
				}
				if sum == nil {
					return nil
				}
				return c.out(g, sum, y)
			},
			Ref: func(p [][]float64) []float64 { return c.ref(ref(p, c.affine)) },
		})
	}
	s.GradCheck(GradCase{
		Name: "addlayernorm x+x", DType: dt, Params: [][]int{{b0, t0, C}, {C}}, PDTypes: []tensor.DType{0, tensor.F32}, Twice: true,
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var {
			sum, y := g.AddLayerNorm(p[0], p[0], p[1], nil, lnEps)
			if sum == nil {
				return nil
			}
			return g.Add(sum, y)
		},
		Ref: func(p [][]float64) []float64 {
			sum := lnSum(p[0], p[0])
			y, _, _ := RefLayerNorm(sum, p[1], nil, rows, C, lnEps)
			return lnSum(sum, y)
		},
	})
}

func addlnValidation(s *Suite) {
	x := s.Empty(tensor.F32, 4, 6)
	y := s.Empty(tensor.F32, 4, 6)
	st := s.Empty(tensor.F32, 4)
	wide := s.Empty(tensor.F32, 4, 12)
	lo, _ := wide.Narrow(1, 0, 6)
	mid, _ := wide.Narrow(1, 3, 6)
	for _, c := range []struct {
		what string
		err  error
	}{
		{"no r", s.E.AddLayerNorm(y, y, st, st, x, nil, nil, nil, lnEps)},
		{"no sum", s.E.AddLayerNorm(nil, y, st, st, x, x, nil, nil, lnEps)},
		{"r of another shape", s.E.AddLayerNorm(s.Empty(tensor.F32, 4, 6), y, st, st, x, s.Empty(tensor.F32, 4, 5), nil, nil, lnEps)},
		{"sum of another dtype", s.E.AddLayerNorm(s.Empty(tensor.BF16, 4, 6), y, st, st, x, x, nil, nil, lnEps)},
		{"backward dsum of another shape", s.E.AddLayerNormBackward(y, nil, nil, nil, y, s.Empty(tensor.F32, 4, 5), x, nil, st, st, [4]bool{})},
		{"backward dx and dr overlap", s.E.AddLayerNormBackward(lo, mid, nil, nil, y, nil, x, nil, st, st, [4]bool{})},
		{"backward dx and dr the same", s.E.AddLayerNormBackward(y, y, nil, nil, x, nil, x, nil, st, st, [4]bool{})},
	} {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
}
