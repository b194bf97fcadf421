package optim

import (
	"fmt"
	"sort"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// ShampooConfig configures Shampoo (Gupta, Koren & Singer 2018, "Shampoo:
// preconditioned stochastic tensor optimization"; Anil et al. 2020,
// "Scalable second order optimization for deep learning"). For a matrix
// parameter W (a vector is [1, n], a tensor [d0, rest]) split into blocks
// of at most MaxBlock × MaxBlock (ops.Blocking), per block G of the
// gradient, at step t:
//
//	L ← β2·L + (1−β2)·G·Gᵀ,  R ← β2·R + (1−β2)·Gᵀ·G   (β2 = 1: L += G·Gᵀ)
//	every UpdateFreq steps from StartStep: P_L = (L + rI)^(−1/4),
//	  P_R = (R + rI)^(−1/4), r = MatrixEps + MatrixRelEps·‖·‖_F
//	m ← β1·m + (1−β1)·g,  m̂ = m/(1−β1ᵗ)                   (the filtered gradient)
//	a = m̂/(√v̂ + GraftEps), v the Adam (or AdaGrad) second moment  (the graft)
//	S = P_L·M̂·P_R,  D = S·‖A‖_F/‖S‖_F                      (grafted per block)
//	W ← W − LR·(D + WeightDecay·W)
//
// Before the first preconditioners are in use D = A (the graft alone).
// Vectors, and parameters whose name contains one of GraftOnly, take the
// graft step A. See ops.ShampooPrep, ops.GraftScale, ops.BlockApply and
// ops.InverseRoot for the pieces.
type ShampooConfig struct {
	LR, Beta1, Beta2, WeightDecay float32
	// GraftBeta2 and GraftEps: the graft's second moment (AdaGrad: v sums
	// g², no bias correction).
	GraftBeta2, GraftEps float32
	AdaGradGraft         bool
	// MaxBlock bounds the preconditioned blocks (default 1024).
	MaxBlock int
	// The ridge of the roots: absolute and relative to the statistic's
	// Frobenius norm.
	MatrixEps, MatrixRelEps float32
	// StartStep is the first step whose statistics are inverted (from 1);
	// UpdateFreq the steps between refreshes.
	StartStep, UpdateFreq int
	Roots                 RootOptions
	// GraftOnly lists substrings of parameter names that take the graft
	// step only (embeddings, say).
	GraftOnly []string
}

// DefaultShampoo is LR 1e-3, β1 0.9, β2 0.999, no weight decay, an Adam
// graft with β2 0.999 and ε 1e-8, blocks of 1024, ridge 1e-6·‖·‖_F (+1e-12),
// preconditioning from step 1 refreshed every 10 steps, roots by
// eigendecomposition, synchronous.
var DefaultShampoo = ShampooConfig{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, GraftBeta2: 0.999, GraftEps: 1e-8,
	MaxBlock: 1024, MatrixEps: 1e-12, MatrixRelEps: 1e-6, StartStep: 1, UpdateFreq: 10}

func (c ShampooConfig) validate() error {
	if !(c.LR >= 0 && c.Beta1 >= 0 && c.Beta1 < 1 && c.Beta2 > 0 && c.Beta2 <= 1 && c.WeightDecay >= 0 &&
		c.GraftBeta2 > 0 && c.GraftBeta2 <= 1 && c.GraftEps > 0 && c.MaxBlock >= 1 && c.MatrixEps >= 0 &&
		c.MatrixRelEps >= 0 && c.MatrixEps+c.MatrixRelEps > 0 && c.StartStep >= 1 && c.UpdateFreq >= 1) {
		return fmt.Errorf("%w: Shampoo %+v", ErrConfig, c)
	}
	if !c.AdaGradGraft && c.GraftBeta2 == 1 {
		return fmt.Errorf("%w: Shampoo's Adam graft needs β2 < 1", ErrConfig)
	}
	return c.Roots.validate(c.UpdateFreq)
}

// statClass is a stack of the square statistics of one order d, from the
// blocks of every parameter whose block has that side: one batched root
// computation per class.
type statClass struct {
	d      int
	count  int
	stats  *tensor.Tensor // [count, d, d] state
	out    *tensor.Tensor // [count, d, d] state: roots (Shampoo) or eigenbases (SOAP)
	real   []int32        // the real order of each block (SOAP's PadDiag)
	status *tensor.Tensor // work: the refresh's per-matrix status ([count] i32, 0: ok)
	resid  *tensor.Tensor // work: Shampoo's Newton residuals ([count] f32)
	job    *rootJob
}

// classes assigns the blocks of matrix parameters to statClasses by order.
type classes struct {
	byD map[int]*statClass
}

func (cs *classes) reserve(d, count int, real func(i int) int) (*statClass, int) {
	if cs.byD == nil {
		cs.byD = map[int]*statClass{}
	}
	c := cs.byD[d]
	if c == nil {
		c = &statClass{d: d}
		cs.byD[d] = c
	}
	off := c.count
	c.count += count
	for i := 0; i < count; i++ {
		c.real = append(c.real, int32(real(i)))
	}
	return c, off
}

// sorted lists the classes by order.
func (cs *classes) sorted() []*statClass {
	var out []*statClass
	for _, c := range cs.byD {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].d < out[j].d })
	return out
}

