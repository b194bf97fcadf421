package opstest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "groupedgemm", Check: checkGrouped}) }

// GroupedGeom is a grouped product: E groups, T rows, w [E, N, K], and the
// groups' row offsets (E+1 entries).
type GroupedGeom struct {
	E, T, N, K int
	Off        []int32
}

// RefGroupedMatmul is the float64 reference of ops.Engine.GroupedMatmul:
// y[r, n] = Σ_k x[r, k]·w[g, n, k] + b[g, n] for the rows r of each group
// g (b may be nil), and mag, the same sums of |terms| (the scale of each
// element's rounding error). Rows outside every group are NaN in both.
func RefGroupedMatmul(x, w, b []float64, g GroupedGeom) (y, mag []float64) {
	y, mag = nanSlice(g.T*g.N), nanSlice(g.T*g.N)
	for e := 0; e < g.E; e++ {
		for r := int(g.Off[e]); r < int(g.Off[e+1]); r++ {
			for n := 0; n < g.N; n++ {
				var s, m float64
				if b != nil {
					s, m = b[e*g.N+n], math.Abs(b[e*g.N+n])
				}
				for k := 0; k < g.K; k++ {
					t := x[r*g.K+k] * w[(e*g.N+n)*g.K+k]
					s, m = s+t, m+math.Abs(t)
				}
				y[r*g.N+n], mag[r*g.N+n] = s, m
			}
		}
	}
	return y, mag
}

// RefGroupedBackward is the float64 reference of
// ops.Engine.GroupedMatmulBackward: dx [T, K] (NaN outside every group),
// dw [E, N, K] and db [E, N] (zero for empty groups), each with the sums
// of |terms| beside it.
func RefGroupedBackward(dy, x, w []float64, g GroupedGeom) (dx, dxMag, dw, dwMag, db, dbMag []float64) {
	dx, dxMag = nanSlice(g.T*g.K), nanSlice(g.T*g.K)
	dw, dwMag = make([]float64, g.E*g.N*g.K), make([]float64, g.E*g.N*g.K)
	db, dbMag = make([]float64, g.E*g.N), make([]float64, g.E*g.N)
	for e := 0; e < g.E; e++ {
		r0, r1 := int(g.Off[e]), int(g.Off[e+1])
		for r := r0; r < r1; r++ {
			for k := 0; k < g.K; k++ {
				var s, m float64
				for n := 0; n < g.N; n++ {
					t := dy[r*g.N+n] * w[(e*g.N+n)*g.K+k]
					s, m = s+t, m+math.Abs(t)
				}
				dx[r*g.K+k], dxMag[r*g.K+k] = s, m
			}
			for n := 0; n < g.N; n++ {
				d := dy[r*g.N+n]
				db[e*g.N+n] += d
				dbMag[e*g.N+n] += math.Abs(d)
				for k := 0; k < g.K; k++ {
					t := d * x[r*g.K+k]
					dw[(e*g.N+n)*g.K+k] += t
					dwMag[(e*g.N+n)*g.K+k] += math.Abs(t)
				}
			}
		}
	}
	return
}

func nanSlice(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = math.NaN()
	}
	return v
}

// GroupOffsets returns the offsets of E groups over the rows [lo, hi) in
// one of the layouts the checks use: "balanced" (sizes differ by at most
// one), "skewed" (sizes ∝ 1, 2, 4, ...: the last group is the busiest),
// "empty" (the first, the last and every third group empty, the rest
// random), "one" (one random group takes every row), "random".
func GroupOffsets(r *rand.Rand, kind string, e, lo, hi int) []int32 {
	n := hi - lo
	w := make([]float64, e)
	switch kind {
	case "balanced":
		for i := range w {
			w[i] = 1
		}
	case "skewed":
		for i := range w {
			w[i] = math.Pow(2, float64(i)*4/float64(max(e-1, 1)))
		}
	case "empty":
		for i := range w {
			if i != 0 && i != e-1 && i%3 != 0 {
				w[i] = r.Float64() + 0.1
			}
		}
		if e <= 2 {
			w[0] = 1
		}
	case "one":
		w[r.IntN(e)] = 1
	default:
		for i := range w {
			w[i] = r.Float64()
		}
	}
	var tot float64
	for _, v := range w {
		tot += v
	}
	off := make([]int32, e+1)
	off[0] = int32(lo)
	var acc float64
	for i := 0; i < e; i++ {
		acc += w[i]
		off[i+1] = int32(lo + int(math.Round(float64(n)*acc/tot)))
	}
	off[e] = int32(hi)
	return off
}

