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
	}
	s.Run("validation", lnValidation)
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
	s.Near("y", s.Read(y), wantY, s.Tol(dt))
	s.Near("mean", s.Read(mean), wantM, 1e-5)
	s.Near("rstd", s.Read(rstd), wantR, 1e-5)

	dy, dyv := s.Rand(dt, 1, rows, C)
	dx := s.Empty(dt, rows, C)
	dw := s.Empty(tensor.F32, C)
	db := s.Empty(tensor.F32, C)
	s.NoErr("layernorm backward", s.E.LayerNormBackward(dx, dw, db, dy, x, w, mean, rstd, [3]bool{}))
	wdx, wdw, wdb := RefLayerNormBackward(dyv, xv, wv, rows, C, lnEps)
	// dx's natural scale is rstd·|w|·|dy|: with C = 1 the exact dx is 0
	// and rstd = 1/√eps amplifies the rounding of x − mean.
	dxFloor := norm(dyv) * maxAbs(wv, 1) * maxAbs(wantR, 1)
	s.NearFloor("dx", s.Read(dx), wdx, dxFloor, s.Tol(dt))
	s.Near("dw", s.Read(dw), wdw, 1e-5)
	s.Near("db", s.Read(db), wdb, 1e-5)

	// Accumulate onto what is there; each flag alone, then all.
	for _, acc := range [][3]bool{{true, false, false}, {false, true, false}, {false, false, true}, {true, true, true}} {
		dx0, dx0v := s.Rand(dt, 1, rows, C)
		dw0, dw0v := s.Rand(tensor.F32, 1, C)
		db0, db0v := s.Rand(tensor.F32, 1, C)
		s.NoErr("layernorm backward (acc)", s.E.LayerNormBackward(dx0, dw0, db0, dy, x, w, mean, rstd, acc))
		for i, c := range []struct {
			what       string
			t          *tensor.Tensor
			old, want  []float64
			tol, floor float64
		}{{"dx", dx0, dx0v, wdx, s.Tol(dt), dxFloor}, {"dw", dw0, dw0v, wdw, 1e-5, 0}, {"db", db0, db0v, wdb, 1e-5, 0}} {
			want := c.want
			if acc[i] {
				want = lnSum(c.old, c.want)
			}
			if c.floor > 0 {
				s.NearFloor(fmt.Sprintf("%s (acc=%v)", c.what, acc), s.Read(c.t), want, max(c.floor, norm(want)), c.tol)
			} else {
				s.Near(fmt.Sprintf("%s (acc=%v)", c.what, acc), s.Read(c.t), want, c.tol)
			}
		}
	}
	// Only some gradients wanted.
	dw1 := s.Empty(tensor.F32, C)
	s.NoErr("layernorm backward (dw only)", s.E.LayerNormBackward(nil, dw1, nil, dy, x, w, mean, rstd, [3]bool{}))
	s.Near("dw (alone)", s.Read(dw1), wdw, 1e-5)
	dx1 := s.Empty(dt, rows, C)
	s.NoErr("layernorm backward (dx only)", s.E.LayerNormBackward(dx1, nil, nil, dy, x, w, mean, rstd, [3]bool{}))
	s.NearFloor("dx (alone)", s.Read(dx1), wdx, dxFloor, s.Tol(dt))
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
	s.Near("y (strided)", s.Read(y), want, s.Tol(dt))
	lnUntouched(s, "y", s.Read(yw), rows, W, off, C)

	dyw, dywv := s.Rand(dt, 1, b0, t0, W)
	dy := view(dyw)
	dxw := s.Empty(dt, b0, t0, W)
	dx := view(dxw)
	dw := s.Empty(tensor.F32, C)
	db := s.Empty(tensor.F32, C)
	s.NoErr("layernorm backward", s.E.LayerNormBackward(dx, dw, db, dy, x, w, mean, rstd, [3]bool{}))
	wdx, wdw, wdb := RefLayerNormBackward(cols(dywv), xv, wv, rows, C, lnEps)
	s.Near("dx (strided)", s.Read(dx), wdx, s.Tol(dt))
	s.Near("dw (strided)", s.Read(dw), wdw, 1e-5)
	s.Near("db (strided)", s.Read(db), wdb, 1e-5)
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