// slice is matrices [off, off+n) of a class tensor.
func slice(t *tensor.Tensor, off, n int) (*tensor.Tensor, error) { return t.Narrow(0, off, n) }

// shampooParam is one parameter's place in Shampoo.
type shampooParam struct {
	p, g   *tensor.Tensor // [M, N] views
	blk    ops.Blocking
	m, v   *tensor.Tensor // state: the gradient's EMA (nil when β1 = 0), the graft's moment
	gb, ga *tensor.Tensor // work: views of its group's blocked filtered gradient and graft direction
}

// shampooGroup is a blockGroup of Shampoo's parameters with its blocked
// filtered gradient and graft direction.
type shampooGroup struct {
	*blockGroup
	params []*shampooParam
	gb, ga *tensor.Tensor // work [count, br, bc]
}

// Shampoo is the optimizer of ShampooConfig.
type Shampoo struct {
	rooted
	cfg     ShampooConfig
	groups  []*shampooGroup
	cls     []*statClass
	gs, t1  *tensor.Tensor // work shared by groups (sized for the largest)
	sdir    *tensor.Tensor
	scale   *tensor.Tensor
	bc      *tensor.Tensor // work [2]: the bias corrections of the device's step counter
	lrScale *tensor.Tensor // the run's device learning-rate scale, or nil
}

