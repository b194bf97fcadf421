package opstest

import (
	"fmt"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "add", Check: checkAdd}) }

func checkAdd(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, n := range []int{1, 9, 1003, 4096} {
			s.Run(fmt.Sprintf("%v/add/n=%d", dt, n), func(s *Suite) { addCheck(s, dt, n) })
		}
		for _, from := range s.DTypes() {
			for _, acc := range []bool{false, true} {
				for _, sc := range []float32{1, -0.375} {
					s.Run(fmt.Sprintf("scale/%v<-%v/s=%v/acc=%v", dt, from, sc, acc), func(s *Suite) { scaleCheck(s, dt, from, 1003, sc, acc, 0) })
				}
			}
		}
		s.Run(fmt.Sprintf("%v/scale/misaligned", dt), func(s *Suite) { scaleCheck(s, dt, dt, 1003, 0.5, true, 3) })
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) { addGrad(s, dt) })
	}
	s.Run("validation", func(s *Suite) {
		a := s.Empty(tensor.F32, 4, 3)
		for _, c := range []struct {
			what string
			err  error
		}{
			{"b of another shape", s.E.Add(a, a, s.Empty(tensor.F32, 3, 4))},
			{"b of another dtype", s.E.Add(a, a, s.Empty(tensor.BF16, 4, 3))},
			{"y of another dtype", s.E.Add(s.Empty(tensor.BF16, 4, 3), a, a)},
			{"i32", s.E.Add(s.Empty(tensor.I32, 2), s.Empty(tensor.I32, 2), s.Empty(tensor.I32, 2))},
			{"scale into another shape", s.E.Scale(s.Empty(tensor.F32, 12), a, 2, false)},
			{"missing y", s.E.Scale(nil, a, 2, false)},
		} {
			if c.err == nil {
				s.T.Errorf("%s: accepted", c.what)
			}
		}
		tr, _ := a.Transpose(0, 1)
		if err := s.E.Add(s.Empty(tensor.F32, 3, 4), tr, tr); err == nil {
			s.T.Error("a non-contiguous operand was accepted")
		}
		g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{})
		defer g.Free()
		if g.Add(g.Input("a", a), g.Input("b", s.Empty(tensor.BF16, 4, 3))) != nil || g.Err() == nil {
			s.T.Error("graph add of mixed dtypes was recorded")
		}
	})
}

func addCheck(s *Suite, dt tensor.DType, n int) {
	a, av := s.Rand(dt, 1, n)
	b, bv := s.Rand(dt, 1, n)
	y := s.Empty(dt, n)
	s.NoErr("add", s.E.Add(y, a, b))
	want := lnSum(av, bv)
	s.Close("y", s.Read(y), want, nil, s.Tol(dt))
	// In place, as a residual update: a ← a + b.
	s.NoErr("add in place", s.E.Add(a, a, b))
	s.Close("a += b", s.Read(a), want, nil, s.Tol(dt))
}

// scaleCheck checks y (+)= s·x for y of dtype dt, x of dtype from, n
// elements starting off elements into their buffers.
func scaleCheck(s *Suite, dt, from tensor.DType, n int, sc float32, acc bool, off int) {
	xw, xwv := s.Rand(from, 1, n+off)
	x, err := xw.Narrow(0, off, n)
	s.NoErr("narrow", err)
	yw, ywv := s.Rand(dt, 1, n+off)
	y, err := yw.Narrow(0, off, n)
	s.NoErr("narrow", err)
	s.NoErr("scale", s.E.Scale(y, x, sc, acc))
	want := make([]float64, n)
	for i := range want {
		want[i] = float64(sc) * xwv[off+i]
		if acc {
			want[i] += ywv[off+i]
		}
	}
	s.Close("y", s.Read(y), want, nil, s.Tol(dt))
}

func addGrad(s *Suite, dt tensor.DType) {
	const n = 2 * 3 * 5
	s.GradCheck(GradCase{
		Name: "add", DType: dt, Params: [][]int{{2, 3, 5}, {2, 3, 5}}, Twice: true,
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.Add(p[0], p[1]) },
		Ref:    func(p [][]float64) []float64 { return lnSum(p[0], p[1]) },
	})
	// A value added to itself: its gradient is 2·dy, through the second
	// write accumulating onto the first.
	s.GradCheck(GradCase{
		Name: "add self", DType: dt, Params: [][]int{{n}},
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.Add(p[0], p[0]) },
		Ref:    func(p [][]float64) []float64 { return lnSum(p[0], p[0]) },
	})
	// A residual block: y = x + s·x.
	s.GradCheck(GradCase{
		Name: "residual scale", DType: dt, Params: [][]int{{n}}, Twice: true,
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.Add(p[0], g.Scale(p[0], -0.75)) },
		Ref: func(p [][]float64) []float64 {
			return geluMap(p[0], func(x float64) float64 { return x - 0.75*x })
		},
	})
}