func checkGrouped(s *Suite) {
	// Shapes: odd edges (CUDA cores), multiples of 8 that are not of 64
	// (wgmma on sm_90a, with zero-filled chunks), and one with several
	// tiles per group in every direction.
	shapes := []struct{ e, t, n, k int }{{3, 29, 7, 5}, {5, 150, 37, 19}, {4, 300, 136, 72}, {6, 700, 264, 200}}
	kinds := []string{"balanced", "skewed", "empty", "one"}
	for _, dt := range s.DTypes() {
		for si, sh := range shapes {
			for ki, kind := range kinds {
				if si == len(shapes)-1 && ki > 1 {
					continue // the large shape: balanced and skewed
				}
				for _, out := range []tensor.DType{dt, tensor.F32} {
					if out == dt && dt == tensor.F32 && ki%2 == 1 {
						continue
					}
					name := fmt.Sprintf("%v/out=%v/E%d,T%d,N%d,K%d/%s", dt, out, sh.e, sh.t, sh.n, sh.k, kind)
					s.Run(name, func(s *Suite) {
						groupedCase(s, dt, out, GroupedGeom{E: sh.e, T: sh.t, N: sh.n, K: sh.k,
							Off: GroupOffsets(s.R, kind, sh.e, 0, sh.t)}, ki == 1, si%2 == 0)
					})
				}
			}
		}
		// Rows before the first and after the last group are left alone.
		s.Run(fmt.Sprintf("%v/outside-rows", dt), func(s *Suite) {
			groupedCase(s, dt, dt, GroupedGeom{E: 3, T: 90, N: 40, K: 24, Off: GroupOffsets(s.R, "random", 3, 11, 70)}, false, true)
		})
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) { groupedGrad(s, dt) })
	}
	s.Run("validation", groupedValidation)
}

// groupedCase runs the forward and backward at g with outputs of dtype
// out, poisoned first (with acc: holding random values the results are
// added to), against the references.
func groupedCase(s *Suite, dt, out tensor.DType, g GroupedGeom, acc, bias bool) {
	x, xv := s.Rand(dt, 1, g.T, g.K)
	w, wv := s.Rand(dt, 1, g.E, g.N, g.K)
	dy, dyv := s.Rand(dt, 1, g.T, g.N)
	var b *tensor.Tensor
	var bv []float64
	if bias {
		b, bv = s.Rand(dt, 1, g.E, g.N)
	}
	off := UploadI32(s.T, s.A, g.Off, g.E+1)
	tol := s.GemmTol(dt)
	if dt == tensor.BF16 {
		tol = s.Tol(out) // bf16 products are exact in f32: the output's rounding is what is left
	}
	// dst returns an output tensor of shape: NaN-poisoned, or with acc
	// random values (returned) that the result must be added to.
	dst := func(shape ...int) (*tensor.Tensor, []float64) {
		if acc {
			return s.Rand(out, 1, shape...)
		}
		return s.Empty(out, shape...), nil
	}
	plus := func(want, old []float64) []float64 {
		if old == nil {
			return want
		}
		v := make([]float64, len(want))
		for i := range v {
			if math.IsNaN(want[i]) {
				v[i] = old[i] // outside every group: untouched
			} else {
				v[i] = want[i] + old[i]
			}
		}
		return v
	}
	y, y0 := dst(g.T, g.N)
	s.NoErr("grouped matmul", s.E.GroupedMatmul(y, x, w, b, off, acc))
	wantY, magY := RefGroupedMatmul(xv, wv, bv, g)
	groupedNear(s, "y", s.Read(y), plus(wantY, y0), magY, tol)

	dx, dx0 := dst(g.T, g.K)
	dw, dw0 := dst(g.E, g.N, g.K)
	db, db0 := dst(g.E, g.N)
	s.NoErr("grouped matmul backward", s.E.GroupedMatmulBackward(dx, dw, db, dy, x, w, off, [3]bool{acc, acc, acc}))
	wdx, mdx, wdw, mdw, wdb, mdb := RefGroupedBackward(dyv, xv, wv, g)
	groupedNear(s, "dx", s.Read(dx), plus(wdx, dx0), mdx, tol)
	groupedNear(s, "dw", s.Read(dw), plus(wdw, dw0), mdw, tol)
	groupedNear(s, "db", s.Read(db), plus(wdb, db0), mdb, tol)

	// Each gradient alone (the others nil) gives the same values.
	if !acc {
		dw2 := s.Empty(out, g.E, g.N, g.K)
		s.NoErr("grouped matmul backward (dw only)", s.E.GroupedMatmulBackward(nil, dw2, nil, dy, x, w, off, [3]bool{}))
		groupedNear(s, "dw alone", s.Read(dw2), wdw, mdw, tol)
	}
}

