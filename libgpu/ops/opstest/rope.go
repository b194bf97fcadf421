package opstest

import (
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "rope", Check: checkRoPE}) }

// RefRoPE is the float64 reference of ops.Engine.RoPE (bwd false) and
// RoPEBackward (bwd true) on row-major x [B, T, H, D] with tables cos, sin
// [≥ T, D]: heads h < rot rotate, the others are copied.
func RefRoPE(x, cos, sin []float64, B, T, H, D, rot int, bwd bool) []float64 {
	y := make([]float64, len(x))
	half := D / 2
	for row := 0; row < B*T*H; row++ {
		h, t := row%H, row/H%T
		o := row * D
		for i := 0; i < half; i++ {
			p1, p2 := x[o+i], x[o+i+half]
			if h >= rot {
				y[o+i], y[o+i+half] = p1, p2
				continue
			}
			c1, c2, s1, s2 := cos[t*D+i], cos[t*D+i+half], sin[t*D+i], sin[t*D+i+half]
			if bwd {
				y[o+i], y[o+i+half] = p1*c1+p2*s2, p2*c2-p1*s1
			} else {
				y[o+i], y[o+i+half] = p1*c1-p2*s1, p2*c2+p1*s2
			}
		}
	}
	return y
}

// ropeTables uploads RoPETable(T, D, 10000) (HRM's rope_theta) and
// returns the stored values.
func ropeTables(s *Suite, T, D int) (cos, sin *tensor.Tensor, cv, sv []float64) {
	c, sn, err := ops.RoPETable(T, D, 10000)
	s.NoErr("rope table", err)
	cos, sin = s.Const(tensor.F32, F64(c), T, D), s.Const(tensor.F32, F64(sn), T, D)
	return cos, sin, F64(c), F64(sn)
}

func checkRoPE(s *Suite) {
	s.Run("table", ropeTableCheck)
	for _, dt := range s.DTypes() {
		for _, c := range []struct{ b, t, h, d, rot int }{
			{1, 1, 1, 2, 1}, {2, 5, 3, 8, 2}, {1, 7, 4, 6, 0}, {3, 4, 2, 10, 2}, {2, 82, 24, 64, 16},
		} {
			s.Run(fmt.Sprintf("%v/%dx%dx%dx%d/rot=%d", dt, c.b, c.t, c.h, c.d, c.rot), func(s *Suite) {
				ropeCase(s, dt, c.b, c.t, c.h, c.d, c.rot, false)
				ropeCase(s, dt, c.b, c.t, c.h, c.d, c.rot, true)
			})
		}
		s.Run(fmt.Sprintf("%v/qkv-view", dt), func(s *Suite) { ropeQKV(s, dt) })
		s.Run(fmt.Sprintf("%v/in-place", dt), func(s *Suite) { ropeInPlace(s, dt) })
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) {
			const B, T, H, D = 2, 3, 3, 6
			cos, sin, cv, sv := ropeTables(s, T+2, D)
			s.GradCheck(GradCase{
				Name: "rope", DType: dt, Params: [][]int{{B, T, H, D}}, Twice: true,
				Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.RoPE(p[0], cos, sin, 2) },
				Ref:    func(p [][]float64) []float64 { return RefRoPE(p[0], cv, sv, B, T, H, D, 2, false) },
			})
		})
	}
	s.Run("validation", ropeValidation)
}

