package nn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// GPTConfig is a decoder-only transformer in nanoGPT's shape (Karpathy,
// github.com/karpathy/nanoGPT model.py; Radford et al. 2019, GPT-2): token
// and learned position embeddings, Layers pre-LayerNorm blocks (LN → causal
// self-attention → residual; LN → MLP of width 4·DModel with GELU →
// residual), a final LayerNorm and a language-model head tied to the token
// embedding.
type GPTConfig struct {
	Vocab  int `json:"vocab"`   // tokens
	Layers int `json:"layers"`  // transformer blocks
	Heads  int `json:"heads"`   // attention heads; DModel/Heads is the head dimension
	DModel int `json:"d_model"` // embedding width
	Block  int `json:"block"`   // context length
	// Bias gives every Linear and LayerNorm a bias (nanoGPT's bias=True,
	// GPT-2's layout); nanoGPT's training default is False.
	Bias bool `json:"bias"`
	// Dropout is the probability of dropping after the embedding sum, on
	// both residual branches and on the attention probabilities inside
	// the flash kernels (nanoGPT's resid, embedding and attn dropout, one
	// config value as there), in training graphs only.
	Dropout float32 `json:"dropout"`
	// GELUTanh selects the tanh approximation (GPT-2's original); the
	// default is the erf form, PyTorch's nn.GELU() as nanoGPT uses it.
	GELUTanh bool `json:"gelu_tanh,omitempty"`
	// MoE, when set, makes the MLP of every MoE.Every-th block a
	// Mixture-of-Experts layer (moe.go); nil is the dense GPT.
	MoE *MoEConfig `json:"moe,omitempty"`
}

// ErrGPTConfig reports an unusable GPTConfig.
var ErrGPTConfig = errors.New("nn: invalid GPT configuration")

// Validate checks the configuration.
func (c GPTConfig) Validate() error {
	switch {
	case c.Vocab < 1:
		return fmt.Errorf("%w: vocabulary %d", ErrGPTConfig, c.Vocab)
	case c.Layers < 1:
		return fmt.Errorf("%w: --layers %d (want ≥ 1)", ErrGPTConfig, c.Layers)
	case c.Heads < 1 || c.DModel < 1 || c.DModel%c.Heads != 0:
		return fmt.Errorf("%w: --d-model %d must be a positive multiple of --heads %d", ErrGPTConfig, c.DModel, c.Heads)
	case c.DModel/c.Heads > 128:
		return fmt.Errorf("%w: head dimension %d (d-model/heads) above 128", ErrGPTConfig, c.DModel/c.Heads)
	case c.Block < 1:
		return fmt.Errorf("%w: --block %d (want ≥ 1)", ErrGPTConfig, c.Block)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return fmt.Errorf("%w: --dropout %v (want 0 ≤ p < 1)", ErrGPTConfig, c.Dropout)
	}
	if c.MoE != nil {
		return c.MoE.Validate()
	}
	return nil
}

// HeadDim is DModel / Heads.
func (c GPTConfig) HeadDim() int { return c.DModel / c.Heads }

func (c GPTConfig) geluForm() ops.GELUForm {
	if c.GELUTanh {
		return ops.GELUTanh
	}
	return ops.GELUErf
}

// GPT holds a GPT's parameters (f32 masters) and, when made for training,
// their gradients, in nanoGPT's names and layouts, so a state dict of
// safetensors loads into nanoGPT's GPT with load_state_dict.
type GPT struct {
	cfg    GPTConfig
	params []Param
	byName map[string]Param
	bufs   []*tensor.Tensor // what Free frees: not gradients from SetGrads
}

// gptParam names one parameter and its shape; init is its initialisation.
type gptParam struct {
	name  string
	shape []int
	init  func(r *rand.Rand, v []float32)
}