// NewShampoo allocates Shampoo's state for params through a: per
// parameter "<name>.exp_avg" (β1 > 0) and "<name>.graft_sq"; per block
// order d "shampoo/d<d>.stats" and "shampoo/d<d>.roots" ([count, d, d]: the
// blocks' statistics and roots, stacked so one batched root computation
// serves every parameter — grouped by block shape, in order of the
// shape's first parameter, then in parameter order; roots start as
// identities); "step" ([1] i32); with async roots "shampoo/d<d>.snap0"
// (the statistics a refresh in flight reads). Errors wrap ErrParams,
// ErrConfig or allocation errors; nothing stays allocated on error.
func NewShampoo(a device.Allocator, prefix string, params []nn.Param, cfg ShampooConfig) (o *Shampoo, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkParams(params); err != nil {
		return nil, err
	}
	o = &Shampoo{cfg: cfg, rooted: newRooted(rootSched{opts: cfg.Roots, start: cfg.StartStep, every: cfg.UpdateFreq})}
	defer func() {
		if err != nil {
			o.s.free()
			o = nil
		}
	}()
	if err := o.s.init(params); err != nil {
		return o, err
	}
	var sps []*shampooParam
	var blks []ops.Blocking
	var pre []bool
	for _, p := range params {
		pv, err := matrix2D(p.Value)
		if err != nil {
			return o, err
		}
		gv, _ := matrix2D(p.Grad)
		blk, err := ops.NewBlocking(pv.Dim(0), pv.Dim(1), cfg.MaxBlock)
		if err != nil {
			return o, err
		}
		sp := &shampooParam{p: pv, g: gv, blk: blk}
		if cfg.Beta1 > 0 {
			if sp.m, err = o.s.zeros(a, prefix, p.Name+".exp_avg", tensor.F32, pv.Shape...); err != nil {
				return o, err
			}
		}
		if sp.v, err = o.s.zeros(a, prefix, p.Name+".graft_sq", tensor.F32, pv.Shape...); err != nil {
			return o, err
		}
		sps, blks = append(sps, sp), append(blks, blk)
		pre = append(pre, p.Value.Rank() >= 2 && !matches(p.Name, cfg.GraftOnly))
	}
	bgs := groupByShape(blks, pre)
	var cs classes
	placeGroups(bgs, &cs)
	maxBlocked, maxBlocks := 0, 0
	for i, bg := range bgs {
		g := &shampooGroup{blockGroup: bg}
		o.groups = append(o.groups, g)
		maxBlocked = max(maxBlocked, g.count*g.br*g.bc)
		maxBlocks = max(maxBlocks, g.count)
		if g.gb, err = o.s.work(a, prefix, fmt.Sprintf("shampoo/group%d.dir", i), tensor.F32, g.shape()...); err != nil {
			return o, err
		}
		if g.ga, err = o.s.work(a, prefix, fmt.Sprintf("shampoo/group%d.graft", i), tensor.F32, g.shape()...); err != nil {
			return o, err
		}
		for k, pi := range g.members {
			sp := sps[pi]
			g.params = append(g.params, sp)
			if sp.gb, err = g.member(g.gb, k); err != nil {
				return o, err
			}
			if sp.ga, err = g.member(g.ga, k); err != nil {
				return o, err
			}
		}
	}
	o.cls = cs.sorted()
	for _, c := range o.cls {
		tag := fmt.Sprintf("shampoo/d%d", c.d) // "d": blocks stacked by shape (a checkpoint of the per-parameter layout does not load)
		if c.stats, err = o.s.zeros(a, prefix, tag+".stats", tensor.F32, c.count, c.d, c.d); err != nil {
			return o, err
		}
		if c.out, err = o.s.zeros(a, prefix, tag+".roots", tensor.F32, c.count, c.d, c.d); err != nil {
			return o, err
		}
		if err := identity(c.out); err != nil {
			return o, err
		}
		if c.resid, err = o.s.work(a, prefix, tag+".residual", tensor.F32, c.count); err != nil {
			return o, err
		}
		if c.status, err = o.s.work(a, prefix, tag+".root_status", tensor.I32, c.count); err != nil {
			return o, err
		}
		c := c
		c.job = &rootJob{name: tag, src: []*tensor.Tensor{c.stats}, dst: []*tensor.Tensor{c.out}, stacked: true,
			compute: func(e *ops.Engine, src, dst []*tensor.Tensor, part span, f64, _ bool) (*tensor.Tensor, error) {
				scratch, err := part.ofAll([]*tensor.Tensor{c.resid, c.status})
				if err != nil {
					return nil, err
				}
				r := ops.InverseRoot{A: src[0], X: dst[0], P: 4, Eps: cfg.MatrixEps, RelEps: cfg.MatrixRelEps,
					Method: cfg.Roots.Method, Iters: cfg.Roots.NewtonIters, F64: f64, Err: scratch[0], Status: scratch[1]}
				if f64 {
					r.Method = ops.RootEigen
				}
				return scratch[1], e.InverseRoot(r)
			}}
		if err := o.sched.add(&o.s, a, prefix, c.job, c.status); err != nil {
			return o, err
		}
	}
	if o.step.dev, err = o.s.zeros(a, prefix, "step", tensor.I32, 1); err != nil {
		return o, err
	}
	if o.bc, err = o.s.work(a, prefix, "shampoo.bias_correction", tensor.F32, 2); err != nil {
		return o, err
	}
	if maxBlocked > 0 {
		for _, w := range []struct {
			t **tensor.Tensor
			n string
		}{{&o.gs, "shampoo.grad"}, {&o.t1, "shampoo.tmp"}, {&o.sdir, "shampoo.precond"}} {
			if *w.t, err = o.s.work(a, prefix, w.n, tensor.F32, maxBlocked); err != nil {
				return o, err
			}
		}
	}
	if o.scale, err = o.s.work(a, prefix, "shampoo.scale", tensor.F32, maxBlocks); err != nil {
		return o, err
	}
	return o, nil
}

// flat views the first n elements of a work buffer with shape.
func flat(t *tensor.Tensor, shape ...int) (*tensor.Tensor, error) {
	v, err := t.Narrow(0, 0, tensor.Numel(shape))
	if err != nil {
		return nil, err
	}
	return v.View(shape...)
}

