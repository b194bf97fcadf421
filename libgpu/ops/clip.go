package ops

import (
	"fmt"
	"math"

	"gpukit/libgpu/tensor"
)

// ClipEps is added to the norm in the clipping coefficient, as PyTorch's
// torch.nn.utils.clip_grad_norm_ does (coef = maxNorm/(norm + 1e-6)).
const ClipEps = 1e-6

// ClipCoef computes what ClipGradNorm would scale by without scaling:
// norm ([1] f32) receives n = √(Σ g²) and coef ([1] f32) min(maxNorm/(n +
// ClipEps), 1), both on the device. Pass coef as AdamWConfig.GradScale to
// fuse the clipping into the update (same results, one pass over the
// gradients fewer). Errors as ClipGradNorm.
func (e *Engine) ClipCoef(grads []*tensor.Tensor, maxNorm float32, norm, coef *tensor.Tensor) error {
	if coef == nil {
		return fmt.Errorf("%w: clip coefficient is missing", tensor.ErrShape)
	}
	if err := e.check("clip coefficient", coef, tensor.F32, 1); err != nil {
		return err
	}
	if err := e.checkClip(grads, maxNorm, norm); err != nil {
		return err
	}
	return e.dispatch(func(h *hostImpl) error { return h.clip(grads, maxNorm, norm, coef, false) },
		func(c *cudaImpl) error { return c.clip(grads, maxNorm, norm, coef, false) })
}

// SumSquares queues sumsq[0] = Σ_i Σ_j grads[i]_j² ([1] f32 on the
// engine's device): ClipCoef's first half, accumulated in double in a
// fixed order (bitwise the same on every run) and rounded to f32 once.
// With gradients spread over ranks — ZeRO-1, where each rank holds the
// reduced gradients of its part of every bucket — each rank sums its part,
// an all-reduce (sum) of sumsq adds the parts, and ClipCoefFromSumSquares
// finishes the global norm (torch.nn.utils.clip_grad_norm_'s norm of the
// whole gradient, as PyTorch's FSDP clip_grad_norm_ adds the shards'
// squared norms across ranks). grads: f32, contiguous; an empty list
// gives 0. Errors as ClipGradNorm.
func (e *Engine) SumSquares(grads []*tensor.Tensor, sumsq *tensor.Tensor) error {
	if err := e.checkGrads("sum of squares", grads); err != nil {
		return err
	}
	if sumsq == nil {
		return fmt.Errorf("%w: sum of squares output is missing", tensor.ErrShape)
	}
	if err := e.check("sum of squares", sumsq, tensor.F32, 1); err != nil {
		return err
	}
	return e.dispatch(func(h *hostImpl) error { return h.sumSquares(grads, sumsq) },
		func(c *cudaImpl) error { return c.sumSquares(grads, sumsq) })
}

// ClipCoefFromSumSquares queues norm[0] = √sumsq[0] (rounded to f32) and
// coef[0] = min(maxNorm/(norm + ClipEps), 1), ClipCoef's second half from
// a sum of squares (SumSquares, added across ranks): coef is AdamW's
// GradScale. All three are [1] f32 on the engine's device; NaN stays NaN.
// Errors: ErrConfig for a max norm that is not positive and finite; shape,
// dtype and placement errors as ClipGradNorm.
func (e *Engine) ClipCoefFromSumSquares(sumsq *tensor.Tensor, maxNorm float32, norm, coef *tensor.Tensor) error {
	if !(maxNorm > 0) || math.IsInf(float64(maxNorm), 1) {
		return fmt.Errorf("%w: clip max norm %v (want a positive finite number)", ErrConfig, maxNorm)
	}
	for _, x := range []struct {
		what string
		t    *tensor.Tensor
	}{{"sum of squares", sumsq}, {"clip norm", norm}, {"clip coefficient", coef}} {
		if x.t == nil {
			return fmt.Errorf("%w: %s is missing", tensor.ErrShape, x.what)
		}
		if err := e.check(x.what, x.t, tensor.F32, 1); err != nil {
			return err
		}
	}
	return e.dispatch(func(h *hostImpl) error { return h.clipFromSumSquares(sumsq, maxNorm, norm, coef) },
		func(c *cudaImpl) error { return c.clipFromSumSquares(sumsq, maxNorm, norm, coef) })
}

