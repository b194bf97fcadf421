package opstest

import (
	"fmt"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "chanbias", Check: checkChanBias}) }

// RefAddChannels is y[n, s, c] = x[n, s, c] + b[n, c] for x [N, S, C].
func RefAddChannels(x, b []float64, n, c int) []float64 {
	per := len(x) / n
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = v + b[(i/per)*c+i%c]
	}
	return y
}

// RefSpatialSum is out[n, c] = Σ_s x[n, s, c] for x [N, S, C].
func RefSpatialSum(x []float64, n, s, c int) []float64 {
	out := make([]float64, n*c)
	for i := 0; i < n; i++ {
		for j := 0; j < s; j++ {
			for k := 0; k < c; k++ {
				out[i*c+k] += x[(i*s+j)*c+k]
			}
		}
	}
	return out
}

func checkChanBias(s *Suite) {
	for _, dt := range s.DTypes() {
		// C a multiple of 8 (vectorised) and not; several samples.
		for _, sh := range [][3]int{{1, 1, 1}, {2, 9, 8}, {3, 25, 5}, {4, 64, 32}, {2, 7, 13}} {
			n, sp, c := sh[0], sh[1], sh[2]
			s.Run(fmt.Sprintf("%v/add/%dx%dx%d", dt, n, sp, c), func(s *Suite) {
				x, xv := s.Rand(dt, 1, n, sp, c)
				b, bv := s.Rand(dt, 1, n, c)
				y := s.Empty(dt, n, sp, c)
				s.NoErr("add channels", s.E.AddChannels(y, x, b))
				want := RefAddChannels(xv, bv, n, c)
				s.Close("y", s.Read(y), want, nil, s.Tol(dt))
				s.NoErr("add channels in place", s.E.AddChannels(x, x, b))
				s.Close("x += b", s.Read(x), want, nil, s.Tol(dt))
			})
		}
		// Sums over few and over many rows (several chunks per sample),
		// into f32 and into the input's dtype, written and accumulated.
		for _, sh := range [][3]int{{1, 1, 3}, {2, 10, 40}, {3, 700, 9}, {1, 5000, 33}} {
			n, sp, c := sh[0], sh[1], sh[2]
			for _, odt := range []tensor.DType{tensor.F32, dt} {
				s.Run(fmt.Sprintf("%v/sum/%dx%dx%d/into-%v", dt, n, sp, c, odt), func(s *Suite) {
					x, xv := s.Rand(dt, 1, n, sp, c)
					want := RefSpatialSum(xv, n, sp, c)
					out := s.Empty(odt, n, c)
					s.NoErr("spatial sum", s.E.SpatialSum(out, x, false))
					tol := 1e-5
					if odt == tensor.BF16 {
						tol = 1e-2
					}
					terms := RefSpatialSum(Abs(xv), n, sp, c)
					s.Close("sum", s.Read(out), want, terms, tol)
					o0, o0v := s.Rand(odt, 1, n, c)
					s.NoErr("spatial sum (acc)", s.E.SpatialSum(o0, x, true))
					s.Close("sum (acc)", s.Read(o0), lnSum(o0v, want), Sum(o0v, terms), tol)
				})
			}
		}
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) {
			const n, sp, c = 2, 6, 5
			s.GradCheck(GradCase{
				Name: "add channels", DType: dt, Params: [][]int{{n, 2, 3, c}, {n, c}}, Twice: true,
				Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.AddChannels(p[0], p[1]) },
				Ref:    func(p [][]float64) []float64 { return RefAddChannels(p[0], p[1], n, c) },
			})
		})
	}
	s.Run("validation", func(s *Suite) {
		x := s.Empty(tensor.F32, 2, 3, 4)
		for _, c := range []struct {
			what string
			err  error
		}{
			{"b of the wrong shape", s.E.AddChannels(x, x, s.Empty(tensor.F32, 2, 3))},
			{"b of another dtype", s.E.AddChannels(x, x, s.Empty(tensor.BF16, 2, 4))},
			{"y of another shape", s.E.AddChannels(s.Empty(tensor.F32, 2, 4, 3), x, s.Empty(tensor.F32, 2, 4))},
			{"rank-1 x", s.E.AddChannels(s.Empty(tensor.F32, 4), s.Empty(tensor.F32, 4), s.Empty(tensor.F32, 1, 4))},
			{"sum of a rank-2 x", s.E.SpatialSum(s.Empty(tensor.F32, 2, 4), s.Empty(tensor.F32, 2, 4), false)},
			{"sum into the wrong shape", s.E.SpatialSum(s.Empty(tensor.F32, 3, 4), x, false)},
			{"sum into i32", s.E.SpatialSum(s.Empty(tensor.I32, 2, 4), x, false)},
		} {
			if c.err == nil {
				s.T.Errorf("%s: accepted", c.what)
			}
		}
	})
}
