package ops

// The first-order optimizer steps: AdamW and SGD with momentum over lists
// of parameters, one multi-tensor launch per 32 tensors on CUDA
// (libgpu/kernels/ops_optim.cu, cuda_optim.go); libgpu/optim's AdamW, SGD
// and the first-order parts of Muon, SOAP and K-FAC call them. Reference
// and checks: opstest/check.go, opstest/clipfuse.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

func (e *Engine) checkGroups(op string, names []string, groups ...[]*tensor.Tensor) error {
	n := len(groups[0])
	for g := range groups {
		if len(groups[g]) != n {
			return fmt.Errorf("%w: %s: %d %s for %d params", tensor.ErrShape, op, len(groups[g]), names[g], n)
		}
	}
	for i, p := range groups[0] {
		if p == nil {
			return fmt.Errorf("%w: %s: param %d is missing", tensor.ErrShape, op, i)
		}
		for g := range groups {
			// The tensor's name is formatted only for the error: every
			// optimizer step passes here (10% of a service step's CPU).
			if e.check(op, groups[g][i], tensor.F32, p.Shape...) != nil {
				return e.check(fmt.Sprintf("%s %s[%d]", op, names[g], i), groups[g][i], tensor.F32, p.Shape...)
			}
		}
	}
	return nil
}

// AdamW applies one AdamW step (Loshchilov & Hutter 2019, with PyTorch's
// torch.optim.AdamW semantics, see AdamWConfig) to every params[i] in place
// from grads[i], with first and second moments m[i], v[i] (same shapes, f32,
// zero before the first step). step is an i32 tensor of one element holding
// the number of steps taken; the op increments it and uses the new value t
// for the bias corrections 1−β1ᵗ, 1−β2ᵗ. Requires 0 ≤ β1, β2 < 1, eps > 0
// (else ErrConfig). Errors as Linear.
func (e *Engine) AdamW(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamWConfig) error {
	if !(cfg.Beta1 >= 0 && cfg.Beta1 < 1 && cfg.Beta2 >= 0 && cfg.Beta2 < 1 && cfg.Eps > 0 && cfg.LR >= 0 && cfg.WeightDecay >= 0) {
		return fmt.Errorf("%w: AdamW %+v", ErrConfig, cfg)
	}
	if err := e.checkGroups("adamw", []string{"params", "grads", "m", "v"}, params, grads, m, v); err != nil {
		return err
	}
	if cfg.NoDecay != nil && len(cfg.NoDecay) != len(params) {
		return fmt.Errorf("%w: adamw NoDecay has %d entries for %d params", ErrConfig, len(cfg.NoDecay), len(params))
	}
	if cfg.LRScale != nil {
		if err := e.check("adamw LRScale", cfg.LRScale, tensor.F32, 1); err != nil {
			return err
		}
	}
	if cfg.GradScale != nil {
		if err := e.check("adamw GradScale", cfg.GradScale, tensor.F32, 1); err != nil {
			return err
		}
	}
	if step == nil {
		return fmt.Errorf("%w: adamw step is missing", tensor.ErrShape)
	}
	if step.DType != tensor.I32 {
		return fmt.Errorf("%w: adamw step is %v, want i32", tensor.ErrDType, step.DType)
	}
	if step.Numel() != 1 {
		return fmt.Errorf("%w: adamw step is %v, want one element", tensor.ErrShape, step.Shape)
	}
	if err := e.CheckPlace("adamw step", step); err != nil {
		return err
	}
	return e.dispatch(func(h *hostImpl) error { return h.adamW(params, grads, m, v, step, cfg) },
		func(c *cudaImpl) error { return c.adamW(params, grads, m, v, step, cfg) })
}

