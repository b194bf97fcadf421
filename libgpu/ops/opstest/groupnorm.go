package opstest

import (
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "groupnorm", Check: checkGroupNorm}) }

// GNGeom is a GroupNorm problem: N samples of S positions of C channels
// in G groups (channels last).
type GNGeom struct{ N, S, C, G int }

func sigmoid(z float64) float64 { return 1 / (1 + math.Exp(-z)) }

// RefGroupNorm is the float64 reference of ops.Engine.GroupNorm: per
// (n, g) the mean and biased variance over S·C/G values, z = x̂·w + b (w,
// b nil: ones, zeros), y = z or z·σ(z) with silu. It returns y and the
// [N, G] mean and rstd.
func RefGroupNorm(x, w, b []float64, g GNGeom, eps float64, silu bool) (y, mean, rstd []float64) {
	cg := g.C / g.G
	y = make([]float64, len(x))
	mean = make([]float64, g.N*g.G)
	rstd = make([]float64, g.N*g.G)
	for n := 0; n < g.N; n++ {
		for q := 0; q < g.G; q++ {
			var s float64
			for p := 0; p < g.S; p++ {
				for c := q * cg; c < (q+1)*cg; c++ {
					s += x[(n*g.S+p)*g.C+c]
				}
			}
			mu := s / float64(g.S*cg)
			var v float64
			for p := 0; p < g.S; p++ {
				for c := q * cg; c < (q+1)*cg; c++ {
					d := x[(n*g.S+p)*g.C+c] - mu
					v += d * d
				}
			}
			r := 1 / math.Sqrt(v/float64(g.S*cg)+eps)
			for p := 0; p < g.S; p++ {
				for c := q * cg; c < (q+1)*cg; c++ {
					i := (n*g.S+p)*g.C + c
					z := (x[i] - mu) * r
					if w != nil {
						z *= w[c]
					}
					if b != nil {
						z += b[c]
					}
					if silu {
						z *= sigmoid(z)
					}
					y[i] = z
				}
			}
			mean[n*g.G+q], rstd[n*g.G+q] = mu, r
		}
	}
	return y, mean, rstd
}

// RefGroupNormTerms is the terms' size (TermsErr) of RefGroupNorm's y
// and RefGroupNormBackward's gradients, as RefLayerNormTerms over each
// group: x − μ sums |x| and |μ| (X = (|x| + |μ|)·rstd), z sums X·|w| and
// |b|, SiLU's derivative is taken as 1 (it lies in [−0.1, 1.1]); dx sums
// rstd·(|g| + mean|g| + X·mean(|g|·X)) with g = dz·w, dw and db sum |dz|·X
// and |dz|. dy may be nil (y alone).
func RefGroupNormTerms(dy, x, w, b []float64, gm GNGeom, eps float64) (y, dx, dw, db []float64) {
	_, mean, rstd := RefGroupNorm(x, nil, nil, gm, eps, false)
	cg := gm.C / gm.G
	y, dx = make([]float64, len(x)), make([]float64, len(x))
	dw, db = make([]float64, gm.C), make([]float64, gm.C)
	wAt := func(c int) float64 {
		if w == nil {
			return 1
		}
		return math.Abs(w[c])
	}
	m := float64(gm.S * cg)
	for n := 0; n < gm.N; n++ {
		for q := 0; q < gm.G; q++ {
			mu, r := mean[n*gm.G+q], rstd[n*gm.G+q]
			var a1, a2 float64
			each := func(f func(i, c int, X float64)) {
				for p := 0; p < gm.S; p++ {
					for c := q * cg; c < (q+1)*cg; c++ {
						i := (n*gm.S+p)*gm.C + c
						f(i, c, (math.Abs(x[i])+math.Abs(mu))*r)
					}
				}
			}
			each(func(i, c int, X float64) {
				y[i] = X * wAt(c)
				if b != nil {
					y[i] += math.Abs(b[c])
				}
				if dy == nil {
					return
				}
				d := math.Abs(dy[i])
				a1 += d * wAt(c)
				a2 += d * wAt(c) * X
				dw[c] += d * X
				db[c] += d
			})
			if dy == nil {
				continue
			}
			each(func(i, c int, X float64) {
				dx[i] = r * (math.Abs(dy[i])*wAt(c) + a1/m + X*a2/m)
			})
		}
	}
	return y, dx, dw, db
}

