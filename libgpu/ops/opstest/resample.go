package opstest

import (
	"fmt"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "resample", Check: checkResample}) }

// RefAvgPool2D is k×k average pooling of x [N, H, W, C] (channels last).
func RefAvgPool2D(x []float64, n, h, w, c, k int) []float64 {
	ho, wo := h/k, w/k
	y := make([]float64, n*ho*wo*c)
	for b := 0; b < n; b++ {
		for i := 0; i < ho; i++ {
			for j := 0; j < wo; j++ {
				for ch := 0; ch < c; ch++ {
					var s float64
					for a := 0; a < k; a++ {
						for q := 0; q < k; q++ {
							s += x[((b*h+i*k+a)*w+j*k+q)*c+ch]
						}
					}
					y[((b*ho+i)*wo+j)*c+ch] = s / float64(k*k)
				}
			}
		}
	}
	return y
}

// RefUpsample2D is k× nearest-neighbour upsampling of x [N, H, W, C].
func RefUpsample2D(x []float64, n, h, w, c, k int) []float64 {
	y := make([]float64, n*h*k*w*k*c)
	for b := 0; b < n; b++ {
		for i := 0; i < h*k; i++ {
			for j := 0; j < w*k; j++ {
				for ch := 0; ch < c; ch++ {
					y[((b*h*k+i)*w*k+j)*c+ch] = x[((b*h+i/k)*w+j/k)*c+ch]
				}
			}
		}
	}
	return y
}

// transposeRef is the adjoint of a linear map f from n inputs: column i
// of f's matrix, applied to dy (the gradient of Σ dy·f(x)).
func transposeRef(f func([]float64) []float64, n int, dy []float64) []float64 {
	out := make([]float64, n)
	e := make([]float64, n)
	for i := range e {
		e[i] = 1
		col := f(e)
		e[i] = 0
		var s float64
		for j, v := range col {
			s += v * dy[j]
		}
		out[i] = s
	}
	return out
}

func checkResample(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, sh := range [][5]int{{1, 2, 2, 1, 2}, {2, 6, 4, 3, 2}, {2, 8, 8, 16, 2}, {1, 9, 6, 5, 3}, {1, 3, 3, 2, 1}} {
			n, h, w, c, k := sh[0], sh[1], sh[2], sh[3], sh[4]
			s.Run(fmt.Sprintf("%v/%dx%dx%dx%d/k=%d", dt, n, h, w, c, k), func(s *Suite) {
				x, xv := s.Rand(dt, 1, n, h, w, c)
				pool := func(v []float64) []float64 { return RefAvgPool2D(v, n, h, w, c, k) }
				y := s.Empty(dt, n, h/k, w/k, c)
				s.NoErr("avgpool", s.E.AvgPool2D(y, x, k))
				s.Close("avgpool", s.Read(y), pool(xv), nil, s.Tol(dt))
				dy, dyv := s.Rand(dt, 1, n, h/k, w/k, c)
				want := transposeRef(pool, len(xv), dyv)
				dx := s.Empty(dt, n, h, w, c)
				s.NoErr("avgpool backward", s.E.AvgPool2DBackward(dx, dy, k, false))
				s.Close("avgpool dx", s.Read(dx), want, nil, s.Tol(dt))
				dx0, dx0v := s.Rand(dt, 1, n, h, w, c)
				s.NoErr("avgpool backward (acc)", s.E.AvgPool2DBackward(dx0, dy, k, true))
				s.CloseAcc("avgpool dx (acc)", s.Read(dx0), dx0v, want, nil, s.Tol(dt))

				up := func(v []float64) []float64 { return RefUpsample2D(v, n, h, w, c, k) }
				u := s.Empty(dt, n, h*k, w*k, c)
				s.NoErr("upsample", s.E.Upsample2D(u, x, k))
				s.Close("upsample", s.Read(u), up(xv), nil, 0)
				du, duv := s.Rand(dt, 1, n, h*k, w*k, c)
				wantU := transposeRef(up, len(xv), duv)
				dxu := s.Empty(dt, n, h, w, c)
				s.NoErr("upsample backward", s.E.Upsample2DBackward(dxu, du, k, false))
				s.Close("upsample dx", s.Read(dxu), wantU, nil, s.Tol(dt))
				s.NoErr("upsample backward (acc)", s.E.Upsample2DBackward(dx0, du, k, true))
				s.CloseAcc("upsample dx (acc)", s.Read(dx0), lnSum(dx0v, want), wantU, Sum(want, wantU), 2*s.Tol(dt))
			})
		}
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) {
			s.GradCheck(GradCase{
				Name: "avgpool", DType: dt, Params: [][]int{{2, 4, 6, 3}}, Twice: true,
				Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.AvgPool2D(p[0], 2) },
				Ref:    func(p [][]float64) []float64 { return RefAvgPool2D(p[0], 2, 4, 6, 3, 2) },
			})
			s.GradCheck(GradCase{
				Name: "upsample", DType: dt, Params: [][]int{{2, 2, 3, 3}}, Twice: true,
				Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.Upsample2D(p[0], 2) },
				Ref:    func(p [][]float64) []float64 { return RefUpsample2D(p[0], 2, 2, 3, 3, 2) },
			})
		})
	}
	s.Run("validation", func(s *Suite) {
		x := s.Empty(tensor.F32, 1, 4, 4, 2)
		for _, c := range []struct {
			what string
			err  error
		}{
			{"pool of an odd size", s.E.AvgPool2D(s.Empty(tensor.F32, 1, 2, 2, 2), s.Empty(tensor.F32, 1, 5, 4, 2), 2)},
			{"pool into the wrong shape", s.E.AvgPool2D(s.Empty(tensor.F32, 1, 2, 2, 3), x, 2)},
			{"pool into another dtype", s.E.AvgPool2D(s.Empty(tensor.BF16, 1, 2, 2, 2), x, 2)},
			{"factor 0", s.E.AvgPool2D(x, x, 0)},
			{"upsample into the wrong shape", s.E.Upsample2D(s.Empty(tensor.F32, 1, 8, 7, 2), x, 2)},
			{"rank-3", s.E.Upsample2D(s.Empty(tensor.F32, 8, 8, 2), s.Empty(tensor.F32, 4, 4, 2), 2)},
		} {
			if c.err == nil {
				s.T.Errorf("%s: accepted", c.what)
			}
		}
	})
}
