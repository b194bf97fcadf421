package ops

// The rope family: rotary position embedding (Su et al. 2021, "RoFormer:
// Enhanced Transformer with Rotary Position Embedding") in the
// rotate_half convention of sapientinc/HRM's models/layers.py (and
// GPT-NeoX, Llama in Hugging Face): the two halves of a head vector
// rotate together, not interleaved pairs. Forward and backward
// (libgpu/kernels/rope.cu), the cos/sin tables (RoPETable), and
// Graph.RoPE. Reference and checks: opstest/rope.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// RoPETable returns the cos and sin tables of rotary embedding for
// positions 0..T−1 and head dimension D (even), row-major [T, D] f32, as
// HRM's RotaryEmbedding builds them: inv_freq_i = 1/base^(2i/D) for
// i < D/2, freqs[t, i] = t·inv_freq_i, emb = concat(freqs, freqs) (so
// cos[t, i] = cos[t, i + D/2]), each step rounded to f32 as PyTorch's f32
// arithmetic rounds it (base^(·), the product, cos and sin evaluated
// once in float64 and rounded). base is rope_theta (10000 in HRM).
func RoPETable(T, D int, base float64) (cos, sin []float32, err error) {
	if T < 0 || D <= 0 || D%2 != 0 || !(base > 0) || math.IsInf(base, 0) {
		return nil, nil, fmt.Errorf("%w: rope table of %d positions, head dimension %d, base %v (want D even > 0, base > 0)", ErrConfig, T, D, base)
	}
	half := D / 2
	inv := make([]float32, half)
	for i := range inv {
		e := float32(2*i) / float32(D)
		inv[i] = 1 / float32(math.Pow(base, float64(e)))
	}
	cos, sin = make([]float32, T*D), make([]float32, T*D)
	for t := 0; t < T; t++ {
		for i, f := range inv {
			a := float64(float32(t) * f)
			c, s := float32(math.Cos(a)), float32(math.Sin(a))
			cos[t*D+i], cos[t*D+i+half] = c, c
			sin[t*D+i], sin[t*D+i+half] = s, s
		}
	}
	return cos, sin, nil
}

// ropeArgs is a validated call.
type ropeArgs struct {
	b, t, h, d int
}

func (e *Engine) checkRoPE(op string, y, x, cos, sin *tensor.Tensor, rot int) (ropeArgs, error) {
	var a ropeArgs
	if err := e.checkView(op+" x", x, false, floatTypes); err != nil {
		return a, err
	}
	if x.Rank() != 4 {
		return a, fmt.Errorf("%w: %s x is %v, want [B, T, H, D]", tensor.ErrShape, op, x.Shape)
	}
	if err := e.checkView(op+" y", y, false, []tensor.DType{x.DType}, x.Shape...); err != nil {
		return a, err
	}
	a = ropeArgs{b: x.Dim(0), t: x.Dim(1), h: x.Dim(2), d: x.Dim(3)}
	if a.d%2 != 0 {
		return a, fmt.Errorf("%w: %s head dimension %d is odd", tensor.ErrShape, op, a.d)
	}
	if rot < 0 || rot > a.h {
		return a, fmt.Errorf("%w: %s rotates %d of %d heads", ErrConfig, op, rot, a.h)
	}
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
	}{{"cos", cos}, {"sin", sin}} {
		if err := e.checkView(op+" "+c.what, c.t, true, []tensor.DType{tensor.F32}); err != nil {
			return a, err
		}
		if c.t.Rank() != 2 || c.t.Dim(1) != a.d || c.t.Dim(0) < a.t {
			return a, fmt.Errorf("%w: %s %s is %v, want [≥ %d, %d]", tensor.ErrShape, op, c.what, c.t.Shape, a.t, a.d)
		}
	}
	return a, checkDims(a.b, a.t, a.h, a.d)
}

// RoPE applies rotary position embedding to the first rot heads of x
// (HRM's apply_rotary_pos_emb: q·cos + rotate_half(q)·sin): for each
// head vector at position t, with x1, x2 its halves and c, s row t of
// cos and sin,
//
//	y1 = x1·c1 − x2·s1,  y2 = x2·c2 + x1·s2      (heads h < rot)
//	y  = x                                       (heads h ≥ rot)
//
// x and y: [B, T, H, D] of one dtype (f32 or bf16), D even, any
// non-negative strides for B, T and H with the last dimension contiguous
// (q and k of a fused qkv projection [B, T, 3C] are its view [B, T, 3H,
// D] with rot = 2H, v copied); y may be x (in place), other overlaps are
// not allowed. cos and sin: f32 contiguous [T', D] with T' ≥ T (RoPETable;
// row t is position t). Computed in f32 and rounded to the dtype once.
// Errors wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout,
// exec.ErrDevice or ErrConfig (rot outside [0, H]).
func (e *Engine) RoPE(y, x, cos, sin *tensor.Tensor, rot int) error {
	return e.rope("rope", y, x, cos, sin, rot, false, false)
}

