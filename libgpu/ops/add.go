package ops

// The add family: element-wise sums (a residual stream) and scaled
// copies, with Graph.Add and Graph.Scale (libgpu/kernels/add.cu).
// Reference and checks: opstest/add.go.

import (
	"fmt"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// Add computes y = a + b element-wise in f32: a, b and y contiguous, of one
// shape and dtype (f32 or bf16); y may be a or b (a residual update in
// place). Errors wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or
// exec.ErrDevice.
func (e *Engine) Add(y, a, b *tensor.Tensor) error {
	if err := e.rwCheckElem("add", true, a, []string{"a", "b", "y"}, b, y); err != nil {
		return err
	}
	n := a.Numel()
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		ins, err := hostIns(a, b)
		if err != nil {
			return err
		}
		as, bs := ins[0], ins[1]
		out, commit, err := hostOut(y, false)
		if err != nil {
			return err
		}
		for i := range out { // y may be a or b: each element is read before it is written
			out[i] = as[i] + bs[i]
		}
		return commit()
	}, func(c *cudaImpl) error {
		inst := rwElemInst(y, a, b)
		return launch.Add(c, inst+"_"+dtName(a.DType), rwElemGrid(n, inst), block1(256), 0,
			devPtr(y), devPtr(a), devPtr(b), int64(n))
	})
}

// Scale computes y = s·x element-wise, or y += s·x when acc, in f32: x and
// y contiguous, of one shape, each f32 or bf16 (they may differ: a bf16
// gradient added into an f32 master's). y may be x. With s = 1, no acc and
// one dtype it is a plain device copy. Errors as Add.
func (e *Engine) Scale(y, x *tensor.Tensor, s float32, acc bool) error {
	if err := e.rwCheckElem("scale", false, x, []string{"x", "y"}, y); err != nil {
		return err
	}
	n := x.Numel()
	if n == 0 {
		return nil
	}
	if s == 1 && !acc && x.DType == y.DType {
		if x.Buf == y.Buf && x.Offset == y.Offset {
			return nil
		}
		return e.Copy(y, x)
	}
	return e.dispatch(func(*hostImpl) error {
		xs, err := hostIn(x)
		if err != nil {
			return err
		}
		out, commit, err := hostOut(y, acc)
		if err != nil {
			return err
		}
		for i, v := range xs { // y may be x: each element is read before it is written
			out[i] = s * v
		}
		return commit()
	}, func(c *cudaImpl) error {
		inst := rwElemInst(y, x)
		return launch.Scale(c, inst+dtSuffix(y.DType)+dtSuffix(x.DType), rwElemGrid(n, inst), block1(256), 0,
			devPtr(y), devPtr(x), s, int64(n), launch.Bool(acc))

	})
}

// Add records y = a + b (Engine.Add): a residual connection. a and b of
// one shape and dtype; y of that dtype. The backward hands dy to both
// inputs' gradients (a copy, or an add on fan-out).
func (g *Graph) Add(a, b *Var) *Var {
	if !g.ok(a, b) {
		return nil
	}
	g.prefetch("add.cu")
	if err := rwFloat("add a", a); err != nil {
		g.Fail("add", err)
		return nil
	}
	if !tensor.SameShape(a.Value.Shape, b.Value.Shape) || a.Value.DType != b.Value.DType {
		g.Fail("add", fmt.Errorf("%w: add of %v %v and %v %v", tensor.ErrShape, a.Value.DType, a.Value.Shape, b.Value.DType, b.Value.Shape))
		return nil
	}
	y := g.NewOut("add", a.Value.DType, a.Value.Shape...)
	e := g.e
	g.Record("add", []*Var{a, b}, []*Var{y}, func(*Grads) error {
		return e.Add(y.Value, a.Value, b.Value)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil {
			return nil
		}
		for i := 0; i < 2; i++ {
			if d := gr.In(i); d != nil {
				if err := e.Scale(d, dy, 1, gr.Acc(i)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return y
}

// Scale records y = s·x (Engine.Scale): y of x's shape and dtype.
func (g *Graph) Scale(x *Var, s float32) *Var {
	if !g.ok(x) {
		return nil
	}
	g.prefetch("add.cu")
	if err := rwFloat("scale x", x); err != nil {
		g.Fail("scale", err)
		return nil
	}
	y := g.NewOut("scale", x.Value.DType, x.Value.Shape...)
	e := g.e
	g.Record("scale", []*Var{x}, []*Var{y}, func(*Grads) error {
		return e.Scale(y.Value, x.Value, s, false)
	}, func(gr *Grads) error {
		dy, dx := gr.Out(0), gr.In(0)
		if dy == nil || dx == nil {
			return nil
		}
		return e.Scale(dx, dy, s, gr.Acc(0))
	})
	return y
}
