package ops

// The silu family: the SiLU activation x·σ(x) (Elfwing, Uchibe & Doya 2018,
// "Sigmoid-weighted linear units"; PyTorch's nn.SiLU) element-wise and its
// backward (libgpu/kernels/silu.cu), and Graph.SiLU. GroupNorm fuses it
// after the norm; this op serves activations that follow no norm (a
// diffusion model's timestep-embedding MLP). Reference and checks:
// opstest/silu.go.

import (
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// SiLU computes y = x·σ(x) = x/(1 + e^(−x)) element-wise in f32: x and y
// contiguous, of one shape and dtype (f32 or bf16); y may be x. Errors
// wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) SiLU(y, x *tensor.Tensor) error {
	if err := e.rwCheckElem("silu", true, x, []string{"x", "y"}, y); err != nil {
		return err
	}
	n := x.Numel()
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		return hostMap(y, x, func(v float32) float32 {
			z := float64(v)
			return float32(z * sigmoid64(z))
		})
	}, func(c *cudaImpl) error {
		inst := rwElemInst(x, y)
		return launch.SiluFwd(c, inst+"_"+dtName(x.DType), rwElemGrid(n, inst), block1(256), 0, devPtr(y), devPtr(x), int64(n))
	})
}

// SiLUBackward computes dx = dy·σ(x)(1 + x(1 − σ(x))) element-wise (the
// derivative of x·σ(x)), or adds it to dx when acc. dx, dy and x
// contiguous, of one shape and dtype; dx may be dy. Errors as SiLU.
func (e *Engine) SiLUBackward(dx, dy, x *tensor.Tensor, acc bool) error {
	if err := e.rwCheckElem("silu backward", true, x, []string{"x", "dx", "dy"}, dx, dy); err != nil {
		return err
	}
	n := x.Numel()
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		return hostMapBackward(dx, dy, x, acc, func(g, v float32) float32 {
			z := float64(v)
			sg := sigmoid64(z)
			return float32(float64(g) * sg * (1 + z*(1-sg)))
		})
	}, func(c *cudaImpl) error {
		inst := rwElemInst(x, dx, dy)
		return launch.SiluBwd(c, inst+"_"+dtName(x.DType), rwElemGrid(n, inst), block1(256), 0,
			devPtr(dx), devPtr(dy), devPtr(x), int64(n), launch.Bool(acc))
	})
}

// SiLU records y = x·σ(x) (Engine.SiLU): y of x's shape and dtype (x
// contiguous). The backward reads x.
func (g *Graph) SiLU(x *Var) *Var {
	if !g.ok(x) {
		return nil
	}
	g.prefetch("silu.cu")
	if err := rwFloat("silu x", x); err != nil {
		g.Fail("silu", err)
		return nil
	}
	y := g.NewOut("silu", x.Value.DType, x.Value.Shape...)
	e := g.e
	g.Record("silu", []*Var{x}, []*Var{y}, func(*Grads) error {
		return e.SiLU(y.Value, x.Value)
	}, func(gr *Grads) error {
		dy, dx := gr.Out(0), gr.In(0)
		if dy == nil || dx == nil {
			return nil
		}
		return e.SiLUBackward(dx, dy, x.Value, gr.Acc(0))
	})
	return y
}