// groupedNear compares got with want where want is a number, relative to
// the terms' size mag (Close; nil: want's); where want is NaN (rows
// outside every group, not written) got must be NaN too (poison kept).
func groupedNear(s *Suite, what string, got, want, mag []float64, tol float64) {
	s.T.Helper()
	var g, w, t []float64
	kept := 0
	for i := range want {
		if math.IsNaN(want[i]) {
			if !math.IsNaN(got[i]) {
				kept++
			}
			continue
		}
		g, w = append(g, got[i]), append(w, want[i])
		if mag != nil && !math.IsNaN(mag[i]) {
			t = append(t, mag[i])
		} else {
			t = append(t, 0)
		}
	}
	if kept > 0 {
		s.T.Errorf("%s: %d elements outside every group were written", what, kept)
	}
	s.Close(what, g, w, t, tol)
}

// groupedGrad checks Graph.GroupedLinear's gradients (x, w, b) against
// finite differences, recorded twice (fan-out accumulation); under bf16
// autocast w and b are f32 masters used through bf16 copies.
func groupedGrad(s *Suite, dt tensor.DType) {
	g := GroupedGeom{E: 4, T: 13, N: 6, K: 5}
	g.Off = GroupOffsets(s.R, "empty", g.E, 0, g.T)
	off := UploadI32(s.T, s.A, g.Off, g.E+1)
	s.GradCheck(GradCase{
		Name: "grouped_linear", DType: dt, Params: [][]int{{g.T, g.K}, {g.E, g.N, g.K}, {g.E, g.N}},
		PDTypes: []tensor.DType{dt, tensor.F32, tensor.F32}, Twice: true,
		Record: func(gr *ops.Graph, p, _ []*ops.Var) *ops.Var { return gr.GroupedLinear(p[0], p[1], p[2], off) },
		// Under bf16 the op multiplies bf16 copies of w and b: the
		// reference uses the masters (the copies' rounding is within the
		// forward tolerance, and keeps the differences smooth).
		Ref: func(p [][]float64) []float64 {
			y, _ := RefGroupedMatmul(p[0], p[1], p[2], g)
			return y
		},
	})
}

func groupedValidation(s *Suite) {
	x := s.Empty(tensor.F32, 10, 4)
	w := s.Empty(tensor.F32, 3, 5, 4)
	y := s.Empty(tensor.F32, 10, 5)
	off := UploadI32(s.T, s.A, []int32{0, 3, 3, 10}, 4)
	bad := []struct {
		what string
		err  error
	}{
		{"w of another K", s.E.GroupedMatmul(y, x, s.Empty(tensor.F32, 3, 5, 3), nil, off, false)},
		{"y of another N", s.E.GroupedMatmul(s.Empty(tensor.F32, 10, 4), x, w, nil, off, false)},
		{"offsets of E entries", s.E.GroupedMatmul(y, x, w, nil, UploadI32(s.T, s.A, []int32{0, 3, 10}, 3), false)},
		{"f32 offsets", s.E.GroupedMatmul(y, x, w, nil, s.Empty(tensor.F32, 4), false)},
		{"bf16 w with f32 x", s.E.GroupedMatmul(y, x, s.Empty(tensor.BF16, 3, 5, 4), nil, off, false)},
		{"bf16 y of f32 operands", s.E.GroupedMatmul(s.Empty(tensor.BF16, 10, 5), x, w, nil, off, false)},
		{"bias of another shape", s.E.GroupedMatmul(y, x, w, s.Empty(tensor.F32, 5), off, false)},
		{"dx of another shape", s.E.GroupedMatmulBackward(s.Empty(tensor.F32, 10, 5), nil, nil, y, x, w, off, [3]bool{})},
		{"dy of another shape", s.E.GroupedMatmulBackward(nil, s.Empty(tensor.F32, 3, 5, 4), nil, x, x, w, off, [3]bool{})},
	}
	for _, b := range bad {
		if b.err == nil {
			s.T.Errorf("%s: accepted", b.what)
		}
	}
	if !s.E.IsGraphCapable() { // the host checks offsets; CUDA reads them on the device and clamps
		for _, o := range [][]int32{{0, 5, 4, 10}, {-1, 3, 3, 10}, {0, 3, 3, 11}} {
			if s.E.GroupedMatmul(y, x, w, nil, UploadI32(s.T, s.A, o, 4), false) == nil {
				s.T.Errorf("offsets %v: accepted", o)
			}
		}
	}
}
