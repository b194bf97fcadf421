package optim

import (
	"fmt"
	"math"
	"sort"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// MuonConfig configures Muon (Jordan et al. 2024, "Muon: an optimizer for
// hidden layers in neural networks", kellerjordan.github.io/posts/muon)
// for the 2-D hidden weights, and AdamW for every other parameter
// (embeddings, output heads, norms, biases). For a hidden weight W [m, n]
// with gradient g:
//
//	B ← μ·B + g;  U = g + μ·B (Nesterov) or B
//	O = NewtonSchulz5(U/‖U‖_F)     (bf16; (a, b, c) = (3.4445, −4.7750, 2.0315))
//	W ← W·(1 − LR·WeightDecay) − LR·max(1, m/n)^½·O
//
// See ops.MuonPrep, ops.NewtonSchulz and ops.MuonApply. Weights of one
// shape, or of its transpose (m×n and n×m), are orthogonalised together,
// as one batch of GEMMs.
type MuonConfig struct {
	LR, Momentum, WeightDecay float32
	Nesterov                  bool
	// Steps of Newton–Schulz (0: 5).
	Steps int
	// F32 orthogonalises in f32 instead of bf16.
	F32 bool
	// AdamW is the configuration of the other parameters' AdamW.
	AdamW ops.AdamWConfig
	// AdamWParams lists substrings of the names of 2-D parameters that
	// take AdamW (embeddings and output heads).
	AdamWParams []string
	// LRScale, when set, is an f32 scalar on the engine's device that
	// multiplies both groups' learning rates when the step runs: a
	// schedule a captured graph follows (the caller rewrites the scalar).
	LRScale *tensor.Tensor
}

// DefaultMuon is Muon's reference setting (lr 0.02, momentum 0.95,
// Nesterov, 5 steps, no weight decay), with PyTorch's default AdamW for
// the other parameters, which are the vectors and the 2-D parameters whose
// names contain "wte", "wpe", "emb" or "head" (nanoGPT's embeddings and
// lm_head).
var DefaultMuon = MuonConfig{LR: 0.02, Momentum: 0.95, Nesterov: true, Steps: 5, AdamW: ops.DefaultAdamW,
	AdamWParams: []string{"wte", "wpe", "emb", "head"}}

func (c MuonConfig) validate() error {
	a := c.AdamW
	if !(c.LR >= 0 && c.Momentum >= 0 && c.Momentum < 1 && c.WeightDecay >= 0 && c.Steps >= 0 && c.Steps <= 100 &&
		a.LR >= 0 && a.Beta1 >= 0 && a.Beta1 < 1 && a.Beta2 >= 0 && a.Beta2 < 1 && a.Eps > 0 && a.WeightDecay >= 0) {
		return fmt.Errorf("%w: Muon %+v", ErrConfig, c)
	}
	return nil
}

// muonGroup is the hidden weights of one shape up to transposition: an
// m×n and an n×m weight are orthogonalised in the same batch (ops.MuonPrep
// writes a tall weight transposed), so a transformer's MLP input and
// output weights (d×4d and 4d×d) take one Newton–Schulz batch, not two.
type muonGroup struct {
	r, c  int // the batch's matrices: r = min(m, n) rows, c = max(m, n) columns
	p, g  []*tensor.Tensor
	buf   []*tensor.Tensor // state: momentum buffers
	x     *tensor.Tensor   // work: [L, r, c] orthogonalised matrices
	scale []float32        // per weight: √max(1, m/n)
}

// Muon is the optimizer of MuonConfig.
type Muon struct {
	cfg          MuonConfig
	lr0          float32 // LR at construction: SetLR scales AdamW's LR by lr/lr0
	adamLR0      float32
	s            state
	groups       []*muonGroup
	adamP, adamG []*tensor.Tensor
	adamM, adamV []*tensor.Tensor
	step         *tensor.Tensor
	adamCfg      ops.AdamWConfig
}

// NewMuon allocates Muon's state through a: "<name>.momentum_buffer" per
// hidden weight, "<name>.exp_avg" and "<name>.exp_avg_sq" per other
// parameter, and "step" ([1] i32, AdamW's counter, advanced every step).
func NewMuon(a device.Allocator, prefix string, params []nn.Param, cfg MuonConfig) (o *Muon, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkParams(params); err != nil {
		return nil, err
	}
	if cfg.Steps == 0 {
		cfg.Steps = 5
	}
	o = &Muon{cfg: cfg, lr0: cfg.LR, adamLR0: cfg.AdamW.LR, adamCfg: cfg.AdamW}
	o.adamCfg.LRScale = cfg.LRScale
	defer func() {
		if err != nil {
			o.s.free()
			o = nil
		}
	}()
	if err := o.s.init(params); err != nil {
		return o, err
	}
	byShape := map[[2]int]*muonGroup{}
	var noDecay []bool
	for _, p := range params {
		if p.Value.Rank() != 2 || matches(p.Name, cfg.AdamWParams) {
			m, err := o.s.zeros(a, prefix, p.Name+".exp_avg", tensor.F32, p.Value.Shape...)
			if err != nil {
				return o, err
			}
			v, err := o.s.zeros(a, prefix, p.Name+".exp_avg_sq", tensor.F32, p.Value.Shape...)
			if err != nil {
				return o, err
			}
			o.adamP, o.adamG = append(o.adamP, p.Value), append(o.adamG, p.Grad)
			o.adamM, o.adamV = append(o.adamM, m), append(o.adamV, v)
			noDecay = append(noDecay, p.Value.Rank() < 2)
			continue
		}
		m, n := p.Value.Dim(0), p.Value.Dim(1)
		key := [2]int{min(m, n), max(m, n)}
		g := byShape[key]
		if g == nil {
			g = &muonGroup{r: key[0], c: key[1]}
			byShape[key] = g
		}
		g.scale = append(g.scale, float32(math.Sqrt(math.Max(1, float64(m)/float64(n)))))
		b, err := o.s.zeros(a, prefix, p.Name+".momentum_buffer", tensor.F32, p.Value.Shape...)
		if err != nil {
			return o, err
		}
		g.p, g.g, g.buf = append(g.p, p.Value), append(g.g, p.Grad), append(g.buf, b)
	}
	if o.adamCfg.NoDecay == nil && len(o.adamP) > 0 {
		o.adamCfg.NoDecay = noDecay // biases and norms: no decay, as nanoGPT's groups
	}
	for _, g := range byShape {
		o.groups = append(o.groups, g)
	}
	sort.Slice(o.groups, func(i, j int) bool {
		return o.groups[i].r < o.groups[j].r || (o.groups[i].r == o.groups[j].r && o.groups[i].c < o.groups[j].c)
	})
	dt := tensor.BF16
	if cfg.F32 {
		dt = tensor.F32
	}
	for _, g := range o.groups {
		if g.x, err = o.s.work(a, prefix, fmt.Sprintf("muon/%dx%d", g.r, g.c), dt, len(g.p), g.r, g.c); err != nil {
			return o, err
		}
	}
	if o.step, err = o.s.zeros(a, prefix, "step", tensor.I32, 1); err != nil {
		return o, err
	}
	return o, nil
}

// Step implements Optimizer: per shape group (up to transposition), the momentum and
// normalisation of every weight into one batch (ops.MuonPreps, multi-tensor
// launches), Newton–Schulz on the batch, the updates (ops.MuonApplies); then AdamW for the other parameters (which also
// advances the step counter). Everything is queued on e with no host state
// that changes between steps: the step may be captured into a graph (at a
// constant learning rate).
func (o *Muon) Step(e *ops.Engine) error {
	c := o.cfg
	for _, g := range o.groups {
		preps := make([]ops.MuonPrep, len(g.p))
		ws := make([]ops.MuonWeight, len(g.p))
		for l := range g.p {
			x, err := g.x.Select(0, l)
			if err != nil {
				return err
			}
			preps[l] = ops.MuonPrep{G: g.g[l], Buf: g.buf[l], X: x, Mu: c.Momentum, Nesterov: c.Nesterov}
			ws[l] = ops.MuonWeight{P: g.p[l], X: x, Scale: g.scale[l]}
		}
		if err := e.MuonPreps(preps); err != nil {
			return err
		}
		if err := e.NewtonSchulz(ops.NewtonSchulz{X: g.x, Steps: c.Steps}); err != nil {
			return err
		}
		if err := e.MuonApplies(ws, c.LRScale, c.LR, c.WeightDecay); err != nil {
			return err
		}
	}
	return e.AdamW(o.adamP, o.adamG, o.adamM, o.adamV, o.step, o.adamCfg)
}

// State implements Optimizer.
func (o *Muon) State() []nn.Param { return o.s.state }

// SetLR implements Optimizer: Muon's learning rate becomes lr and AdamW's
// keeps its ratio to it (a schedule scales both groups).
func (o *Muon) SetLR(lr float32) {
	o.cfg.LR = lr
	if o.lr0 > 0 {
		o.adamCfg.LR = o.adamLR0 * lr / o.lr0
	}
}

// Config is the current configuration.
func (o *Muon) Config() MuonConfig { return o.cfg }

// SetLRScale sets LRScale (nil: none) for later steps.
func (o *Muon) SetLRScale(t *tensor.Tensor) {
	o.cfg.LRScale = t
	o.adamCfg.LRScale = t
}

// Counter is the device's step counter ([1] i32).
func (o *Muon) Counter() *tensor.Tensor { return o.step }

// Capturable implements Capturer: true.
func (o *Muon) Capturable() bool { return true }

// Reset implements Optimizer.
func (o *Muon) Reset(e *ops.Engine) error { return o.s.reset(e) }

// Free implements Optimizer.
func (o *Muon) Free() error { return o.s.free() }

var (
	_ Optimizer = (*Muon)(nil)
	_ Capturer  = (*Muon)(nil)
)
