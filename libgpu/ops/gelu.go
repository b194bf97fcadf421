package ops

// The GELU family: the standalone GELU activation in both of its forms and
// its backward (libgpu/kernels/gelu.cu), and Graph.GELU. The GEMM family
// fuses the tanh form as an epilogue (ActGELU); this op serves the erf form
// (PyTorch's nn.GELU() default) and activations that follow no GEMM.
// Reference and checks: opstest/gelu.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// GELUForm selects a form of GELU (Hendrycks & Gimpel 2016, "Gaussian Error
// Linear Units").
type GELUForm uint8

const (
	// GELUTanh is ½x(1 + tanh(√(2/π)(x + 0.044715x³))): PyTorch's
	// nn.GELU(approximate="tanh"), GPT-2's, and the GEMM epilogue's.
	GELUTanh GELUForm = iota
	// GELUErf is ½x(1 + erf(x/√2)) = x·Φ(x): PyTorch's nn.GELU() default.
	GELUErf
)

func (f GELUForm) String() string {
	switch f {
	case GELUTanh:
		return "tanh"
	case GELUErf:
		return "erf"
	}
	return fmt.Sprintf("GELUForm(%d)", uint8(f))
}

func checkGELUForm(f GELUForm) error {
	if f > GELUErf {
		return fmt.Errorf("%w: %v", ErrConfig, f)
	}
	return nil
}

// GELU computes y = GELU(x) element-wise in the given form, in f32: x and y
// contiguous, of one shape and dtype (f32 or bf16); y may be x. Errors
// wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or
// ErrConfig (an unknown form).
//
// On CUDA the erf form computes Φ(x) as 2^P(|x|), P a degree-11 fit of
// log₂ of the normal tail (libgpu/kernels/gelu.cu), so that the kernel
// runs at memory bandwidth: element-wise relative error in f32 below 4e-7
// for |x| < 1, 2e-6 for |x| < 4, 6e-6 beyond (TestCUDAGELUErfAccuracy).
func (e *Engine) GELU(y, x *tensor.Tensor, form GELUForm) error {
	if err := checkGELUForm(form); err != nil {
		return err
	}
	if err := e.rwCheckElem("gelu", true, x, []string{"x", "y"}, y); err != nil {
		return err
	}
	n := x.Numel()
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		return hostMap(y, x, func(v float32) float32 { return hostGELU(v, form) })
	}, func(c *cudaImpl) error {
		inst := rwElemInst(x, y)
		return launch.GeluFwd(c, inst+"_"+dtName(x.DType), geluGrid(n, inst), block1(256), 0,
			devPtr(y), devPtr(x), int64(n), int32(form))
	})
}

// GELUBackward computes dx = dy ⊙ GELU'(x) element-wise (GELU' of the given
// form: erf: Φ(x) + x·φ(x); tanh: the derivative of the tanh expression),
// or adds it to dx when acc. dx, dy and x contiguous, of one shape and
// dtype; dx may be dy. Errors as GELU.
func (e *Engine) GELUBackward(dx, dy, x *tensor.Tensor, form GELUForm, acc bool) error {
	if err := checkGELUForm(form); err != nil {
		return err
	}
	if err := e.rwCheckElem("gelu backward", true, x, []string{"x", "dx", "dy"}, dx, dy); err != nil {
		return err
	}
	n := x.Numel()
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		return hostMapBackward(dx, dy, x, acc, func(g, v float32) float32 { return g * hostGELUGrad(v, form) })
	}, func(c *cudaImpl) error {
		inst := rwElemInst(x, dx, dy)
		return launch.GeluBwd(c, inst+"_"+dtName(x.DType), geluGrid(n, inst), block1(256), 0,
			devPtr(dx), devPtr(dy), devPtr(x), int64(n), int32(form), launch.Bool(acc))

	})
}

// geluGrid is the grid of gelu.cu's kernels over n elements: 256-thread
// blocks whose threads take two vectors (instance "v") or elements ("s")
// per round, capped at 65535 blocks (the kernels loop).
func geluGrid(n int, inst string) [3]uint32 {
	if inst == "v" {
		n /= rwVecWidth
	}
	return gridFor(int64((n+1)/2), 256)
}

// hostGELU is GELU in float64, rounded to f32. The tanh form is written
// x·σ(2u) = x/(1 + e^(−2u)) (½(1 + tanh u) = σ(2u)) and the erf form
// x·½erfc(−x/√2), so that neither cancels for negative x.
func hostGELU(z float32, form GELUForm) float32 {
	x := float64(z)
	if form == GELUTanh {
		return float32(x / (1 + math.Exp(-2*geluC*(x+geluA*x*x*x))))
	}
	return float32(0.5 * x * math.Erfc(-x/math.Sqrt2))
}

// hostGELUGrad is GELU' in float64, rounded to f32: for tanh,
// s + 2x·s(1−s)·c(1 + 3a x²) with s = σ(2u) = 1/(1+e), e = e^(−2u), and
// s(1−s) = 1/(2 + e + 1/e); for erf, Φ(x) + x·φ(x).
func hostGELUGrad(z float32, form GELUForm) float32 {
	x := float64(z)
	if form == GELUTanh {
		e := math.Exp(-2 * geluC * (x + geluA*x*x*x))
		s, sd := 1/(1+e), 1/(2+e+1/e)
		return float32(s + 2*x*sd*geluC*(1+3*geluA*x*x))
	}
	return float32(0.5*math.Erfc(-x/math.Sqrt2) + x*math.Exp(-0.5*x*x)/math.Sqrt(2*math.Pi))
}

// GELU records y = GELU(x) in the given form (Engine.GELU): y of x's shape
// and dtype; x must be contiguous. The backward reads x.
func (g *Graph) GELU(x *Var, form GELUForm) *Var {
	if !g.ok(x) {
		return nil
	}
	g.prefetch("gelu.cu")
	if err := rwFloat("gelu x", x); err != nil {
		g.Fail("gelu", err)
		return nil
	}
	if err := checkGELUForm(form); err != nil {
		g.Fail("gelu", err)
		return nil
	}
	y := g.NewOut("gelu", x.Value.DType, x.Value.Shape...)
	e := g.e
	g.Record("gelu", []*Var{x}, []*Var{y}, func(*Grads) error {
		return e.GELU(y.Value, x.Value, form)
	}, func(gr *Grads) error {
		dy, dx := gr.Out(0), gr.In(0)
		if dy == nil || dx == nil {
			return nil
		}
		return e.GELUBackward(dx, dy, x.Value, form, gr.Acc(0))
	})
	return y
}
