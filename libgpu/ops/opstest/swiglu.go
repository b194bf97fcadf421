package opstest

import (
	"fmt"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "swiglu", Check: checkSwiGLU}) }

// RefSwiGLU is the float64 reference of ops.Engine.SwiGLU on row-major gu
// [rows, 2I]: y = silu(gate)·up.
func RefSwiGLU(gu []float64, rows, I int) []float64 {
	y := make([]float64, rows*I)
	for r := 0; r < rows; r++ {
		for j := 0; j < I; j++ {
			y[r*I+j] = RefSiLU(gu[r*2*I+j]) * gu[r*2*I+I+j]
		}
	}
	return y
}

// RefSwiGLUBackward is its gradient [rows, 2I]: dgate = dy·up·silu'(g),
// dup = dy·silu(g).
func RefSwiGLUBackward(dy, gu []float64, rows, I int) []float64 {
	d := make([]float64, rows*2*I)
	for r := 0; r < rows; r++ {
		for j := 0; j < I; j++ {
			g, u, dd := gu[r*2*I+j], gu[r*2*I+I+j], dy[r*I+j]
			d[r*2*I+j] = dd * u * RefSiLUGrad(g)
			d[r*2*I+I+j] = dd * RefSiLU(g)
		}
	}
	return d
}

func checkSwiGLU(s *Suite) {
	s.Run("inter", func(s *Suite) {
		for _, c := range []struct {
			hidden int
			exp    float64
			want   int
		}{{512, 4, 1536}, {384, 4, 1024}, {768, 4, 2048}, {96, 2, 256}, {1, 1, 256}, {3, 1.5, 256}} {
			if got := ops.SwiGLUInter(c.hidden, c.exp); got != c.want {
				s.T.Errorf("SwiGLUInter(%d, %v) = %d, want %d", c.hidden, c.exp, got, c.want)
			}
		}
	})
	for _, dt := range s.DTypes() {
		for _, sh := range [][2]int{{1, 1}, {3, 7}, {5, 8}, {33, 24}, {4, 1536}} {
			s.Run(fmt.Sprintf("%v/%dx%d", dt, sh[0], 2*sh[1]), func(s *Suite) { swigluCase(s, dt, sh[0], sh[1]) })
		}
		s.Run(fmt.Sprintf("%v/strided", dt), func(s *Suite) { swigluStrided(s, dt) })
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) {
			const B, T, I = 2, 3, 5
			s.GradCheck(GradCase{
				Name: "swiglu", DType: dt, Params: [][]int{{B, T, 2 * I}}, Twice: true, Scale: 2,
				Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.SwiGLU(p[0]) },
				Ref:    func(p [][]float64) []float64 { return RefSwiGLU(p[0], B*T, I) },
			})
		})
	}
	s.Run("validation", swigluValidation)
}

// swigluCase: forward (poisoned), backward written, accumulated, and in
// place over gu.
func swigluCase(s *Suite, dt tensor.DType, rows, I int) {
	gu, guv := s.Rand(dt, 2, rows, 2*I)
	y := s.Empty(dt, rows, I)
	s.NoErr("swiglu", s.E.SwiGLU(y, gu))
	s.Close("y", s.Read(y), RefSwiGLU(guv, rows, I), nil, s.Tol(dt))
	dy, dyv := s.Rand(dt, 1, rows, I)
	want := RefSwiGLUBackward(dyv, guv, rows, I)
	dgu := s.Empty(dt, rows, 2*I)
	s.NoErr("swiglu backward", s.E.SwiGLUBackward(dgu, dy, gu, false))
	s.Close("dgu", s.Read(dgu), want, nil, s.Tol(dt))
	old, oldv := s.Rand(dt, 1, rows, 2*I)
	s.NoErr("swiglu backward (acc)", s.E.SwiGLUBackward(old, dy, gu, true))
	s.CloseAcc("dgu (acc)", s.Read(old), oldv, want, nil, s.Tol(dt))
	s.NoErr("swiglu backward (in place)", s.E.SwiGLUBackward(gu, dy, gu, false))
	s.Close("dgu = gu", s.Read(gu), want, nil, s.Tol(dt))
}

// swigluStrided: gu, y, dy, dgu are column blocks of wider tensors, whose
// other columns stay untouched.
func swigluStrided(s *Suite, dt tensor.DType) {
	const rows, I, W, off = 6, 16, 40, 3
	view := func(t *tensor.Tensor, n int) *tensor.Tensor {
		v, err := t.Narrow(1, off, n)
		s.NoErr("narrow", err)
		return v
	}
	cols := func(wide []float64, n int) []float64 {
		out := make([]float64, 0, rows*n)
		for r := 0; r < rows; r++ {
			out = append(out, wide[r*W+off:r*W+off+n]...)
		}
		return out
	}
	guw, guwv := s.Rand(dt, 1, rows, W)
	gu, guv := view(guw, 2*I), cols(guwv, 2*I)
	yw := s.Empty(dt, rows, W)
	s.NoErr("swiglu", s.E.SwiGLU(view(yw, I), gu))
	s.Close("y (strided)", s.Read(view(yw, I)), RefSwiGLU(guv, rows, I), nil, s.Tol(dt))
	lnUntouched(s, "y", s.Read(yw), rows, W, off, I)
	dyw, dywv := s.Rand(dt, 1, rows, W)
	dgw := s.Empty(dt, rows, W)
	s.NoErr("swiglu backward", s.E.SwiGLUBackward(view(dgw, 2*I), view(dyw, I), gu, false))
	s.Close("dgu (strided)", s.Read(view(dgw, 2*I)), RefSwiGLUBackward(cols(dywv, I), guv, rows, I), nil, s.Tol(dt))
	lnUntouched(s, "dgu", s.Read(dgw), rows, W, off, 2*I)
}

func swigluValidation(s *Suite) {
	gu := s.Empty(tensor.F32, 4, 6)
	y := s.Empty(tensor.F32, 4, 3)
	bad := []struct {
		what string
		err  error
	}{
		{"odd gu", s.E.SwiGLU(s.Empty(tensor.F32, 4, 2), s.Empty(tensor.F32, 4, 5))},
		{"y of another width", s.E.SwiGLU(s.Empty(tensor.F32, 4, 6), gu)},
		{"y of another dtype", s.E.SwiGLU(s.Empty(tensor.BF16, 4, 3), gu)},
		{"i32 gu", s.E.SwiGLU(s.Empty(tensor.I32, 4, 3), s.Empty(tensor.I32, 4, 6))},
		{"missing y", s.E.SwiGLU(nil, gu)},
		{"backward dgu of y's shape", s.E.SwiGLUBackward(y, y, gu, false)},
		{"backward dy of gu's shape", s.E.SwiGLUBackward(gu, gu, gu, false)},
		{"backward missing dy", s.E.SwiGLUBackward(gu, nil, gu, false)},
	}
	for _, c := range bad {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{})
	defer g.Free()
	if g.SwiGLU(g.Input("gu", s.Empty(tensor.F32, 4, 5))) != nil || g.Err() == nil {
		s.T.Error("graph swiglu of an odd width was recorded")
	}
}
