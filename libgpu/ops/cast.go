package ops

// The cast family: f32 ↔ bf16 conversion (libgpu/kernels/cast.cu), and
// Graph.Cast, which autocast uses to give GEMMs bf16 copies of f32 master
// weights. Checks: opstest/cast.go.

import (
	"fmt"

	"gpukit/libgpu/tensor"
)

// Cast writes src converted to dst's dtype into dst: f32 → bf16 rounds to
// nearest even, bf16 → f32 is exact, equal dtypes copy. Both contiguous,
// of one shape.
func (e *Engine) Cast(dst, src *tensor.Tensor) error {
	if err := e.checkView("cast dst", dst, true, floatTypes); err != nil {
		return err
	}
	if err := e.checkView("cast src", src, true, floatTypes); err != nil {
		return err
	}
	if err := sameShapes("cast", dst, src); err != nil {
		return err
	}
	n := dst.Numel()
	if n == 0 {
		return nil
	}
	if dst.DType == src.DType {
		return e.Copy(dst, src)
	}
	return e.dispatch(func(*hostImpl) error {
		v, err := hostIn(src)
		if err != nil {
			return err
		}
		return dst.WriteFloat32(v)
	}, func(c *cudaImpl) error {
		name := "cast_f32_to_bf16"
		if src.DType == tensor.BF16 {
			name = "cast_bf16_to_f32"
		}
		blocks := min(n/256+1, 65535)
		return c.launchK("cast.cu", name, grid1(blocks), block1(256), 0, kPtr(dst), kPtr(src), kI64(int64(n)))
	})
}

// Cast records x converted to dt (x itself when it already is dt). The
// copy is made once per step however many ops read it (a tied weight is
// cast once), and its gradient is x's own: ops that read the copy write
// their gradients straight into x's (an f32 master's f32 gradient), so
// only ops that take mixed dtypes — the GEMM family — read casts.
func (g *Graph) Cast(x *Var, dt tensor.DType) *Var {
	if !g.ok(x) {
		return nil
	}
	if x.Value.DType == dt {
		return x
	}
	key := castKey{v: x, dt: dt}
	if c, ok := g.shared.casts[key]; ok {
		return c
	}
	if !x.Value.Contiguous() {
		g.Fail("cast", fmt.Errorf("%w: cast of a strided %v", tensor.ErrLayout, x.Value.Shape))
		return nil
	}
	buf, err := tensor.Alloc(g.tape.Allocator(), "", dt, x.Value.Shape...)
	if err != nil {
		g.Fail("cast", err)
		return nil
	}
	name := g.name(x.Name + "." + dt.String())
	c, err := g.tape.Alias(name, x, buf, func(gx *tensor.Tensor) (*tensor.Tensor, error) { return gx, nil })
	if err != nil {
		buf.Buf.Free()
		g.Fail("cast", err)
		return nil
	}
	g.shared.owned = append(g.shared.owned, buf)
	e := g.e
	if err := g.tape.Op(name, []*Var{x}, nil, func(*Grads) error { return e.Cast(buf, x.Value) }, nil); err != nil {
		g.Fail("cast", err)
		return nil
	}
	g.shared.casts[key] = c
	return c
}