// specs lists the parameters in nanoGPT's state-dict order.
func (c GPTConfig) specs() []gptParam {
	C := c.DModel
	normal := func(std float64) func(r *rand.Rand, v []float32) {
		return func(r *rand.Rand, v []float32) {
			for i := range v {
				v[i] = float32(std * r.NormFloat64())
			}
		}
	}
	fill := func(x float32) func(r *rand.Rand, v []float32) {
		return func(_ *rand.Rand, v []float32) {
			for i := range v {
				v[i] = x
			}
		}
	}
	// nanoGPT's _init_weights: N(0, 0.02) for Linear and Embedding
	// weights, zero biases, LayerNorm weight 1 and bias 0; residual
	// projections (c_proj) N(0, 0.02/√(2·layers)) (GPT-2 paper, §2.3).
	w, proj := normal(0.02), normal(0.02/math.Sqrt(2*float64(c.Layers)))
	var ps []gptParam
	add := func(name string, init func(*rand.Rand, []float32), shape ...int) {
		ps = append(ps, gptParam{name: name, shape: shape, init: init})
	}
	add("transformer.wte.weight", w, c.Vocab, C)
	add("transformer.wpe.weight", w, c.Block, C)
	for l := 0; l < c.Layers; l++ {
		h := "transformer.h." + strconv.Itoa(l) + "."
		add(h+"ln_1.weight", fill(1), C)
		if c.Bias {
			add(h+"ln_1.bias", fill(0), C)
		}
		add(h+"attn.c_attn.weight", w, 3*C, C)
		if c.Bias {
			add(h+"attn.c_attn.bias", fill(0), 3*C)
		}
		add(h+"attn.c_proj.weight", proj, C, C)
		if c.Bias {
			add(h+"attn.c_proj.bias", fill(0), C)
		}
		add(h+"ln_2.weight", fill(1), C)
		if c.Bias {
			add(h+"ln_2.bias", fill(0), C)
		}
		if c.IsMoE(l) {
			ps = append(ps, c.moeSpecs(h, w, proj, fill(0))...)
			continue
		}
		add(h+"mlp.c_fc.weight", w, 4*C, C)
		if c.Bias {
			add(h+"mlp.c_fc.bias", fill(0), 4*C)
		}
		add(h+"mlp.c_proj.weight", proj, C, 4*C)
		if c.Bias {
			add(h+"mlp.c_proj.bias", fill(0), C)
		}
	}
	add("transformer.ln_f.weight", fill(1), C)
	if c.Bias {
		add("transformer.ln_f.bias", fill(0), C)
	}
	return ps
}

// NewGPT allocates the parameters through a, named
// <prefix>/params/<name> (and, with grads, <prefix>/grads/<name>), and
// initialises them as nanoGPT does from seed (math/rand/v2's PCG, in
// state-dict order). Nothing stays allocated on error.
func NewGPT(a device.Allocator, prefix string, cfg GPTConfig, grads bool, seed uint64) (m *GPT, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m = &GPT{cfg: cfg, byName: map[string]Param{}}
	defer func() {
		if err != nil {
			m.Free()
			m = nil
		}
	}()
	rng := rand.New(rand.NewPCG(seed, 0x677074)) // "gpt"
	for _, s := range cfg.specs() {
		v, err := tensor.Alloc(a, join(prefix, "params", s.name), tensor.F32, s.shape...)
		if err != nil {
			return m, fmt.Errorf("nn: allocating %s: %w", s.name, err)
		}
		m.bufs = append(m.bufs, v)
		p := Param{Name: s.name, Value: v}
		if grads {
			if p.Grad, err = tensor.Alloc(a, join(prefix, "grads", s.name), tensor.F32, s.shape...); err != nil {
				return m, fmt.Errorf("nn: allocating the gradient of %s: %w", s.name, err)
			}
			m.bufs = append(m.bufs, p.Grad)
		}
		vals := make([]float32, v.Numel())
		s.init(rng, vals)
		if err := v.WriteF32(vals); err != nil {
			return m, fmt.Errorf("nn: initialising %s: %w", s.name, err)
		}
		m.params = append(m.params, p)
		m.byName[s.name] = p
	}
	return m, nil
}