// ropeTableCheck: RoPETable against cos(t/10000^(2i/D)) in float64, the
// halves equal, and bad arguments refused.
func ropeTableCheck(s *Suite) {
	const T, D = 90, 64
	c, sn, err := ops.RoPETable(T, D, 10000)
	s.NoErr("rope table", err)
	var num float64
	for t := 0; t < T; t++ {
		for i := 0; i < D/2; i++ {
			a := float64(t) / math.Pow(10000, float64(2*i)/D)
			for _, j := range []int{i, i + D/2} {
				num = max(num, math.Abs(float64(c[t*D+j])-math.Cos(a)), math.Abs(float64(sn[t*D+j])-math.Sin(a)))
			}
		}
	}
	// The angle is rounded to f32 (as PyTorch computes it): an error of
	// up to ~T·2⁻²⁴ radians.
	if num > 1e-5 {
		s.T.Errorf("rope table: largest error %.3g", num)
	}
	for _, bad := range [][3]float64{{-1, 8, 10000}, {4, 7, 10000}, {4, 0, 10000}, {4, 8, 0}, {4, 8, math.NaN()}} {
		if _, _, err := ops.RoPETable(int(bad[0]), int(bad[1]), bad[2]); err == nil {
			s.T.Errorf("rope table %v accepted", bad)
		}
	}
}

// ropeCase: forward and backward (written, accumulated) with HRM's tables
// or, with general, random tables whose halves differ.
func ropeCase(s *Suite, dt tensor.DType, B, T, H, D, rot int, general bool) {
	var cos, sin *tensor.Tensor
	var cv, sv []float64
	if general {
		cos, cv = s.Rand(tensor.F32, 1, T+1, D)
		sin, sv = s.Rand(tensor.F32, 1, T+1, D)
	} else {
		cos, sin, cv, sv = ropeTables(s, T, D)
	}
	x, xv := s.Rand(dt, 1, B, T, H, D)
	y := s.Empty(dt, B, T, H, D)
	s.NoErr("rope", s.E.RoPE(y, x, cos, sin, rot))
	s.Close("y", s.Read(y), RefRoPE(xv, cv, sv, B, T, H, D, rot, false), nil, s.Tol(dt))
	dy, dyv := s.Rand(dt, 1, B, T, H, D)
	dx := s.Empty(dt, B, T, H, D)
	s.NoErr("rope backward", s.E.RoPEBackward(dx, dy, cos, sin, rot, false))
	want := RefRoPE(dyv, cv, sv, B, T, H, D, rot, true)
	s.Close("dx", s.Read(dx), want, nil, s.Tol(dt))
	dx0, dx0v := s.Rand(dt, 1, B, T, H, D)
	s.NoErr("rope backward (acc)", s.E.RoPEBackward(dx0, dy, cos, sin, rot, true))
	s.CloseAcc("dx (acc)", s.Read(dx0), dx0v, want, nil, s.Tol(dt))
	// The backward is the transpose: ⟨RoPE(x), dy⟩ = ⟨x, RoPEᵀ(dy)⟩.
	fwd := RefRoPE(xv, cv, sv, B, T, H, D, rot, false)
	var l, r float64
	for i := range fwd {
		l += fwd[i] * dyv[i]
		r += xv[i] * want[i]
	}
	if math.Abs(l-r) > 1e-9*(1+math.Abs(l)) {
		s.T.Errorf("reference backward is not the forward's transpose: %v vs %v", l, r)
	}
}

// ropeQKV: q and k of a fused qkv [B, T, 3C] rotated through its
// [B, T, 3H, D] view (v copied), into a column block of a wider output
// whose other columns stay untouched; and rotating only q through a
// strided view of the q block.
func ropeQKV(s *Suite, dt tensor.DType) {
	const B, T, H, D = 2, 9, 3, 8
	C := H * D
	cos, sin, cv, sv := ropeTables(s, T, D)
	qkv, qkvv := s.Rand(dt, 1, B, T, 3*C)
	x, err := qkv.View(B, T, 3*H, D)
	s.NoErr("view", err)
	const W, off = 3*3*8 + 8, 4
	yw := s.Empty(dt, B, T, W)
	yn, err := yw.Narrow(2, off, 3*C)
	s.NoErr("narrow", err)
	y, err := yn.View(B, T, 3*H, D)
	if err != nil {
		// A column block of a wider tensor does not merge its heads into a
		// view; build the strided view by hand.
		y = &tensor.Tensor{Buf: yw.Buf, DType: dt, Shape: []int{B, T, 3 * H, D}, Strides: []int{T * W, W, D, 1}, Offset: yw.Offset + off}
	}
	s.NoErr("rope qkv", s.E.RoPE(y, x, cos, sin, 2*H))
	want := RefRoPE(qkvv, cv, sv, B, T, 3*H, D, 2*H, false)
	s.Close("qkv rotated", s.Read(y), want, nil, s.Tol(dt))
	lnUntouched(s, "y", s.Read(yw), B*T, W, off, 3*C)
	// q alone: the [B, T, H, D] view of the first C columns (strides
	// (3C·T, 3C, D, 1)), written in place.
	q, err := x.Narrow(2, 0, H)
	s.NoErr("narrow q", err)
	s.NoErr("rope q in place", s.E.RoPE(q, q, cos, sin, H))
	wantQ := RefRoPE(qkvv, cv, sv, B, T, 3*H, D, H, false)
	s.Close("q rotated in place, k and v untouched", s.Read(qkv), wantQ, nil, s.Tol(dt))
}

