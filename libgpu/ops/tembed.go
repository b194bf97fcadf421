package ops

// The tembed family: the sinusoidal embedding of diffusion timesteps
// (libgpu/kernels/tembed.cu) and Graph.TimestepEmbedding. Reference and
// checks: opstest/tembed.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// TimestepEmbedding writes the sinusoidal embedding of the timesteps t
// (i32 [N]) into y [N, D] (f32 or bf16, D even, contiguous), as OpenAI's
// guided-diffusion timestep_embedding (Nichol & Dhariwal 2021; Vaswani et
// al. 2017's positional encoding) computes it in f32, with half = D/2:
//
//	f_i = exp(−ln(maxPeriod)·i/half),  y[n, i] = cos(t_n·f_i),  y[n, half+i] = sin(t_n·f_i)
//
// (the exponent is formed as (−ln(maxPeriod)·i)/half in f32, the
// reference's order of operations). maxPeriod > 1, typically 10000. It has
// no gradient. Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout, exec.ErrDevice or ErrConfig.
func (e *Engine) TimestepEmbedding(y, t *tensor.Tensor, maxPeriod float32) error {
	if !(maxPeriod > 1) || math.IsInf(float64(maxPeriod), 1) {
		return fmt.Errorf("%w: timestep embedding max period %v", ErrConfig, maxPeriod)
	}
	if err := e.checkView("timestep embedding t", t, true, []tensor.DType{tensor.I32}); err != nil {
		return err
	}
	if t.Rank() != 1 {
		return fmt.Errorf("%w: timesteps %v, want [N]", tensor.ErrShape, t.Shape)
	}
	if err := e.checkView("timestep embedding y", y, true, floatTypes); err != nil {
		return err
	}
	if y.Rank() != 2 || y.Dim(0) != t.Dim(0) || y.Dim(1)%2 != 0 {
		return fmt.Errorf("%w: timestep embedding y %v for %d timesteps (want [N, D], D even)", tensor.ErrShape, y.Shape, t.Dim(0))
	}
	n, d := y.Dim(0), y.Dim(1)
	if n == 0 || d == 0 {
		return nil
	}
	lnP := float32(math.Log(float64(maxPeriod)))
	return e.dispatch(func(*hostImpl) error {
		ts, err := t.I32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		out, commit, err := hostOut(y, false)
		if err != nil {
			return err
		}
		half := d / 2
		for r, tv := range ts {
			for i := 0; i < half; i++ {
				f := TembFreq(lnP, i, half)
				arg := float32(tv) * f
				out[r*d+i] = float32(math.Cos(float64(arg)))
				out[r*d+half+i] = float32(math.Sin(float64(arg)))
			}
		}
		return commit()
	}, func(c *cudaImpl) error {
		return launch.Temb(c, dtName(y.DType), gridFor(int64(n*d/2), 256), block1(256), 0,
			devPtr(y), devPtr(t), int32(n), int32(d/2), lnP)
	})
}

// TembFreq is the f32 frequency f_i = exp((−lnP·i)/half) of
// TimestepEmbedding, rounded as the kernel rounds it (each step in f32).
func TembFreq(lnP float32, i, half int) float32 {
	ex := (-lnP * float32(i)) / float32(half)
	return float32(math.Exp(float64(ex)))
}

// TimestepEmbedding records the sinusoidal embedding [N, dim] of the i32
// timesteps t [N] (Engine.TimestepEmbedding) in the graph's activation
// dtype. It has no gradient.
func (g *Graph) TimestepEmbedding(t *Var, dim int, maxPeriod float32) *Var {
	if !g.ok(t) {
		return nil
	}
	g.prefetch("tembed.cu")
	if t.Value.Rank() != 1 || t.Value.DType != tensor.I32 || dim < 2 || dim%2 != 0 {
		g.Fail("tembed", fmt.Errorf("%w: timestep embedding of %v %v into %d", tensor.ErrShape, t.Value.DType, t.Value.Shape, dim))
		return nil
	}
	y := g.NewOut("tembed", g.ActDType(), t.Value.Dim(0), dim)
	e := g.e
	g.Record("tembed", []*Var{t}, []*Var{y}, func(*Grads) error {
		return e.TimestepEmbedding(y.Value, t.Value, maxPeriod)
	}, nil)
	return y
}
