package opstest

import (
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "softmax", Check: checkSoftmax}) }

// RefSoftmax is the float64 reference of ops.Engine.Softmax over rows of C
// elements: exp(x − max)/Σ exp(x − max).
func RefSoftmax(x []float64, rows, C int) []float64 {
	y := make([]float64, rows*C)
	for r := 0; r < rows; r++ {
		row := x[r*C : (r+1)*C]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, v)
		}
		var s float64
		for j, v := range row {
			y[r*C+j] = math.Exp(v - m)
			s += y[r*C+j]
		}
		for j := range row {
			y[r*C+j] /= s
		}
	}
	return y
}

// RefSoftmaxBackward is dx = y·(dy − Σ y·dy) per row (the Jacobian of
// softmax, diag(y) − y·yᵀ, applied to dy).
func RefSoftmaxBackward(dy, y []float64, rows, C int) []float64 {
	dx := make([]float64, rows*C)
	for r := 0; r < rows; r++ {
		var s float64
		for j := r * C; j < (r+1)*C; j++ {
			s += y[j] * dy[j]
		}
		for j := r * C; j < (r+1)*C; j++ {
			dx[j] = y[j] * (dy[j] - s)
		}
	}
	return dx
}

func checkSoftmax(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, sh := range lnShapes {
			s.Run(fmt.Sprintf("%v/%dx%d", dt, sh[0], sh[1]), func(s *Suite) { smForwardBackward(s, dt, sh[0], sh[1], 2) })
		}
		// Logits of scale 30: exp overflows f32 unless the maximum is subtracted.
		s.Run(fmt.Sprintf("%v/large-logits", dt), func(s *Suite) { smForwardBackward(s, dt, 6, 77, 30) })
		s.Run(fmt.Sprintf("%v/strided", dt), func(s *Suite) { smStrided(s, dt) })
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) {
			const rows, C = 4, 9
			s.GradCheck(GradCase{
				Name: "softmax", DType: dt, Params: [][]int{{2, 2, C}}, Twice: true,
				Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.Softmax(p[0]) },
				Ref:    func(p [][]float64) []float64 { return RefSoftmax(p[0], rows, C) },
			})
		})
	}
	s.Run("validation", smValidation)
}

func smForwardBackward(s *Suite, dt tensor.DType, rows, C int, scale float64) {
	x, xv := s.Rand(dt, scale, rows, C)
	y := s.Empty(dt, rows, C)
	s.NoErr("softmax", s.E.Softmax(y, x))
	want := RefSoftmax(xv, rows, C)
	s.Close("y", s.Read(y), want, nil, s.Tol(dt))
	// The backward from the stored y, as a tape would run it.
	yv := s.Read(y)
	dy, dyv := s.Rand(dt, 1, rows, C)
	dx := s.Empty(dt, rows, C)
	s.NoErr("softmax backward", s.E.SoftmaxBackward(dx, dy, y, false))
	wdx := RefSoftmaxBackward(dyv, yv, rows, C)
	// dx sums to zero over each row: its norm is small next to y·dy's, so
	// the bound is relative to the scale of the terms.
	mag := make([]float64, len(wdx))
	for i := range mag {
		mag[i] = yv[i] * math.Abs(dyv[i])
	}
	s.Close("dx", s.Read(dx), wdx, mag, s.Tol(dt))
	dx0, dx0v := s.Rand(dt, 1, rows, C)
	s.NoErr("softmax backward (acc)", s.E.SoftmaxBackward(dx0, dy, y, true))
	s.Close("dx (acc)", s.Read(dx0), lnSum(dx0v, wdx), mag, s.Tol(dt))
}

func smStrided(s *Suite, dt tensor.DType) {
	const rows, C, W, off = 7, 33, 48, 5
	xw, xwv := s.Rand(dt, 2, rows, W)
	x, err := xw.Narrow(1, off, C)
	s.NoErr("narrow", err)
	yw := s.Empty(dt, rows, W)
	y, err := yw.Narrow(1, off, C)
	s.NoErr("narrow", err)
	s.NoErr("softmax", s.E.Softmax(y, x))
	xv := make([]float64, 0, rows*C)
	for r := 0; r < rows; r++ {
		xv = append(xv, xwv[r*W+off:r*W+off+C]...)
	}
	s.Close("y (strided)", s.Read(y), RefSoftmax(xv, rows, C), nil, s.Tol(dt))
	lnUntouched(s, "y", s.Read(yw), rows, W, off, C)
}

func smValidation(s *Suite) {
	x := s.Empty(tensor.F32, 3, 4)
	bad := []struct {
		what string
		err  error
	}{
		{"y of another shape", s.E.Softmax(s.Empty(tensor.F32, 4, 3), x)},
		{"y of another dtype", s.E.Softmax(s.Empty(tensor.BF16, 3, 4), x)},
		{"i32 x", s.E.Softmax(s.Empty(tensor.I32, 3, 4), s.Empty(tensor.I32, 3, 4))},
		{"missing y", s.E.Softmax(nil, x)},
		{"backward dy of another shape", s.E.SoftmaxBackward(x, s.Empty(tensor.F32, 3, 5), x, false)},
		{"backward dx of another dtype", s.E.SoftmaxBackward(s.Empty(tensor.BF16, 3, 4), x, x, false)},
	}
	for _, c := range bad {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
	tr, _ := s.Empty(tensor.F32, 4, 3).Transpose(0, 1) // last dimension strided
	if err := s.E.Softmax(s.Empty(tensor.F32, 3, 4), tr); err == nil {
		s.T.Error("a strided last dimension was accepted")
	}
}