func ropeInPlace(s *Suite, dt tensor.DType) {
	const B, T, H, D = 3, 11, 2, 16
	cos, sin, cv, sv := ropeTables(s, T, D)
	x, xv := s.Rand(dt, 1, B, T, H, D)
	s.NoErr("rope in place", s.E.RoPE(x, x, cos, sin, H))
	s.Close("x rotated", s.Read(x), RefRoPE(xv, cv, sv, B, T, H, D, H, false), nil, s.Tol(dt))
	s.NoErr("rope backward in place", s.E.RoPEBackward(x, x, cos, sin, H, false))
	// A rotation's transpose is its inverse with these tables (c² + s² = 1).
	s.Close("x rotated back", s.Read(x), xv, nil, 2*s.Tol(dt))
}

func ropeValidation(s *Suite) {
	x := s.Empty(tensor.F32, 2, 4, 3, 8)
	cos, sin, _, _ := ropeTables(s, 4, 8)
	short, _, _, _ := ropeTables(s, 3, 8)
	bad := []struct {
		what string
		err  error
	}{
		{"y of another shape", s.E.RoPE(s.Empty(tensor.F32, 2, 4, 3, 6), x, cos, sin, 1)},
		{"y of another dtype", s.E.RoPE(s.Empty(tensor.BF16, 2, 4, 3, 8), x, cos, sin, 1)},
		{"rank 3", s.E.RoPE(s.Empty(tensor.F32, 8, 3, 8), s.Empty(tensor.F32, 8, 3, 8), cos, sin, 1)},
		{"odd head dimension", s.E.RoPE(s.Empty(tensor.F32, 1, 4, 1, 7), s.Empty(tensor.F32, 1, 4, 1, 7), cos, sin, 1)},
		{"rot > H", s.E.RoPE(x, x, cos, sin, 4)},
		{"negative rot", s.E.RoPE(x, x, cos, sin, -1)},
		{"table too short", s.E.RoPE(x, x, short, short, 1)},
		{"bf16 table", s.E.RoPE(x, x, s.Empty(tensor.BF16, 4, 8), sin, 1)},
		{"table of another width", s.E.RoPE(x, x, s.Empty(tensor.F32, 4, 6), sin, 1)},
		{"i32 x", s.E.RoPE(s.Empty(tensor.I32, 2, 4, 3, 8), s.Empty(tensor.I32, 2, 4, 3, 8), cos, sin, 1)},
		{"missing sin", s.E.RoPE(x, x, cos, nil, 1)},
		{"backward dx of another shape", s.E.RoPEBackward(s.Empty(tensor.F32, 2, 4, 3, 6), x, cos, sin, 1, false)},
	}
	for _, c := range bad {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{})
	defer g.Free()
	if g.RoPE(g.Input("x", x), short, short, 1) != nil || g.Err() == nil {
		s.T.Error("graph rope with a short table was recorded")
	}
}
