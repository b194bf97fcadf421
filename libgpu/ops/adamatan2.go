package ops

// The adamatan2 family: the update rules sapientinc/HRM trains with, as
// multi-tensor ops (libgpu/kernels/adamatan2.cu): Adam-atan2 (Everett et
// al. 2024) for the model, and sign-SGD with decoupled weight decay for
// its puzzle embedding. libgpu/optim wraps them as optimizers with state
// (optim.AdamATan2, optim.SignSGD). Reference and checks:
// opstest/adamatan2.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// AdamATan2Config holds Adam-atan2's hyper-parameters (Everett et al.
// 2024, "Scaling Exponents Across Parameterizations and Optimizers", §4.4:
// Adam's m/(√v + eps) replaced by atan2(m, √v), which is scale invariant
// and needs no eps), as the adam-atan2 package HRM uses computes them
// (imoneoi/adam-atan2): with t the new step, bc1 = 1 − β1ᵗ, bc2 = 1 − β2ᵗ,
//
//	p ← p·(1 − lr·wd)                                   (decoupled decay)
//	m ← m + (1 − β1)(g − m);  v ← v + (1 − β2)(g² − v)
//	p ← p − (A·lr/bc1)·atan2(m, B·√(v/bc2))             (the package)
//	p ← p − A·lr·atan2(m/bc1, B·√(v/bc2))               (BiasInside: the paper's m̂)
//
// A and B are the paper's a, b constants (0 means 1: the package has
// neither, i.e. a = b = 1; the paper's recommended a = 1.27, b = 1 is the
// lucidrains adam-atan2-pytorch default, which also puts bc1 inside). The
// two forms differ only while bc1 < 1 (the first few hundred steps at
// β1 = 0.9): atan2 is not homogeneous in m alone. The package's default
// hyper-parameters are DefaultAdamATan2's; HRM's Sudoku run uses betas
// (0.9, 0.95), weight decay 1.0, lr 1e-4 with warmup.
//
// LRScale, GradScale and NoDecay act as in AdamWConfig (a device scalar
// multiplying lr, one multiplying every gradient, per-param exemption
// from weight decay).
type AdamATan2Config struct {
	LR, Beta1, Beta2, WeightDecay float32
	A, B                          float32
	BiasInside                    bool
	LRScale, GradScale            *tensor.Tensor
	NoDecay                       []bool
}

// DefaultAdamATan2 is the adam-atan2 package's default (lr 1e-3, betas
// (0.9, 0.999), weight_decay 1e-2, a = b = 1).
var DefaultAdamATan2 = AdamATan2Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, WeightDecay: 1e-2}

func (c AdamATan2Config) ab() (a, b float32) {
	a, b = c.A, c.B
	if a == 0 {
		a = 1
	}
	if b == 0 {
		b = 1
	}
	return a, b
}

func (c AdamATan2Config) decay(i int) float32 {
	if i < len(c.NoDecay) && c.NoDecay[i] {
		return 0
	}
	return c.WeightDecay
}

// SignSGDConfig holds sign-SGD with decoupled weight decay, HRM's
// CastedSparseEmbeddingSignSGD_Distributed (models/sparse_embedding.py)
// applied densely:
//
//	p ← p·(1 − lr·wd) − lr·sign(g)      (sign(0) = 0, as torch.sign)
//
// HRM updates only the embedding rows of the identifiers in the batch,
// with g the sum of their rows' gradients. For Sudoku every puzzle has
// the one identifier 0 (num_puzzle_identifiers = 1), so the table has
// one row, present in every batch, and the dense rule over its gradient
// (the embedding backward sums the batch's rows) is the same update.
// LRScale as in AdamWConfig. HRM's defaults: lr 1e-3 (its puzzle_emb_lr
// 1e-2 in training), weight decay 1e-2 (puzzle_emb_weight_decay 0.1).
type SignSGDConfig struct {
	LR, WeightDecay float32
	LRScale         *tensor.Tensor
}