// SetGrads gives a model made without gradients (NewGPT with grads
// false) the caller's gradient storage, one tensor per parameter in
// Params' order, each an f32 tensor of the parameter's shape on its device
// (contiguous; views are fine): for data-parallel training, the
// per-parameter views of dist.Layout's bucket buffers, so that one
// all-reduce per bucket reduces the gradients where the backward wrote
// them, with no packing copy (PyTorch DDP's gradient_as_bucket_view).
// The caller keeps ownership (Free does not free them). Record after
// SetGrads. Errors wrap ErrGPTConfig.
func (m *GPT) SetGrads(grads []*tensor.Tensor) error {
	if len(grads) != len(m.params) {
		return fmt.Errorf("%w: %d gradient tensors for %d parameters", ErrGPTConfig, len(grads), len(m.params))
	}
	for i, p := range m.params {
		if p.Grad != nil {
			return fmt.Errorf("%w: the model already has gradients (%s)", ErrGPTConfig, p.Name)
		}
		g := grads[i]
		switch {
		case g == nil || g.Buf == nil:
			return fmt.Errorf("%w: no gradient tensor for %s", ErrGPTConfig, p.Name)
		case g.DType != tensor.F32 || !slices.Equal(g.Shape, p.Value.Shape) || !g.Contiguous():
			return fmt.Errorf("%w: the gradient of %s is %v %v (contiguous %v), want f32 %v", ErrGPTConfig, p.Name,
				g.DType, g.Shape, g.Contiguous(), p.Value.Shape)
		case g.Device() != p.Value.Device() && g.Device().String() != p.Value.Device().String():
			return fmt.Errorf("%w: the gradient of %s is on %v, the parameter on %v", ErrGPTConfig, p.Name, g.Device(), p.Value.Device())
		}
	}
	for i := range m.params {
		m.params[i].Grad = grads[i]
		m.byName[m.params[i].Name] = m.params[i]
	}
	return nil
}

// SetParams moves the parameters into the caller's storage, one tensor
// per parameter in Params' order, each an f32 tensor of the parameter's
// shape on its device (contiguous; views are fine): for ZeRO-1, the
// per-parameter views of a dist.Layout's bucket buffers laid out like the
// gradients, so that one in-place all-gather per bucket brings every
// rank's updated part of the parameters to every rank with no packing
// copy. The current values are copied in (through the host) and the
// model's own parameter buffers freed; the caller keeps ownership of the
// new storage (Free does not free it). Call before Record (graphs
// recorded earlier keep reading the old buffers). Errors wrap
// ErrGPTConfig; on error nothing has changed.
func (m *GPT) SetParams(values []*tensor.Tensor) error {
	if len(values) != len(m.params) {
		return fmt.Errorf("%w: %d parameter tensors for %d parameters", ErrGPTConfig, len(values), len(m.params))
	}
	for i, p := range m.params {
		v := values[i]
		switch {
		case v == nil || v.Buf == nil:
			return fmt.Errorf("%w: no storage for %s", ErrGPTConfig, p.Name)
		case v.DType != tensor.F32 || !slices.Equal(v.Shape, p.Value.Shape) || !v.Contiguous():
			return fmt.Errorf("%w: the storage of %s is %v %v (contiguous %v), want f32 %v", ErrGPTConfig, p.Name,
				v.DType, v.Shape, v.Contiguous(), p.Value.Shape)
		case v.Device() != p.Value.Device() && v.Device().String() != p.Value.Device().String():
			return fmt.Errorf("%w: the storage of %s is on %v, the parameter on %v", ErrGPTConfig, p.Name, v.Device(), p.Value.Device())
		}
	}
	for i, p := range m.params {
		b, err := p.Value.Read()
		if err != nil {
			return fmt.Errorf("nn: reading %s: %w", p.Name, err)
		}
		if err := values[i].Write(b); err != nil {
			return fmt.Errorf("nn: moving %s: %w", p.Name, err)
		}
	}
	var errs []error
	for i := range m.params {
		old := m.params[i].Value
		m.bufs = slices.DeleteFunc(m.bufs, func(t *tensor.Tensor) bool {
			if t.Buf == old.Buf {
				errs = append(errs, t.Buf.Free())
				return true
			}
			return false
		})
		m.params[i].Value = values[i]
		m.byName[m.params[i].Name] = m.params[i]
	}
	return errors.Join(errs...)
}

// Config is the model's configuration.
func (m *GPT) Config() GPTConfig { return m.cfg }

// Params lists the parameters in nanoGPT's state-dict order (the tied
// lm_head.weight is transformer.wte.weight and is not listed twice). The
// slice is shared; do not modify it.
func (m *GPT) Params() []Param { return m.params }

