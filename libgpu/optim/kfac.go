package optim

import (
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// KFACConfig configures K-FAC for linear layers (Martens & Grosse 2015,
// "Optimizing neural networks with Kronecker-factored approximate
// curvature"), as momentum SGD on the preconditioned gradient (the form of
// kfac-pytorch and of Ba, Grosse & Martens 2017). For a layer y = x·Wᵀ + b
// with N input rows a (captured in the forward) and output gradients g
// (∂L/∂y, captured in the backward), at step t:
//
//	every CovEvery steps:  A ← ρ·A + (1−ρ)·(1/N)·āᵀā      (ā = [a, 1])
//	                        G ← ρ·G + (1−ρ)·(s²/N)·gᵀg     (s = GradScale, 0: N)
//	                        (the first update overwrites: A = (1/N)·āᵀā, ...)
//	every InvEvery steps:  π = √((tr A/d_A)/(tr G/d_G)),
//	                        A⁻¹ = (A + π√λ·I)⁻¹, G⁻¹ = (G + √λ/π·I)⁻¹
//	V = G⁻¹·[∇W | ∇b]·A⁻¹
//	ν = min(1, √(κ/(LR²·Σ_layers ⟨V, [∇W | ∇b]⟩)))          (KL clipping; κ = KLClip, 0: ν = 1)
//	buf ← μ·buf + ν·V (+ WeightDecay·W for weights);  W ← W − LR·buf
//
// GradScale turns the captured gradients into per-example gradients of
// the summed loss: N (the default) for a loss averaged over the N rows,
// which is what ops' cross-entropy computes. Parameters outside the
// layers take momentum SGD with LR, Momentum and WeightDecay. Inverses
// follow Roots (eigendecomposition or Newton with P = 1, synchronous or
// asynchronous with MaxStaleness); before the first are in use they are
// identities (the step is momentum SGD).
type KFACConfig struct {
	LR, Momentum, WeightDecay float32
	Damping                   float32 // λ
	StatDecay                 float32 // ρ
	CovEvery, InvEvery        int
	KLClip                    float32 // κ
	GradScale                 float32
	Roots                     RootOptions
}

// DefaultKFAC: LR 0.1, momentum 0.9, damping 0.1, factor decay 0.95,
// factors every step, inverses every 10, KL clip 1e-3. Damping is relative
// to the Fisher's scale, which for the empirical Fisher of a softmax
// classifier is small (tr G/d ≈ 3e-3 on the hidden layers of the trainer's
// Fashion-MNIST MLP, tr A/d ≈ 1): at kfac-pytorch's λ = 1e-3 the inverses
// amplify the gradient's noise in the factors' small eigendirections, the
// KL clip then scales every step down to ν ≈ 0.03 and the MLP stalls near
// 83% test accuracy. On the host (lr 0.05, no weight decay, seed 1) λ =
// 0.03 gives 86.5% after one epoch and 87.5% after two, λ = 0.1 86.9% and
// 88.2%, past AdamW's 87.5% after five (bench/optim-mlp.sh).
var DefaultKFAC = KFACConfig{LR: 0.1, Momentum: 0.9, Damping: 0.1, StatDecay: 0.95, CovEvery: 1, InvEvery: 10, KLClip: 1e-3}

func (c KFACConfig) validate() error {
	if !(c.LR >= 0 && c.Momentum >= 0 && c.Momentum < 1 && c.WeightDecay >= 0 && c.Damping > 0 && c.StatDecay >= 0 &&
		c.StatDecay < 1 && c.CovEvery >= 1 && c.InvEvery >= 1 && c.KLClip >= 0 && c.GradScale >= 0) {
		return fmt.Errorf("%w: K-FAC %+v", ErrConfig, c)
	}
	return c.Roots.validate(c.InvEvery)
}

// KFACLayer names a linear layer's parameters. Input ([N, in]) and OutGrad
// ([N, out]) are the layer's input and the gradient of its output (its
// pre-activation), f32 or bf16, read at each step (for a model whose
// buffers are static, such as nn.MLP: nn.MLP.Linears); leave them nil to
// capture them with the hook of ops.GraphOptions.OnLinear (KFAC.OnLinear).
type KFACLayer struct {
	Weight, Bias   string
	Input, OutGrad *tensor.Tensor
}

// checkLayerIO checks a layer's Input ([N, in]) and OutGrad ([N, out]),
// when given: f32 or bf16 matrices of the layer's widths and of one N.
func checkLayerIO(l KFACLayer, in, out int) error {
	if (l.Input == nil) != (l.OutGrad == nil) {
		return fmt.Errorf("%w: K-FAC layer %q needs both its input and its output gradient, or neither", ErrParams, l.Weight)
	}
	if l.Input == nil {
		return nil
	}
	for _, x := range []struct {
		what  string
		t     *tensor.Tensor
		width int
	}{{"input", l.Input, in}, {"output gradient", l.OutGrad, out}} {
		t := x.t
		if t.Rank() != 2 || t.Dim(1) != x.width || (t.DType != tensor.F32 && t.DType != tensor.BF16) {
			return fmt.Errorf("%w: K-FAC layer %q: its %s is %v %v (want f32 or bf16 [N, %d])", ErrParams, l.Weight, x.what, t.DType, t.Shape, x.width)
		}
	}
	if l.Input.Dim(0) != l.OutGrad.Dim(0) {
		return fmt.Errorf("%w: K-FAC layer %q: input of %d rows, output gradient of %d", ErrParams, l.Weight, l.Input.Dim(0), l.OutGrad.Dim(0))
	}
	return nil
}

// kfacLayer is one layer's state.
type kfacLayer struct {
	KFACLayer
	w, gw, b, gb   *tensor.Tensor
	bufW, bufB     *tensor.Tensor // state: momentum
	a, g           *tensor.Tensor // state: factors
	ainv, ginv     *tensor.Tensor // state: inverses in use
	ridgeA, ridgeG *tensor.Tensor // work: damping
	errs           *tensor.Tensor // work: the inverses' residuals [2]
	status         *tensor.Tensor // work: the inverses' statuses [2] i32 (0: written)
	v              *tensor.Tensor // work: the preconditioned gradient
	updated        int            // the step whose factors were last captured
}

// KFAC is the optimizer of KFACConfig.
type KFAC struct {
	rooted
	cfg      KFACConfig
	layers   []*kfacLayer
	byWeight map[string]*kfacLayer
	dots, nu *tensor.Tensor
	rest     []*tensor.Tensor // other parameters, their gradients and momentum buffers
	restG    []*tensor.Tensor
	restBuf  []*tensor.Tensor
}

// NewKFAC allocates K-FAC's state through a: per layer
// "<weight>.kfac_a", "<weight>.kfac_g" (the factors, [in+1] or [in]
// square and [out] square), "<weight>.kfac_a_inv", "<weight>.kfac_g_inv"
// (identities at first) and "<param>.momentum_buffer" for its weight and
// bias; "<name>.momentum_buffer" for every other parameter; "step"; with
// async inverses "kfac/<weight>.snap0" and ".snap1". Every layer's
// parameters must be among params, f32, the weight [out, in] and the bias
// [out].
func NewKFAC(a device.Allocator, prefix string, params []nn.Param, layers []KFACLayer, cfg KFACConfig) (o *KFAC, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkParams(params); err != nil {
		return nil, err
	}
	o = &KFAC{cfg: cfg, rooted: newRooted(rootSched{opts: cfg.Roots, start: 1, every: cfg.InvEvery}),
		byWeight: map[string]*kfacLayer{}}
	defer func() {
		if err != nil {
			o.s.free()
			o = nil
		}
	}()
	if err := o.s.init(params); err != nil {
		return o, err
	}
	byName := map[string]nn.Param{}
	for _, p := range params {
		byName[p.Name] = p
	}
	inLayer := map[string]bool{}
	for _, spec := range layers {
		w, ok := byName[spec.Weight]
		if !ok || w.Value.Rank() != 2 {
			return o, fmt.Errorf("%w: K-FAC layer weight %q is not a matrix parameter", ErrParams, spec.Weight)
		}
		if o.byWeight[spec.Weight] != nil {
			return o, fmt.Errorf("%w: K-FAC layer %q given twice", ErrParams, spec.Weight)
		}
		out, in := w.Value.Dim(0), w.Value.Dim(1)
		l := &kfacLayer{KFACLayer: spec, w: w.Value, gw: w.Grad}
		din := in
		if spec.Bias != "" {
			b, ok := byName[spec.Bias]
			if !ok || !tensor.SameShape(b.Value.Shape, []int{out}) {
				return o, fmt.Errorf("%w: K-FAC layer bias %q is not a [%d] parameter", ErrParams, spec.Bias, out)
			}
			l.b, l.gb, din = b.Value, b.Grad, in+1
			inLayer[spec.Bias] = true
		}
		if din > MaxOrder || out > MaxOrder {
			return o, fmt.Errorf("%w: K-FAC layer %q has factors of order %d and %d (at most %d)", ErrParams, spec.Weight, din, out, MaxOrder)
		}
		if err := checkLayerIO(spec, in, out); err != nil {
			return o, err
		}
		inLayer[spec.Weight] = true
		n := spec.Weight
		for _, x := range []struct {
			t     **tensor.Tensor
			name  string
			shape []int
		}{{&l.a, n + ".kfac_a", []int{din, din}}, {&l.g, n + ".kfac_g", []int{out, out}},
			{&l.ainv, n + ".kfac_a_inv", []int{din, din}}, {&l.ginv, n + ".kfac_g_inv", []int{out, out}},
			{&l.bufW, n + ".momentum_buffer", []int{out, in}}} {
			if *x.t, err = o.s.zeros(a, prefix, x.name, tensor.F32, x.shape...); err != nil {
				return o, err
			}
		}
		if l.b != nil {
			if l.bufB, err = o.s.zeros(a, prefix, spec.Bias+".momentum_buffer", tensor.F32, out); err != nil {
				return o, err
			}
		}
		for _, t := range []*tensor.Tensor{l.ainv, l.ginv} {
			if err := identity(t); err != nil {
				return o, err
			}
		}
		for _, x := range []struct {
			t     **tensor.Tensor
			name  string
			shape []int
		}{{&l.ridgeA, n + ".ridge_a", []int{1}}, {&l.ridgeG, n + ".ridge_g", []int{1}}, {&l.errs, n + ".residual", []int{2}},
			{&l.v, n + ".precond", []int{out, din}}} {
			if *x.t, err = o.s.work(a, prefix, x.name, tensor.F32, x.shape...); err != nil {
				return o, err
			}
		}
		if l.status, err = o.s.work(a, prefix, n+".root_status", tensor.I32, 2); err != nil {
			return o, err
		}
		job := &rootJob{name: "kfac/" + n, src: []*tensor.Tensor{l.a, l.g}, dst: []*tensor.Tensor{l.ainv, l.ginv},
			compute: func(e *ops.Engine, src, dst []*tensor.Tensor, _ span, f64, _ bool) (*tensor.Tensor, error) {
				if err := e.KFACDamping(l.ridgeA, l.ridgeG, src[0], src[1], cfg.Damping); err != nil {
					return nil, err
				}
				method := cfg.Roots.Method
				if f64 {
					method = ops.RootEigen
				}
				for i, r := range []*tensor.Tensor{l.ridgeA, l.ridgeG} {
					ev, _ := l.errs.Narrow(0, i, 1)
					sv, _ := l.status.Narrow(0, i, 1)
					if err := e.InverseRoot(ops.InverseRoot{A: src[i], X: dst[i], P: 1, Ridge: r, Method: method,
						Iters: cfg.Roots.NewtonIters, F64: f64, Err: ev, Status: sv}); err != nil {
						return nil, err
					}
				}
				return l.status, nil
			}}
		if err := o.sched.add(&o.s, a, prefix, job, l.status); err != nil {
			return o, err
		}
		o.layers = append(o.layers, l)
		o.byWeight[spec.Weight] = l
	}
	for _, p := range params {
		if inLayer[p.Name] {
			continue
		}
		b, err := o.s.zeros(a, prefix, p.Name+".momentum_buffer", tensor.F32, p.Value.Shape...)
		if err != nil {
			return o, err
		}
		o.rest, o.restG, o.restBuf = append(o.rest, p.Value), append(o.restG, p.Grad), append(o.restBuf, b)
	}
	if len(o.layers) > 0 {
		if o.dots, err = o.s.work(a, prefix, "kfac.dots", tensor.F32, len(o.layers)); err != nil {
			return o, err
		}
		if o.nu, err = o.s.work(a, prefix, "kfac.nu", tensor.F32, 1); err != nil {
			return o, err
		}
	}
	if o.step.dev, err = o.s.zeros(a, prefix, "step", tensor.I32, 1); err != nil {
		return o, err
	}
	return o, nil
}

// covDue reports whether step t updates the factors, and whether it is
// the first update (which overwrites them).
func (o *KFAC) covDue(t int) (due, first bool) {
	return t%o.cfg.CovEvery == 0, t == o.cfg.CovEvery
}

// factor updates one layer's factors from x ([N, in]) and dy ([N, out])
// at step t.
func (o *KFAC) factor(e *ops.Engine, l *kfacLayer, x, dy *tensor.Tensor, t int) error {
	due, first := o.covDue(t)
	if !due || l.updated == t {
		return nil
	}
	if x.Rank() != 2 || dy.Rank() != 2 || x.Dim(0) != dy.Dim(0) || x.Dim(1) != l.w.Dim(1) || dy.Dim(1) != l.w.Dim(0) {
		return fmt.Errorf("%w: K-FAC layer %q captured x %v and dy %v for a %v weight", ErrParams, l.Weight, x.Shape, dy.Shape, l.w.Shape)
	}
	n := float32(x.Dim(0))
	s := o.cfg.GradScale
	if s == 0 {
		s = n
	}
	rho := o.cfg.StatDecay
	alphaA, alphaG, beta := (1-rho)/n, (1-rho)*s*s/n, rho
	if first {
		alphaA, alphaG, beta = 1/n, s*s/n, 0
	}
	if err := e.KFACFactor(l.a, x, alphaA, beta, l.b != nil); err != nil {
		return err
	}
	if err := e.KFACFactor(l.g, dy, alphaG, beta, false); err != nil {
		return err
	}
	l.updated = t
	return nil
}

// OnLinear returns the hook for ops.GraphOptions.OnLinear of a graph run
// on e: it updates the factors of the layer whose weight is named weight
// from the layer's input x and pre-activation gradient dy, during the
// backward of the step about to be taken (when factors are due), with no
// copy of them; other weights are ignored. Each layer's weight must feed
// one Linear.
func (o *KFAC) OnLinear(e *ops.Engine) func(weight string, x, dy *tensor.Tensor) error {
	return func(weight string, x, dy *tensor.Tensor) error {
		l := o.byWeight[weight]
		if l == nil {
			return nil
		}
		if err := o.step.load(e); err != nil {
			return err
		}
		return o.factor(e, l, x, dy, o.step.t+1)
	}
}

// Step implements Optimizer: factors of layers with static Input and
// OutGrad (when due), the inverses' schedule, every layer's
// preconditioned gradient, the KL clipping factor and the momentum
// updates, then momentum SGD for the other parameters. Queued on e; steps
// with no refresh starting or put in use and no first factor update may
// be captured and replayed (Phaser), at a constant learning rate.
func (o *KFAC) Step(e *ops.Engine) error {
	o.e = e
	t, err := o.step.advance(e, nil, 0, 0, 0) // on the device: a replayed step advances it
	if err != nil {
		return err
	}
	c := o.cfg
	for _, l := range o.layers {
		if l.Input != nil && l.OutGrad != nil {
			if err := o.factor(e, l, l.Input, l.OutGrad, t); err != nil {
				return err
			}
		}
	}
	if err := o.sched.step(e, t); err != nil {
		return err
	}
	for i, l := range o.layers {
		var dot *tensor.Tensor
		if c.KLClip > 0 {
			dot, _ = o.dots.Narrow(0, i, 1)
		}
		if err := e.KFACPrecond(l.v, l.ginv, l.gw, l.gb, l.ainv, dot); err != nil {
			return err
		}
	}
	var nu *tensor.Tensor
	if c.KLClip > 0 && len(o.layers) > 0 {
		if err := e.KLClip(o.nu, o.dots, c.LR, c.KLClip); err != nil {
			return err
		}
		nu = o.nu
	}
	for _, l := range o.layers {
		if err := e.KFACApply(l.w, l.b, l.bufW, l.bufB, l.v, nu, c.LR, c.Momentum, c.WeightDecay); err != nil {
			return err
		}
	}
	if len(o.rest) > 0 {
		return e.SGD(o.rest, o.restG, o.restBuf, ops.SGDConfig{LR: c.LR, Momentum: c.Momentum, WeightDecay: c.WeightDecay})
	}
	return nil
}

// NextPhase implements Phaser: −1 when the next step refreshes the
// inverses or puts a refresh in use, updates the factors for the first
// time (which overwrites them), or is the first after construction; else
// 0 or 1 (inverses not yet or already in use), plus 2 when the factors of
// layers with static Input and OutGrad are due.
func (o *KFAC) NextPhase() int {
	ph := o.rooted.nextPhase()
	if ph < 0 {
		return -1
	}
	due, first := o.covDue(o.step.t + 1)
	switch {
	case first:
		return -1
	case due && o.hasStatic():
		return ph + 2
	}
	return ph
}

// Replayed implements Phaser.
func (o *KFAC) Replayed() { o.rooted.replayed() }

// ComputePhase is the phase of the next step's forward and backward when
// its factors are captured by the OnLinear hook: −1 when that step must
// run eagerly (the first factor update, which overwrites the factors, or
// the step count is unknown), 1 when the hook updates the factors, 0 when
// it does nothing; steps of one phase queue the same work, so a graph per
// phase can be replayed (trainer's Runner.SetComputePhases).
func (o *KFAC) ComputePhase() int {
	if o.step.t < 0 {
		return -1
	}
	due, first := o.covDue(o.step.t + 1)
	switch {
	case first:
		return -1
	case due:
		return 1
	}
	return 0
}

func (o *KFAC) hasStatic() bool {
	for _, l := range o.layers {
		if l.Input != nil && l.OutGrad != nil {
			return true
		}
	}
	return false
}

// Factors returns the current factors A and G of the layer whose weight is
// named weight (views of the state), or nils.
func (o *KFAC) Factors(weight string) (a, g *tensor.Tensor) {
	if l := o.byWeight[weight]; l != nil {
		return l.a, l.g
	}
	return nil, nil
}

// State implements Optimizer.
func (o *KFAC) State() []nn.Param { return o.s.state }

// SetLR implements Optimizer.
func (o *KFAC) SetLR(lr float32) { o.cfg.LR = lr }

// Config is the current configuration.
func (o *KFAC) Config() KFACConfig { return o.cfg }

// Reset implements Optimizer: rooted's reset, and every layer's factors
// counted as never updated.
func (o *KFAC) Reset(e *ops.Engine) error {
	if err := o.rooted.Reset(e); err != nil {
		return err
	}
	for _, l := range o.layers {
		l.updated = 0
	}
	return nil
}

// Free, Steps, Counter, RootStats and Capturable come from rooted.

var (
	_ Optimizer = (*KFAC)(nil)
	_ Capturer  = (*KFAC)(nil)
	_ Phaser    = (*KFAC)(nil)
)