// ClipGradNorm scales every grads[i] (f32, contiguous) in place so that their
// joint L2 norm is at most maxNorm, as torch.nn.utils.clip_grad_norm_ does
// (norm_type 2, foreach): with n = sqrt(Σ_i Σ_j g_ij²),
//
//	coef = min(maxNorm/(n + ClipEps), 1);  g ← coef·g
//
// (every gradient is multiplied, by 1 when n is small enough, as PyTorch
// does). norm ([1] f32 on the engine's device) receives n, the norm before
// clipping. On the CUDA backend nothing is read back to the host: the norm
// and the coefficient stay on the device, so a captured graph clips on every
// replay. maxNorm must be positive and finite (else ErrConfig); an empty
// list is ErrConfig too. Other errors as Linear; a backend without the op
// gives exec.ErrNoBackend.
func (e *Engine) ClipGradNorm(grads []*tensor.Tensor, maxNorm float32, norm *tensor.Tensor) error {
	if err := e.checkClip(grads, maxNorm, norm); err != nil {
		return err
	}
	return e.dispatch(func(h *hostImpl) error { return h.clip(grads, maxNorm, norm, nil, true) },
		func(c *cudaImpl) error { return c.clip(grads, maxNorm, norm, nil, true) })
}

func (e *Engine) checkClip(grads []*tensor.Tensor, maxNorm float32, norm *tensor.Tensor) error {
	if !(maxNorm > 0) || math.IsInf(float64(maxNorm), 1) {
		return fmt.Errorf("%w: clip max norm %v (want a positive finite number)", ErrConfig, maxNorm)
	}
	if len(grads) == 0 {
		return fmt.Errorf("%w: clip of no gradients", ErrConfig)
	}
	if err := e.checkGrads("clip", grads); err != nil {
		return err
	}
	if norm == nil {
		return fmt.Errorf("%w: clip norm is missing", tensor.ErrShape)
	}
	return e.check("clip norm", norm, tensor.F32, 1)
}

// checkGrads checks a list of gradients: present, f32, contiguous, on the
// engine's device.
func (e *Engine) checkGrads(what string, grads []*tensor.Tensor) error {
	for i, g := range grads {
		if g == nil {
			return fmt.Errorf("%w: %s grads[%d] is missing", tensor.ErrShape, what, i)
		}
		if err := e.check(fmt.Sprintf("%s grads[%d]", what, i), g, tensor.F32, g.Shape...); err != nil {
			return err
		}
	}
	return nil
}

// sumSquares implements SumSquares on the host: the sum in float64,
// rounded to f32.
func (h *hostImpl) sumSquares(grads []*tensor.Tensor, sumsq *tensor.Tensor) error {
	s, err := f32s(append(append([]*tensor.Tensor(nil), grads...), sumsq)...)
	if err != nil {
		return err
	}
	ss := 0.0
	for _, g := range s[:len(grads)] {
		for _, v := range g {
			ss += float64(v) * float64(v)
		}
	}
	s[len(grads)][0] = float32(ss)
	return nil
}

// clipFromSumSquares implements ClipCoefFromSumSquares on the host.
func (h *hostImpl) clipFromSumSquares(sumsq *tensor.Tensor, maxNorm float32, norm, coef *tensor.Tensor) error {
	s, err := f32s(sumsq, norm, coef)
	if err != nil {
		return err
	}
	n := float32(math.Sqrt(float64(s[0][0])))
	s[1][0], s[2][0] = n, clipCoef(maxNorm, n)
	return nil
}

// clipCoef is min(maxNorm/(n + ClipEps), 1) in f32, NaN for a NaN norm.
func clipCoef(maxNorm, n float32) float32 {
	c := maxNorm / (n + ClipEps)
	if c < 1 || c != c {
		return c
	}
	return 1
}

// clip computes the norm (and, when coef is set, stores the coefficient)
// and, with scale, scales the gradients: the sum of squares in float64,
// the coefficient rounded to f32, every element multiplied in f32.
func (h *hostImpl) clip(grads []*tensor.Tensor, maxNorm float32, norm, coefT *tensor.Tensor, scale bool) error {
	s, err := f32s(append(append([]*tensor.Tensor(nil), grads...), norm)...)
	if err != nil {
		return err
	}
	ss := 0.0
	for _, g := range s[:len(grads)] {
		for _, v := range g {
			ss += float64(v) * float64(v)
		}
	}
	n := float32(math.Sqrt(ss))
	coef := min(maxNorm/(n+ClipEps), 1)
	if scale {
		for _, g := range s[:len(grads)] {
			for j := range g {
				g[j] *= coef
			}
		}
	}
	s[len(grads)][0] = n
	if coefT != nil {
		c, err := coefT.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		c[0] = coef
	}
	return nil
}
