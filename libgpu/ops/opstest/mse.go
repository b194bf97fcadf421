package opstest

import (
	"fmt"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "mse", Check: checkMSE}) }

// RefMSE is mean((p − y)²) and its gradient 2(p − y)/n.
func RefMSE(p, y []float64) (float64, []float64) {
	var s float64
	g := make([]float64, len(p))
	for i := range p {
		d := p[i] - y[i]
		s += d * d
		g[i] = 2 * d / float64(len(p))
	}
	return s / float64(len(p)), g
}

func checkMSE(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, n := range []int{1, 37, 5000, 300000} {
			s.Run(fmt.Sprintf("%v/n=%d", dt, n), func(s *Suite) {
				p, pv := s.Rand(dt, 1, n)
				y, yv := s.Rand(dt, 1, n)
				loss := s.Empty(tensor.F32, 1)
				dp := s.Empty(dt, n)
				s.NoErr("mse", s.E.MSELoss(loss, dp, p, y, false))
				wl, wg := RefMSE(pv, yv)
				s.Close("loss", s.Read(loss), []float64{wl}, nil, 1e-5)
				s.Close("dpred", s.Read(dp), wg, nil, s.Tol(dt))
				dp0, dp0v := s.Rand(dt, 1, n)
				s.NoErr("mse (acc)", s.E.MSELoss(loss, dp0, p, y, true))
				s.CloseAcc("dpred (acc)", s.Read(dp0), dp0v, wg, nil, s.Tol(dt))
				s.NoErr("mse (no gradient)", s.E.MSELoss(loss, nil, p, y, false))
				s.Close("loss (no gradient)", s.Read(loss), []float64{wl}, nil, 1e-5)
			})
		}
		s.Run(fmt.Sprintf("%v/graph", dt), func(s *Suite) {
			// loss = mse(scale(x, 3), y): dx = 3·2(3x − y)/n.
			g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Autocast: dt})
			defer g.Free()
			x, xv := s.Rand(dt, 1, 4, 5)
			y, yv := s.Rand(dt, 1, 4, 5)
			xp := g.Param("x", x, s.Empty(dt, 4, 5))
			l := g.MSELoss(g.Scale(xp, 3), g.Input("y", y))
			s.NoErr("build", g.Build(true))
			s.NoErr("forward", g.Forward())
			s.NoErr("backward", g.Backward())
			p := make([]float64, len(xv))
			for i := range p {
				p[i] = 3 * xv[i]
			}
			wl, wg := RefMSE(p, yv)
			for i := range wg {
				wg[i] *= 3
			}
			s.Close("graph loss", s.Read(l.Value), []float64{wl}, nil, 2*s.Tol(dt))
			s.Close("graph dx", s.Read(xp.Grad), wg, nil, 2*s.Tol(dt))
		})
	}
	s.Run("validation", func(s *Suite) {
		p := s.Empty(tensor.F32, 4)
		l := s.Empty(tensor.F32, 1)
		for _, c := range []struct {
			what string
			err  error
		}{
			{"target of another shape", s.E.MSELoss(l, nil, p, s.Empty(tensor.F32, 5), false)},
			{"target of another dtype", s.E.MSELoss(l, nil, p, s.Empty(tensor.BF16, 4), false)},
			{"loss of two elements", s.E.MSELoss(s.Empty(tensor.F32, 2), nil, p, p, false)},
			{"bf16 loss", s.E.MSELoss(s.Empty(tensor.BF16, 1), nil, p, p, false)},
			{"no elements", s.E.MSELoss(l, nil, s.Empty(tensor.F32, 0), s.Empty(tensor.F32, 0), false)},
		} {
			if c.err == nil {
				s.T.Errorf("%s: accepted", c.what)
			}
		}
	})
}
