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
	switch b := e.impl.(type) {
	case *hostImpl:
		return b.clip(grads, maxNorm, norm, coef, false)
	case *cudaImpl:
		return b.clip(grads, maxNorm, norm, coef, false)
	}
	return fmt.Errorf("%w: %v has no gradient clipping", ErrNoBackend, e.dev)
}

// GradClipper is implemented by backends that clip gradients by their joint
// norm (the host and CUDA backends). Engine.ClipGradNorm validates and calls
// it; it is separate from Impl so backends without it still build.
type GradClipper interface {
	// ClipGradNorm: see Engine.ClipGradNorm.
	ClipGradNorm(grads []*tensor.Tensor, maxNorm float32, norm *tensor.Tensor) error
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
// gives ErrNoBackend.
func (e *Engine) ClipGradNorm(grads []*tensor.Tensor, maxNorm float32, norm *tensor.Tensor) error {
	if err := e.checkClip(grads, maxNorm, norm); err != nil {
		return err
	}
	c, ok := e.impl.(GradClipper)
	if !ok {
		return fmt.Errorf("%w: %v has no gradient clipping", ErrNoBackend, e.dev)
	}
	return c.ClipGradNorm(grads, maxNorm, norm)
}

func (e *Engine) checkClip(grads []*tensor.Tensor, maxNorm float32, norm *tensor.Tensor) error {
	if !(maxNorm > 0) || math.IsInf(float64(maxNorm), 1) {
		return fmt.Errorf("%w: clip max norm %v (want a positive finite number)", ErrConfig, maxNorm)
	}
	if len(grads) == 0 {
		return fmt.Errorf("%w: clip of no gradients", ErrConfig)
	}
	for i, g := range grads {
		if g == nil {
			return fmt.Errorf("%w: clip grads[%d] is missing", tensor.ErrShape, i)
		}
		if err := e.check(fmt.Sprintf("clip grads[%d]", i), g, tensor.F32, g.Shape...); err != nil {
			return err
		}
	}
	if norm == nil {
		return fmt.Errorf("%w: clip norm is missing", tensor.ErrShape)
	}
	return e.check("clip norm", norm, tensor.F32, 1)
}

// ClipGradNorm implements GradClipper on the host: the sum of squares in
// float64, the coefficient rounded to f32, every element multiplied in f32.
func (h *hostImpl) ClipGradNorm(grads []*tensor.Tensor, maxNorm float32, norm *tensor.Tensor) error {
	return h.clip(grads, maxNorm, norm, nil, true)
}

// clip computes the norm (and, when coef is set, stores the coefficient)
// and, with scale, scales the gradients.
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