// Param returns the parameter called name.
func (m *GPT) Param(name string) (Param, bool) {
	p, ok := m.byName[name]
	return p, ok
}

// TiedHead is the state-dict name of the language-model head, which is the
// token embedding's tensor (nanoGPT ties them; its state dict lists both).
const TiedHead = "lm_head.weight"

// StateDict is what a checkpoint stores for nanoGPT's load_state_dict:
// every parameter by name, plus lm_head.weight (the token embedding again).
func (m *GPT) StateDict() []Param {
	out := append([]Param(nil), m.params...)
	return append(out, Param{Name: TiedHead, Value: m.byName["transformer.wte.weight"].Value})
}

// NumParams counts parameters as nanoGPT's get_num_params does: the tied
// head once, position embeddings excluded when nonEmbedding.
func (m *GPT) NumParams(nonEmbedding bool) int {
	n := 0
	for _, p := range m.params {
		if nonEmbedding && p.Name == "transformer.wpe.weight" {
			continue
		}
		n += p.Value.Numel()
	}
	return n
}

// FLOPsPerToken is nanoGPT's estimate_mfu count for one training token at
// context t: 6N (forward and backward through the weights, N without
// position embeddings; with MoE layers the active parameters,
// ActiveParams) + 12·layers·heads·headdim·t (attention), PaLM appendix B.
func (m *GPT) FLOPsPerToken(t int) float64 {
	c := m.cfg
	return 6*float64(m.ActiveParams(true)) + 12*float64(c.Layers*c.Heads*c.HeadDim()*t)
}

// Free releases the parameters and gradients.
func (m *GPT) Free() error {
	var errs []error
	for _, t := range m.bufs {
		errs = append(errs, t.Buf.Free())
	}
	m.bufs = nil
	return errors.Join(errs...)
}

// GPTStep is a GPT's forward pass (and, for training, backward) over a
// static batch recorded on an ops.Graph: the caller writes Idx and
// Targets ([batch, block] i32 token ids) and runs Graph.Forward (and
// Backward); Loss holds the mean cross-entropy.
type GPTStep struct {
	Graph   *ops.Graph
	Idx     *tensor.Tensor // [batch, block] i32 input tokens
	Targets *tensor.Tensor // [batch, block] i32 next tokens
	Loss    *tensor.Tensor // [1] f32
	Logits  *ops.Var       // [batch, block, vocab]
	// AuxLosses, for a GPT with MoE layers (nil without), holds the sums
	// over those layers of the load-balancing loss and the router z-loss
	// ([2] f32, unscaled; ops.Engine.MoEAuxLoss). The objective whose
	// gradient the backward computes is Loss + MoE.AuxLoss·AuxLosses[0] +
	// MoE.ZLoss·AuxLosses[1].
	AuxLosses *tensor.Tensor
	pos       *tensor.Tensor
}

