package opstest

import (
	"fmt"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "concat", Check: checkConcat}) }

// RefConcat is torch.cat([a, b], dim=-1) for rows of ca and cb elements.
func RefConcat(a, b []float64, ca, cb int) []float64 {
	rows := 0
	if ca > 0 {
		rows = len(a) / ca
	} else if cb > 0 {
		rows = len(b) / cb
	}
	y := make([]float64, 0, rows*(ca+cb))
	for r := 0; r < rows; r++ {
		y = append(y, a[r*ca:(r+1)*ca]...)
		y = append(y, b[r*cb:(r+1)*cb]...)
	}
	return y
}

func checkConcat(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, sh := range [][3]int{{1, 1, 1}, {6, 3, 5}, {2 * 4 * 4, 64, 128}, {7, 0, 4}} {
			rows, ca, cb := sh[0], sh[1], sh[2]
			s.Run(fmt.Sprintf("%v/%dx(%d+%d)", dt, rows, ca, cb), func(s *Suite) {
				a, av := s.Rand(dt, 1, rows, ca)
				b, bv := s.Rand(dt, 1, rows, cb)
				y := s.Empty(dt, rows, ca+cb)
				s.NoErr("concat", s.E.ConcatChannels(y, a, b))
				s.Close("y", s.Read(y), RefConcat(av, bv, ca, cb), nil, 0)
				dy, dyv := s.Rand(dt, 1, rows, ca+cb)
				da, db := s.Empty(dt, rows, ca), s.Empty(dt, rows, cb)
				s.NoErr("split", s.E.SplitChannels(da, db, dy, false, false))
				s.Close("dy = concat(da, db)", RefConcat(s.Read(da), s.Read(db), ca, cb), dyv, nil, 0)
				// Accumulate into one, write the other; then only one wanted.
				da0, da0v := s.Rand(dt, 1, rows, ca)
				s.NoErr("split (acc a)", s.E.SplitChannels(da0, db, dy, true, false))
				dav, dbv := s.Read(da), s.Read(db)
				s.Close("concat(da, db) (acc a)", RefConcat(s.Read(da0), dbv, ca, cb), RefConcat(lnSum(da0v, dav), dbv, ca, cb),
					RefConcat(Sum(da0v, dav), Abs(dbv), ca, cb), s.Tol(dt)) // relative to the sum's terms
				db1 := s.Empty(dt, rows, cb)
				s.NoErr("split (b only)", s.E.SplitChannels(nil, db1, dy, false, false))
				s.Close("db alone", s.Read(db1), s.Read(db), nil, 0)
			})
		}
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) {
			s.GradCheck(GradCase{
				Name: "concat", DType: dt, Params: [][]int{{2, 3, 4}, {2, 3, 2}}, Twice: true,
				Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.Concat(p[0], p[1]) },
				Ref:    func(p [][]float64) []float64 { return RefConcat(p[0], p[1], 4, 2) },
			})
		})
	}
	s.Run("validation", func(s *Suite) {
		a := s.Empty(tensor.F32, 3, 2)
		for _, c := range []struct {
			what string
			err  error
		}{
			{"rows differ", s.E.ConcatChannels(s.Empty(tensor.F32, 3, 5), a, s.Empty(tensor.F32, 2, 3))},
			{"widths do not add up", s.E.ConcatChannels(s.Empty(tensor.F32, 3, 6), a, s.Empty(tensor.F32, 3, 3))},
			{"dtypes differ", s.E.ConcatChannels(s.Empty(tensor.F32, 3, 5), a, s.Empty(tensor.BF16, 3, 3))},
			{"missing b", s.E.ConcatChannels(s.Empty(tensor.F32, 3, 5), a, nil)},
			{"split into nothing", s.E.SplitChannels(nil, nil, s.Empty(tensor.F32, 3, 5), false, false)},
		} {
			if c.err == nil {
				s.T.Errorf("%s: accepted", c.what)
			}
		}
	})
}