// RefGroupNormBackward is the float64 reference of the GroupNorm
// gradients (the chain rule through z = x̂·w + b and SiLU, and the
// normalisation's Jacobian: dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) over the
// group, g = dz·w).
func RefGroupNormBackward(dy, x, w, b []float64, gm GNGeom, eps float64, silu bool) (dx, dw, db []float64) {
	_, mean, rstd := RefGroupNorm(x, nil, nil, gm, eps, false)
	cg := gm.C / gm.G
	dx = make([]float64, len(x))
	dw = make([]float64, gm.C)
	db = make([]float64, gm.C)
	wAt := func(c int) float64 {
		if w == nil {
			return 1
		}
		return w[c]
	}
	bAt := func(c int) float64 {
		if b == nil {
			return 0
		}
		return b[c]
	}
	m := float64(gm.S * cg)
	for n := 0; n < gm.N; n++ {
		for q := 0; q < gm.G; q++ {
			mu, r := mean[n*gm.G+q], rstd[n*gm.G+q]
			dz := func(i, c int) (float64, float64) {
				h := (x[i] - mu) * r
				d := dy[i]
				if silu {
					z := h*wAt(c) + bAt(c)
					sg := sigmoid(z)
					d *= sg * (1 + z*(1-sg))
				}
				return d, h
			}
			var a1, a2 float64
			for p := 0; p < gm.S; p++ {
				for c := q * cg; c < (q+1)*cg; c++ {
					i := (n*gm.S+p)*gm.C + c
					d, h := dz(i, c)
					a1 += d * wAt(c)
					a2 += d * wAt(c) * h
					dw[c] += d * h
					db[c] += d
				}
			}
			for p := 0; p < gm.S; p++ {
				for c := q * cg; c < (q+1)*cg; c++ {
					i := (n*gm.S+p)*gm.C + c
					d, h := dz(i, c)
					dx[i] = r * (d*wAt(c) - a1/m - h*a2/m)
				}
			}
		}
	}
	return dx, dw, db
}

// gnGeoms: one group and one channel per group; channels multiples of 8
// (vectorised) and not; positions that leave the last thread rows short;
// a U-Net's 8×8×256 in 32 groups and 32×32×64.
var gnGeoms = []GNGeom{{1, 1, 1, 1}, {2, 5, 6, 3}, {3, 7, 8, 8}, {2, 9, 24, 4}, {2, 37, 64, 32},
	{1, 64, 256, 32}, {2, 1024, 64, 32}, {1, 3, 40, 5}, {2, 10, 1032, 8}}

const gnEps = 1e-5

func checkGroupNorm(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, g := range gnGeoms {
			for _, silu := range []bool{false, true} {
				s.Run(fmt.Sprintf("%v/N%dS%dC%dG%d/silu=%v", dt, g.N, g.S, g.C, g.G, silu), func(s *Suite) {
					gnForwardBackward(s, dt, g, silu, true)
				})
			}
		}
		s.Run(fmt.Sprintf("%v/no-affine", dt), func(s *Suite) { gnForwardBackward(s, dt, GNGeom{2, 6, 16, 4}, true, false) })
		for _, silu := range []bool{false, true} {
			s.Run(fmt.Sprintf("%v/grad/silu=%v", dt, silu), func(s *Suite) {
				g := GNGeom{2, 6, 6, 3}
				tol := 0.0
				if dt == tensor.BF16 {
					tol = 3e-2 // x̂ from a bf16 x, the sums in f32: the FD check of a sum-to-zero Jacobian
				}
				s.GradCheck(GradCase{
					Name: "groupnorm", DType: dt, Params: [][]int{{g.N, 2, 3, g.C}, {g.C}, {g.C}},
					PDTypes: []tensor.DType{0, tensor.F32, tensor.F32}, Twice: true, TolB: tol,
					Record: func(gr *ops.Graph, p, _ []*ops.Var) *ops.Var { return gr.GroupNorm(p[0], p[1], p[2], g.G, gnEps, silu) },
					Ref: func(p [][]float64) []float64 {
						y, _, _ := RefGroupNorm(p[0], p[1], p[2], g, gnEps, silu)
						return y
					},
				})
			})
		}
	}
	s.Run("validation", gnValidation)
}