// RoPEBackward computes the gradient of RoPE, the transpose of the
// rotation:
//
//	dx1 = dy1·c1 + dy2·s2,  dx2 = dy2·c2 − dy1·s1   (heads h < rot; dx = dy for the rest)
//
// or adds it to dx when acc. dx and dy as RoPE's y and x (dx may be dy).
// Errors as RoPE.
func (e *Engine) RoPEBackward(dx, dy, cos, sin *tensor.Tensor, rot int, acc bool) error {
	return e.rope("rope backward", dx, dy, cos, sin, rot, true, acc)
}

func (e *Engine) rope(op string, y, x, cos, sin *tensor.Tensor, rot int, bwd, acc bool) error {
	a, err := e.checkRoPE(op, y, x, cos, sin, rot)
	if err != nil {
		return err
	}
	n := x.Numel() / 2
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		return hostRoPE(a, y, x, cos, sin, rot, bwd, acc)
	}, func(c *cudaImpl) error {
		k := launch.RopeArgs{Y: devPtr(y), X: devPtr(x), Cos: devPtr(cos), Sin: devPtr(sin), N: int64(n),
			T: int32(a.t), H: int32(a.h), Half: int32(a.d / 2), Rot: int32(rot), Bwd: lnBool(bwd), Acc: lnBool(acc), Vec: 1}
		k.Xs0, k.Xs1, k.Xs2 = int64(x.Strides[0]), int64(x.Strides[1]), int64(x.Strides[2])
		k.Ys0, k.Ys1, k.Ys2 = int64(y.Strides[0]), int64(y.Strides[1]), int64(y.Strides[2])
		// Four pairs a thread where every vector the kernel loads is
		// aligned: both halves of a head vector (half % 4), each row of x
		// and y (their strides), and the tables' rows (D = 2·half).
		if a.d/2%4 == 0 && vecAligned(x, 4, x.Strides[:3]...) && vecAligned(y, 4, y.Strides[:3]...) &&
			vecAligned(cos, 4) && vecAligned(sin, 4) {
			k.Vec = 4
		}
		items := int64(n) / int64(k.Vec)
		grid := gridFor(items, 256)
		k.Narrow = lnBool(items+int64(grid[0])*256 < 1<<31)
		return launch.Rope(c, dtName(x.DType), grid, block1(256), 0, &k)
	})
}

func hostRoPE(a ropeArgs, y, x, cos, sin *tensor.Tensor, rot int, bwd, acc bool) error {
	ins, err := hostIns(x, cos, sin)
	if err != nil {
		return err
	}
	xs, cs, ss := ins[0], ins[1], ins[2]
	ys, commit, err := hostOut(y, acc)
	if err != nil {
		return err
	}
	half := a.d / 2
	for row := 0; row < a.b*a.t*a.h; row++ {
		h, t := row%a.h, row/a.h%a.t
		o := row * a.d
		for i := 0; i < half; i++ {
			p1, p2 := float64(xs[o+i]), float64(xs[o+i+half])
			o1, o2 := p1, p2
			if h < rot {
				c1, c2 := float64(cs[t*a.d+i]), float64(cs[t*a.d+i+half])
				s1, s2 := float64(ss[t*a.d+i]), float64(ss[t*a.d+i+half])
				if bwd {
					o1, o2 = p1*c1+p2*s2, p2*c2-p1*s1
				} else {
					o1, o2 = p1*c1-p2*s1, p2*c2+p1*s2
				}
			}
			ys[o+i], ys[o+i+half] = float32(o1), float32(o2)
		}
	}
	return commit()
}

// RoPE records y = RoPE(x) (Engine.RoPE) for x [B, T, H, D] of any float
// dtype, rotating the first rot heads with the f32 tables cos and sin
// ([≥ T, D], RoPETable; constants, no gradient). y is contiguous, of x's
// shape and dtype. For HRM's attention: the fused qkv [B, T, 3C] viewed
// (Graph.View) as [B, T, 3H, D] with rot = 2H, then viewed back for
// Graph.SelfAttention. The backward applies the transposed rotation to
// dy (accumulating on fan-out).
func (g *Graph) RoPE(x *Var, cos, sin *tensor.Tensor, rot int) *Var {
	if !g.ok(x) {
		return nil
	}
	if err := rwFloat("rope x", x); err != nil {
		g.Fail("rope", err)
		return nil
	}
	if x.Value.Rank() != 4 {
		g.Fail("rope", fmt.Errorf("%w: rope of %v, want [B, T, H, D]", tensor.ErrShape, x.Value.Shape))
		return nil
	}
	y := g.NewOut("rope", x.Value.DType, x.Value.Shape...)
	if !g.ok(y) {
		return nil
	}
	if _, err := g.e.checkRoPE("rope", y.Value, x.Value, cos, sin, rot); err != nil {
		g.Fail("rope", err)
		return nil
	}
	e := g.e
	g.Record("rope", []*Var{x}, []*Var{y}, func(*Grads) error {
		return e.RoPE(y.Value, x.Value, cos, sin, rot)
	}, func(gr *Grads) error {
		dy, dx := gr.Out(0), gr.In(0)
		if dy == nil || dx == nil {
			return nil
		}
		return e.RoPEBackward(dx, dy, cos, sin, rot, gr.Acc(0))
	})
	return y
}
