package ops

// The swiglu family: the gate of a SwiGLU MLP (Shazeer 2020, "GLU
// Variants Improve Transformer"), y = silu(gate)·up from the fused
// gate_up projection of sapientinc/HRM's models/layers.py SwiGLU, forward
// and backward (libgpu/kernels/swiglu.cu), Graph.SwiGLU, and HRM's
// rounding of the intermediate width (SwiGLUInter). Reference and checks:
// opstest/swiglu.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// SwiGLUInter is the intermediate width I of HRM's SwiGLU(hidden,
// expansion): round(expansion·hidden·2/3) rounded up to a multiple of 256
// (its _find_multiple; Python's round, half to even). The fused gate_up
// projection is hidden → 2I and the down projection I → hidden. For
// HRM's hidden 512, expansion 4: round(1365.33) = 1365 → 1536.
func SwiGLUInter(hidden int, expansion float64) int {
	a := int(math.RoundToEven(expansion * float64(hidden) * 2 / 3))
	return (a + 255) / 256 * 256
}

// swigluArgs is a validated call: gu and the other row tensors as [rows, ·]
// with their row strides.
type swigluArgs struct {
	rows, inter    int
	gu, out, dy    *tensor.Tensor
	ldg, ldo, lddy int
}

func (e *Engine) checkSwiGLU(op string, out, gu, dy *tensor.Tensor, back bool) (swigluArgs, error) {
	var a swigluArgs
	if err := e.checkView(op+" gu", gu, false, floatTypes); err != nil {
		return a, err
	}
	if gu.Rank() < 1 || gu.Dim(-1)%2 != 0 {
		return a, fmt.Errorf("%w: %s gu is %v, want [..., 2I]", tensor.ErrShape, op, gu.Shape)
	}
	var err error
	if a.gu, a.rows, _, a.ldg, err = rwRows(op+" gu", gu); err != nil {
		return a, err
	}
	a.inter = gu.Dim(-1) / 2
	half := append(append([]int(nil), gu.Shape[:gu.Rank()-1]...), a.inter)
	outShape := half
	if back {
		outShape = gu.Shape
		if err := e.checkView(op+" dy", dy, false, []tensor.DType{gu.DType}, half...); err != nil {
			return a, err
		}
		if a.dy, _, _, a.lddy, err = rwRows(op+" dy", dy); err != nil {
			return a, err
		}
	}
	if err := e.checkView(op+" out", out, false, []tensor.DType{gu.DType}, outShape...); err != nil {
		return a, err
	}
	if a.out, _, _, a.ldo, err = rwRows(op+" out", out); err != nil {
		return a, err
	}
	return a, checkDims(a.inter, a.rows)
}

// SwiGLU computes y = silu(gate)·up, silu(g) = g·σ(g), from the fused
// projection gu = [gate | up] along its last dimension (PyTorch's
// gate_up_proj(x).chunk(2, dim=-1) in HRM's SwiGLU): gu [..., 2I], y
// [..., I], one dtype (f32 or bf16), computed in f32; rows may be strided
// (leading dimensions merging into one row stride, last dimension
// contiguous). y must not overlap gu. Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) SwiGLU(y, gu *tensor.Tensor) error {
	a, err := e.checkSwiGLU("swiglu", y, gu, nil, false)
	if err != nil {
		return err
	}
	if a.rows == 0 || a.inter == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostSwiGLU(&a, false, false) },
		func(c *cudaImpl) error { return c.swiglu(&a, false, false) })
}

// SwiGLUBackward computes the gradient of SwiGLU into dgu [..., 2I] (gu's
// shape and dtype; may be gu itself, each element read before it is
// written), or adds it to dgu when acc:
//
//	dgate = dy·up·σ(g)(1 + g(1 − σ(g))),  dup = dy·silu(g)
//
// dy [..., I]. Errors as SwiGLU.
func (e *Engine) SwiGLUBackward(dgu, dy, gu *tensor.Tensor, acc bool) error {
	a, err := e.checkSwiGLU("swiglu backward", dgu, gu, dy, true)
	if err != nil {
		return err
	}
	if a.rows == 0 || a.inter == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostSwiGLU(&a, true, acc) },
		func(c *cudaImpl) error { return c.swiglu(&a, true, acc) })
}

func hostSwiGLU(a *swigluArgs, back, acc bool) error {
	ins, err := hostIns(a.gu, a.dy)
	if err != nil {
		return err
	}
	gs, ds := ins[0], ins[1]
	out, commit, err := hostOut(a.out, acc)
	if err != nil {
		return err
	}
	I := a.inter
	for r := 0; r < a.rows; r++ {
		for j := 0; j < I; j++ {
			g, u := float64(gs[r*2*I+j]), float64(gs[r*2*I+I+j])
			sg := sigmoid64(g)
			if !back {
				out[r*I+j] = float32(g * sg * u)
				continue
			}
			d := float64(ds[r*I+j])
			out[r*2*I+j] = float32(d * u * sg * (1 + g*(1-sg)))
			out[r*2*I+I+j] = float32(d * g * sg)
		}
	}
	return commit()
}

func (c *cudaImpl) swiglu(a *swigluArgs, back, acc bool) error {
	k := launch.SwigluArgs{Out: devPtr(a.out), Gu: devPtr(a.gu), Dy: devPtr(a.dy), Rows: int64(a.rows),
		Ldo: int64(a.ldo), Ldg: int64(a.ldg), Lddy: int64(a.lddy), I: int32(a.inter), Acc: lnBool(acc)}
	counts := []int{a.inter, a.ldg, a.ldo}
	if back {
		counts = append(counts, a.lddy)
	}
	inst := "s"
	if rwVecOK([]*tensor.Tensor{a.gu, a.out, a.dy}, counts...) {
		inst = "v"
	}
	kernel := launch.SwigluFwd
	if back {
		kernel = launch.SwigluBwd
	}
	n := int64(a.rows) * int64(a.inter)
	if inst == "v" {
		n /= rwVecWidth
	}
	return kernel(c, inst+"_"+dtName(a.gu.DType), gridFor(n, 256), block1(256), 0, &k)
}

// SwiGLU records y = silu(gate)·up (Engine.SwiGLU) from the fused
// projection gu [..., 2I] (f32 or bf16, rows contiguous or strided): y
// [..., I] of gu's dtype. HRM's MLP is Linear(x, gate_up) → SwiGLU →
// Linear(·, down), with I = SwiGLUInter(hidden, expansion). The backward
// reads gu and writes (or, on fan-out, adds) its gradient.
func (g *Graph) SwiGLU(gu *Var) *Var {
	if !g.ok(gu) {
		return nil
	}
	if err := rwFloat("swiglu gu", gu); err != nil {
		g.Fail("swiglu", err)
		return nil
	}
	x := gu.Value
	if x.Rank() < 1 || x.Dim(-1)%2 != 0 {
		g.Fail("swiglu", fmt.Errorf("%w: swiglu of %v, want [..., 2I]", tensor.ErrShape, x.Shape))
		return nil
	}
	shape := append(append([]int(nil), x.Shape[:x.Rank()-1]...), x.Dim(-1)/2)
	y := g.NewOut("swiglu", x.DType, shape...)
	e := g.e
	g.Record("swiglu", []*Var{gu}, []*Var{y}, func(*Grads) error {
		return e.SwiGLU(y.Value, gu.Value)
	}, func(gr *Grads) error {
		dy, dgu := gr.Out(0), gr.In(0)
		if dy == nil || dgu == nil {
			return nil
		}
		return e.SwiGLUBackward(dgu, dy, gu.Value, gr.Acc(0))
	})
	return y
}