// AdamATan2 applies one Adam-atan2 step (AdamATan2Config) to every
// params[i] in place from grads[i], with moments m[i], v[i] (f32, params'
// shapes, zero before the first step). step is an i32 tensor of one
// element holding the steps taken; the op increments it on the device and
// uses the new value for the bias corrections (a replayed graph advances
// it once per replay). Computed in f32 with the corrections in double, as
// the package's kernel does (its lerps are the same fused multiply-adds).
// Requires 0 ≤ β1, β2 < 1, lr, wd, A, B ≥ 0 (else ErrConfig). Errors as
// AdamW.
func (e *Engine) AdamATan2(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamATan2Config) error {
	if !(cfg.Beta1 >= 0 && cfg.Beta1 < 1 && cfg.Beta2 >= 0 && cfg.Beta2 < 1 && cfg.LR >= 0 && cfg.WeightDecay >= 0 &&
		cfg.A >= 0 && cfg.B >= 0) || math.IsInf(float64(cfg.LR), 0) {
		return fmt.Errorf("%w: AdamATan2 %+v", ErrConfig, cfg)
	}
	if err := e.checkGroups("adamatan2", []string{"params", "grads", "m", "v"}, params, grads, m, v); err != nil {
		return err
	}
	if cfg.NoDecay != nil && len(cfg.NoDecay) != len(params) {
		return fmt.Errorf("%w: adamatan2 NoDecay has %d entries for %d params", ErrConfig, len(cfg.NoDecay), len(params))
	}
	for _, s := range []struct {
		what string
		t    *tensor.Tensor
	}{{"LRScale", cfg.LRScale}, {"GradScale", cfg.GradScale}} {
		if s.t != nil {
			if err := e.check("adamatan2 "+s.what, s.t, tensor.F32, 1); err != nil {
				return err
			}
		}
	}
	if step == nil {
		return fmt.Errorf("%w: adamatan2 step is missing", tensor.ErrShape)
	}
	if err := e.check("adamatan2 step", step, tensor.I32, 1); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error { return hostAdamATan2(params, grads, m, v, step, cfg) },
		func(c *cudaImpl) error { return c.adamATan2(params, grads, m, v, step, cfg) })
}

// SignSGD applies one sign-SGD step (SignSGDConfig) to every params[i] in
// place from grads[i] (f32, one shape per pair). Requires lr, wd ≥ 0.
// Errors as AdamW.
func (e *Engine) SignSGD(params, grads []*tensor.Tensor, cfg SignSGDConfig) error {
	if !(cfg.LR >= 0 && cfg.WeightDecay >= 0) || math.IsInf(float64(cfg.LR), 0) {
		return fmt.Errorf("%w: SignSGD %+v", ErrConfig, cfg)
	}
	if err := e.checkGroups("signsgd", []string{"params", "grads"}, params, grads); err != nil {
		return err
	}
	if cfg.LRScale != nil {
		if err := e.check("signsgd LRScale", cfg.LRScale, tensor.F32, 1); err != nil {
			return err
		}
	}
	return e.dispatch(func(*hostImpl) error { return hostSignSGD(params, grads, cfg) },
		func(c *cudaImpl) error { return c.signSGD(params, grads, cfg) })
}

// ---- host ----

// hostScalar reads an optional f32 device scalar (1 when t is nil).
func hostScalar(t *tensor.Tensor) (float32, error) {
	if t == nil {
		return 1, nil
	}
	v, err := t.F32()
	if err != nil {
		return 0, fmt.Errorf("ops: host backend: %w", err)
	}
	return v[0], nil
}