func gnForwardBackward(s *Suite, dt tensor.DType, g GNGeom, silu, affine bool) {
	// An offset mean, so that a one-pass variance would lose digits.
	x, xv := lnShifted(s, dt, 1.5, 3, g.N, g.S, g.C)
	var w, b *tensor.Tensor
	var wv, bv []float64
	if affine {
		w, wv = s.Rand(tensor.F32, 1, g.C)
		b, bv = s.Rand(tensor.F32, 1, g.C)
	}
	y := s.Empty(dt, g.N, g.S, g.C)
	mean := s.Empty(tensor.F32, g.N, g.G)
	rstd := s.Empty(tensor.F32, g.N, g.G)
	s.NoErr("groupnorm", s.E.GroupNorm(y, mean, rstd, x, w, b, g.G, gnEps, silu))
	wy, wm, wr := RefGroupNorm(xv, wv, bv, g, gnEps, silu)
	ty, _, _, _ := RefGroupNormTerms(nil, xv, wv, bv, g, gnEps)
	s.Close("y", s.Read(y), wy, ty, s.Tol(dt))
	s.Close("mean", s.Read(mean), wm, nil, 1e-5)
	s.Close("rstd", s.Read(rstd), wr, nil, 1e-4)

	dy, dyv := s.Rand(dt, 1, g.N, g.S, g.C)
	wdx, wdw, wdb := RefGroupNormBackward(dyv, xv, wv, bv, g, gnEps, silu)
	// With one value per group the exact dx is 0 and 1/√eps amplifies the
	// rounding of x − μ: the terms say so.
	_, tdx, tdw, tdb := RefGroupNormTerms(dyv, xv, wv, bv, g, gnEps)
	tol := s.Tol(dt)
	dx := s.Empty(dt, g.N, g.S, g.C)
	dw := s.Empty(tensor.F32, g.C)
	db := s.Empty(tensor.F32, g.C)
	s.NoErr("groupnorm backward", s.E.GroupNormBackward(dx, dw, db, dy, x, w, b, mean, rstd, g.G, silu, [3]bool{}))
	s.Close("dx", s.Read(dx), wdx, tdx, tol)
	s.Close("dw", s.Read(dw), wdw, tdw, 1e-4)
	s.Close("db", s.Read(db), wdb, tdb, 1e-4)
	for _, acc := range [][3]bool{{true, false, false}, {false, true, true}} {
		dx0, dx0v := s.Rand(dt, 1, g.N, g.S, g.C)
		dw0, dw0v := s.Rand(tensor.F32, 1, g.C)
		db0, db0v := s.Rand(tensor.F32, 1, g.C)
		s.NoErr("groupnorm backward (acc)", s.E.GroupNormBackward(dx0, dw0, db0, dy, x, w, b, mean, rstd, g.G, silu, acc))
		for i, c := range []struct {
			what             string
			t                *tensor.Tensor
			old, want, terms []float64
			tol              float64
		}{{"dx", dx0, dx0v, wdx, tdx, tol}, {"dw", dw0, dw0v, wdw, tdw, 1e-4}, {"db", db0, db0v, wdb, tdb, 1e-4}} {
			want, terms := c.want, c.terms
			if acc[i] {
				want, terms = lnSum(c.old, c.want), Sum(c.old, c.terms)
			}
			s.Close(fmt.Sprintf("%s (acc=%v)", c.what, acc), s.Read(c.t), want, terms, c.tol)
		}
	}
	dw1 := s.Empty(tensor.F32, g.C)
	s.NoErr("groupnorm backward (dw only)", s.E.GroupNormBackward(nil, dw1, nil, dy, x, w, b, mean, rstd, g.G, silu, [3]bool{}))
	s.Close("dw (alone)", s.Read(dw1), wdw, tdw, 1e-4)
	// In place: y = x.
	s.NoErr("groupnorm in place", s.E.GroupNorm(x, nil, nil, x, w, b, g.G, gnEps, silu))
	s.Close("y = x in place", s.Read(x), wy, ty, s.Tol(dt))
}

func gnValidation(s *Suite) {
	x := s.Empty(tensor.F32, 2, 3, 8)
	y := s.Empty(tensor.F32, 2, 3, 8)
	st := s.Empty(tensor.F32, 2, 4)
	for _, c := range []struct {
		what string
		err  error
	}{
		{"groups not dividing C", s.E.GroupNorm(y, nil, nil, x, nil, nil, 3, gnEps, false)},
		{"zero groups", s.E.GroupNorm(y, nil, nil, x, nil, nil, 0, gnEps, false)},
		{"negative eps", s.E.GroupNorm(y, nil, nil, x, nil, nil, 4, -1, false)},
		{"w of the wrong size", s.E.GroupNorm(y, nil, nil, x, s.Empty(tensor.F32, 4), nil, 4, gnEps, false)},
		{"bf16 w", s.E.GroupNorm(y, nil, nil, x, s.Empty(tensor.BF16, 8), nil, 4, gnEps, false)},
		{"mean of the wrong size", s.E.GroupNorm(y, s.Empty(tensor.F32, 2, 3), nil, x, nil, nil, 4, gnEps, false)},
		{"y of another dtype", s.E.GroupNorm(s.Empty(tensor.BF16, 2, 3, 8), nil, nil, x, nil, nil, 4, gnEps, false)},
		{"rank-1 x", s.E.GroupNorm(s.Empty(tensor.F32, 8), nil, nil, s.Empty(tensor.F32, 8), nil, nil, 4, gnEps, false)},
		{"backward without stats", s.E.GroupNormBackward(y, nil, nil, y, x, nil, nil, nil, nil, 4, false, [3]bool{})},
		{"backward dy of another shape", s.E.GroupNormBackward(y, nil, nil, s.Empty(tensor.F32, 2, 8, 3), x, nil, nil, st, st, 4, false, [3]bool{})},
		{"backward bf16 dw", s.E.GroupNormBackward(nil, s.Empty(tensor.BF16, 8), nil, y, x, nil, nil, st, st, 4, false, [3]bool{})},
	} {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
}