// StepCounter advances an optimizer's step counter on the device and
// leaves bias corrections there: t = step[0] + 1 is stored in step ([1]
// i32) and, when bc is not nil, bc ([2] f32) gets {1−β1ᵗ⁻ˡᵃᵍ, 1−β2ᵗ⁻ˡᵃᵍ},
// computed in float64 (Kingma & Ba 2015, Algorithm 1; lag 1 gives the
// previous step's, as SOAP's step coefficient wants). Ops that take bc
// (ShampooPrep.BC, BlockApply.CoefBC) then follow the counter in a
// replayed graph, where a host step number would be frozen at its
// capture. Requires 0 ≤ β1, β2 ≤ 1 and lag ≥ 0 (else ErrConfig); errors
// as AdamW.
func (e *Engine) StepCounter(step, bc *tensor.Tensor, beta1, beta2 float32, lag int) error {
	if !(beta1 >= 0 && beta1 <= 1 && beta2 >= 0 && beta2 <= 1 && lag >= 0) {
		return fmt.Errorf("%w: step counter β1 %v, β2 %v, lag %d", ErrConfig, beta1, beta2, lag)
	}
	if err := e.check("step counter", step, tensor.I32, 1); err != nil {
		return err
	}
	if bc != nil {
		if err := e.check("step counter bc", bc, tensor.F32, 2); err != nil {
			return err
		}
	}
	return e.dispatch(func(*hostImpl) error {
		st, _ := step.I32()
		st[0]++
		if bc == nil {
			return nil
		}
		out, _ := bc.F32()
		t := float64(int(st[0]) - lag)
		out[0] = float32(1 - math.Pow(float64(beta1), t))
		out[1] = float32(1 - math.Pow(float64(beta2), t))
		return nil
	}, func(c *cudaImpl) error {
		return launch.AdamwStep(c, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, devPtr(step), devPtr(bc), beta1, beta2, int32(lag))
	})
}

// SGD applies one step of SGD with momentum (PyTorch's torch.optim.SGD with
// dampening 0, not Nesterov; see SGDConfig) to params in place, with momentum
// buffers mom (same shapes, f32, zero before the first step; used even when
// Momentum is 0). Errors as AdamW.
func (e *Engine) SGD(params, grads, mom []*tensor.Tensor, cfg SGDConfig) error {
	if !(cfg.LR >= 0 && cfg.Momentum >= 0 && cfg.WeightDecay >= 0) {
		return fmt.Errorf("%w: SGD %+v", ErrConfig, cfg)
	}
	if err := e.checkGroups("sgd", []string{"params", "grads", "mom"}, params, grads, mom); err != nil {
		return err
	}
	return e.dispatch(func(h *hostImpl) error { return h.sgd(params, grads, mom, cfg) },
		func(c *cudaImpl) error { return c.sgd(params, grads, mom, cfg) })
}

func (h *hostImpl) adamW(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamWConfig) error {
	st, err := step.I32()
	if err != nil {
		return fmt.Errorf("ops: host backend: %w", err)
	}
	t := float64(st[0]) + 1
	bc1 := 1 - math.Pow(float64(cfg.Beta1), t)
	bc2 := 1 - math.Pow(float64(cfg.Beta2), t)
	lr, b1, b2 := float64(cfg.LR), float64(cfg.Beta1), float64(cfg.Beta2)
	eps := float64(cfg.Eps)
	if cfg.LRScale != nil {
		sc, err := cfg.LRScale.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		lr = float64(float32(cfg.LR) * sc[0]) // the f32 product, as the kernel forms it
	}
	gsc := float32(1)
	if cfg.GradScale != nil {
		v, err := cfg.GradScale.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		gsc = v[0]
	}
	for i := range params {
		wd := float64(cfg.decay(i))
		s, err := f32s(params[i], grads[i], m[i], v[i])
		if err != nil {
			return err
		}
		ps, gs, ms, vs := s[0], s[1], s[2], s[3]
		for j := range ps {
			gj := gs[j]
			if cfg.GradScale != nil {
				gj *= gsc // the f32 product the CUDA kernel forms
			}
			p, g := float64(ps[j]), float64(gj)
			mj := b1*float64(ms[j]) + (1-b1)*g
			vj := b2*float64(vs[j]) + (1-b2)*g*g
			ms[j], vs[j] = float32(mj), float32(vj)
			ps[j] = float32(p - lr*((mj/bc1)/(math.Sqrt(vj/bc2)+eps)+wd*p))
		}
	}
	st[0]++
	return nil
}

func (h *hostImpl) sgd(params, grads, mom []*tensor.Tensor, cfg SGDConfig) error {
	lr, mu, wd := cfg.LR, cfg.Momentum, cfg.WeightDecay
	for i := range params {
		s, err := f32s(params[i], grads[i], mom[i])
		if err != nil {
			return err
		}
		ps, gs, bs := s[0], s[1], s[2]
		for j := range ps {
			g := gs[j] + wd*ps[j]
			b := mu*bs[j] + g
			bs[j] = b
			ps[j] -= lr * b
		}
	}
	return nil
}