func hostAdamATan2(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamATan2Config) error {
	st, err := step.I32()
	if err != nil {
		return fmt.Errorf("ops: host backend: %w", err)
	}
	lsc, err := hostScalar(cfg.LRScale)
	if err != nil {
		return err
	}
	gsc, err := hostScalar(cfg.GradScale)
	if err != nil {
		return err
	}
	t := float64(st[0]) + 1
	bc1, bc2 := 1-math.Pow(float64(cfg.Beta1), t), 1-math.Pow(float64(cfg.Beta2), t)
	lr := float64(cfg.LR * lsc) // the f32 product, as the kernel forms it
	a32, b32 := cfg.ab()
	a, b := float64(a32), float64(b32)
	b1, b2 := float64(cfg.Beta1), float64(cfg.Beta2)
	for i := range params {
		s, err := f32s(params[i], grads[i], m[i], v[i])
		if err != nil {
			return err
		}
		ps, gs, ms, vs := s[0], s[1], s[2], s[3]
		decay := 1 - lr*float64(cfg.decay(i))
		for j := range ps {
			g := float64(gs[j] * gsc)
			mj := float64(ms[j]) + (1-b1)*(g-float64(ms[j]))
			vj := float64(vs[j]) + (1-b2)*(g*g-float64(vs[j]))
			ms[j], vs[j] = float32(mj), float32(vj)
			den := b * math.Sqrt(vj) / math.Sqrt(bc2)
			var u float64
			if cfg.BiasInside {
				u = a * lr * math.Atan2(mj/bc1, den)
			} else {
				u = a * lr / bc1 * math.Atan2(mj, den)
			}
			ps[j] = float32(float64(ps[j])*decay - u)
		}
	}
	st[0]++
	return nil
}

func hostSignSGD(params, grads []*tensor.Tensor, cfg SignSGDConfig) error {
	lsc, err := hostScalar(cfg.LRScale)
	if err != nil {
		return err
	}
	lr := float64(cfg.LR * lsc)
	decay := 1 - lr*float64(cfg.WeightDecay)
	for i := range params {
		s, err := f32s(params[i], grads[i])
		if err != nil {
			return err
		}
		for j, g := range s[1] {
			sg := 0.0
			switch {
			case g > 0:
				sg = 1
			case g < 0:
				sg = -1
			}
			s[0][j] = float32(float64(s[0][j])*decay - lr*sg)
		}
	}
	return nil
}

// ---- CUDA ----

// aa2Multi launches kernel (launch.Aa2Multi or launch.SignsgdMulti) over
// the tensors in groups of mtMax, fill setting each group's per-tensor
// fields.
func (c *cudaImpl) aa2Multi(kernel func(launch.Launcher, [3]uint32, [3]uint32, uint32, *launch.Aa2Args) error,
	params []*tensor.Tensor, base launch.Aa2Args, fill func(i int, t *launch.Aa2Tensor)) error {
	return mtEach(numels(params), func(g mtGroup) error {
		a := base
		a.Start, a.Count = g.start, int32(g.hi-g.lo)
		for i := g.lo; i < g.hi; i++ {
			a.T[i-g.lo] = launch.Aa2Tensor{P: devPtr(params[i]), N: int64(params[i].Numel())}
			fill(i, &a.T[i-g.lo])
		}
		return kernel(c, grid1(int(g.blocks())), block1(mtBlock), 0, &a)
	})
}

func (c *cudaImpl) adamATan2(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamATan2Config) error {
	if err := launch.Aa2Step(c, grid1(1), block1(1), 0, devPtr(step)); err != nil {
		return err
	}
	a, b := cfg.ab()
	base := launch.Aa2Args{Lr: cfg.LR, B1: cfg.Beta1, B2: cfg.Beta2, A: a, B: b, Inside: lnBool(cfg.BiasInside),
		Step: devPtr(step), LrScale: devPtr(cfg.LRScale), GScale: devPtr(cfg.GradScale)}
	return c.aa2Multi(launch.Aa2Multi, params, base, func(i int, t *launch.Aa2Tensor) {
		t.G, t.M, t.V, t.Wd = devPtr(grads[i]), devPtr(m[i]), devPtr(v[i]), cfg.decay(i)
	})
}

func (c *cudaImpl) signSGD(params, grads []*tensor.Tensor, cfg SignSGDConfig) error {
	base := launch.Aa2Args{Lr: cfg.LR, LrScale: devPtr(cfg.LRScale)}
	return c.aa2Multi(launch.SignsgdMulti, params, base,
		func(i int, t *launch.Aa2Tensor) {
			t.G, t.Wd = devPtr(grads[i]), cfg.WeightDecay
		})
}