// Record builds the GPT's forward on a new graph over e with opts
// (autocast, dropout), batch sequences of the full block length, buffers
// from a named <prefix>/acts/... and <prefix>/grads/...; with grads the
// graph is built for training (the model must have gradients).
func (m *GPT) Record(e *ops.Engine, a device.Allocator, prefix string, batch int, opts ops.GraphOptions, grads bool) (s *GPTStep, err error) {
	if batch < 1 {
		return nil, fmt.Errorf("%w: batch %d", ErrGPTConfig, batch)
	}
	if grads && m.params[0].Grad == nil {
		return nil, fmt.Errorf("%w: a training graph needs a model made with gradients", ErrGPTConfig)
	}
	c := m.cfg
	B, T := batch, c.Block
	g := ops.NewGraph(e, a, prefix, opts)
	s = &GPTStep{Graph: g}
	defer func() {
		if err != nil {
			g.Free()
			s.free()
			s = nil
		}
	}()
	in := func(name string) (*tensor.Tensor, error) {
		t, err := tensor.Alloc(a, join(prefix, "acts", name), tensor.I32, B, T)
		if err != nil {
			return nil, fmt.Errorf("nn: allocating %s: %w", name, err)
		}
		return t, nil
	}
	if s.Idx, err = in("idx"); err != nil {
		return s, err
	}
	if s.Targets, err = in("targets"); err != nil {
		return s, err
	}
	if s.pos, err = in("pos"); err != nil {
		return s, err
	}
	pos := make([]int32, B*T)
	for i := range pos {
		pos[i] = int32(i % T)
	}
	if err := s.pos.Write(tensor.AsBytes(pos)); err != nil {
		return s, err
	}
	p := func(name string) *ops.Var {
		if q, ok := m.byName[name]; ok {
			return g.Param(name, q.Value, q.Grad)
		}
		return nil
	}
	wte := p("transformer.wte.weight")
	x := g.Add(g.Embedding(wte, g.Input("idx", s.Idx)), g.Embedding(p("transformer.wpe.weight"), g.Input("pos", s.pos)))
	x = g.Dropout(x, c.Dropout)
	const eps = 1e-5 // nn.LayerNorm's default, as nanoGPT uses it
	// Each residual add and the LayerNorm after it are one op
	// (Graph.AddLayerNorm): block l's ln_2 follows its attention branch,
	// and the next block's ln_1 (or ln_f) follows its MLP branch.
	ln := func(l int) (w, b *ops.Var) {
		if l == c.Layers {
			return p("transformer.ln_f.weight"), p("transformer.ln_f.bias")
		}
		h := "transformer.h." + strconv.Itoa(l) + "."
		return p(h + "ln_1.weight"), p(h + "ln_1.bias")
	}
	w0, b0 := ln(0)
	h := g.Scope("h0").LayerNorm(x, w0, b0, eps)
	var moeLosses []*ops.Var
	for l := 0; l < c.Layers; l++ {
		hn := "transformer.h." + strconv.Itoa(l) + "."
		sg := g.Scope("h" + strconv.Itoa(l))
		a := sg.SelfAttention(sg.Linear(h, p(hn+"attn.c_attn.weight"), p(hn+"attn.c_attn.bias"), ops.ActNone), c.Heads, true, c.Dropout)
		a = sg.Dropout(sg.Linear(a, p(hn+"attn.c_proj.weight"), p(hn+"attn.c_proj.bias"), ops.ActNone), c.Dropout)
		var f *ops.Var
		x, f = sg.AddLayerNorm(x, a, p(hn+"ln_2.weight"), p(hn+"ln_2.bias"), eps)
		if c.IsMoE(l) {
			var ls *ops.Var
			f, ls = m.moeMLP(sg, sg.View(f, B*T, c.DModel), hn, p)
			f = sg.Dropout(sg.View(f, B, T, c.DModel), c.Dropout)
			moeLosses = append(moeLosses, ls)
		} else {
			f = sg.GELU(sg.Linear(f, p(hn+"mlp.c_fc.weight"), p(hn+"mlp.c_fc.bias"), ops.ActNone), c.geluForm())
			f = sg.Dropout(sg.Linear(f, p(hn+"mlp.c_proj.weight"), p(hn+"mlp.c_proj.bias"), ops.ActNone), c.Dropout)
		}
		wn, bn := ln(l + 1)
		x, h = sg.AddLayerNorm(x, f, wn, bn, eps)
	}
	x = h
	s.Logits = g.Linear(x, wte, nil, ops.ActNone) // the head tied to the token embedding
	targets, err := s.Targets.View(B * T)
	if err != nil {
		return s, err
	}
	loss := g.CrossEntropy(g.View(s.Logits, B*T, c.Vocab), g.Input("targets", targets))
	var aux *ops.Var
	if len(moeLosses) > 0 {
		aux = sumLosses(g, moeLosses)
	}
	if err := g.Build(grads); err != nil {
		return s, err
	}
	s.Loss = loss.Value
	if aux != nil {
		s.AuxLosses = aux.Value
	}
	return s, nil
}

func (s *GPTStep) free() {
	for _, t := range []*tensor.Tensor{s.Idx, s.Targets, s.pos} {
		if t != nil {
			t.Buf.Free()
		}
	}
}

// Free releases the step's buffers (not the model's).
func (s *GPTStep) Free() error {
	err := s.Graph.Free()
	s.free()
	return err
}