// Step implements Optimizer: the device's step counter and bias
// corrections (ops.Engine.StepCounter); per block-shape group, its
// parameters' graft and filtered gradient (ops.ShampooPreps, one
// multi-tensor launch) and the statistics' update (two batched GEMMs over
// the group's blocks); then the roots' schedule (a refresh when due,
// synchronously or on the side stream); then per group the
// preconditioning (two batched GEMMs and ops.GraftScale) and its
// parameters' grafted updates (ops.BlockApplies).
// Every call is queued on e; the host waits for the device only at the
// first step after construction (to read the step counter). Steps with no
// refresh starting or put in use may be captured and replayed (Phaser).
func (o *Shampoo) Step(e *ops.Engine) error {
	o.e = e
	t, err := o.step.advance(e, o.bc, o.cfg.Beta1, o.cfg.GraftBeta2, 0)
	if err != nil {
		return err
	}
	c := o.cfg
	b2 := c.Beta2
	alpha, beta := 1-b2, b2
	if b2 == 1 {
		alpha, beta = 1, 1
	}
	for _, g := range o.groups {
		gs, err := g.work(o.gs)
		if err != nil {
			return err
		}
		preps := make([]ops.ShampooPrep, len(g.params))
		for k, sp := range g.params {
			gsp, err := g.member(gs, k)
			if err != nil {
				return err
			}
			preps[k] = ops.ShampooPrep{G: sp.g, M: sp.m, V: sp.v, GS: gsp, GB: sp.gb, GA: sp.ga, Blk: sp.blk,
				Beta1: c.Beta1, Beta2: c.GraftBeta2, Eps: c.GraftEps, T: t, BC: o.bc, AdaGrad: c.AdaGradGraft}
		}
		if err := e.ShampooPreps(preps); err != nil {
			return err
		}
		if !g.pre {
			continue
		}
		l, r, err := g.stats()
		if err != nil {
			return err
		}
		if err := e.Matmul(ops.Matmul{A: gs, B: gs, D: l, TransB: true, Alpha: alpha, Beta: beta, Accumulate: true}); err != nil {
			return err
		}
		if err := e.Matmul(ops.Matmul{A: gs, B: gs, D: r, TransA: true, Alpha: alpha, Beta: beta, Accumulate: true}); err != nil {
			return err
		}
	}
	if err := o.sched.step(e, t); err != nil {
		return err
	}
	ready := o.sched.ready(t)
	for _, g := range o.groups {
		var s, scale *tensor.Tensor
		if g.pre && ready {
			pl, pr, err := g.outs()
			if err != nil {
				return err
			}
			t1, err := g.work(o.t1)
			if err != nil {
				return err
			}
			if s, err = g.work(o.sdir); err != nil {
				return err
			}
			if scale, err = flat(o.scale, g.count); err != nil {
				return err
			}
			if err := e.Matmul(ops.Matmul{A: pl, B: g.gb, D: t1}); err != nil {
				return err
			}
			if err := e.Matmul(ops.Matmul{A: t1, B: pr, D: s}); err != nil {
				return err
			}
			if err := e.GraftScale(scale, s, g.ga); err != nil {
				return err
			}
		}
		aps := make([]ops.BlockApply, len(g.params))
		for k, sp := range g.params {
			ap := ops.BlockApply{P: sp.p, D: sp.ga, Blk: sp.blk, LR: c.LR, Coef: 1, Decay: c.WeightDecay, LRScale: o.lrScale}
			if s != nil {
				if ap.D, err = g.member(s, k); err != nil {
					return err
				}
				if ap.Scale, err = g.member(scale, k); err != nil {
					return err
				}
			}
			aps[k] = ap
		}
		if err := e.BlockApplies(aps); err != nil {
			return err
		}
	}
	return nil
}

// SetLRScale makes every later step's learning rate LR·scale[0] (a [1]
// f32 device tensor the run's schedule writes), so that a captured step
// follows the schedule; nil goes back to LR alone.
func (o *Shampoo) SetLRScale(scale *tensor.Tensor) { o.lrScale = scale }

// NextPhase implements Phaser: −1 when the next step starts a refresh, puts
// one in use or is the first after construction; else 1 once
// preconditioners are in use, 0 before.
func (o *Shampoo) NextPhase() int { return o.rooted.nextPhase() }

// Replayed implements Phaser.
func (o *Shampoo) Replayed() { o.rooted.replayed() }

// State implements Optimizer: per parameter exp_avg (β1 > 0) and
// graft_sq, then per block order the statistics and roots (and, with
// async roots, the snapshot of a refresh in flight), then "step".
func (o *Shampoo) State() []nn.Param { return o.s.state }

// SetLR implements Optimizer.
func (o *Shampoo) SetLR(lr float32) { o.cfg.LR = lr }

// Config is the current configuration.
func (o *Shampoo) Config() ShampooConfig { return o.cfg }

// Reset, Free, Steps, Counter, RootStats and Capturable come from rooted.

var (
	_ Optimizer = (*Shampoo)(nil)
	_ Capturer  = (*Shampoo)(nil)
	_ Phaser    = (*Shampoo)(nil)
)
