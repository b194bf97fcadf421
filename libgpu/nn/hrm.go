package nn

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// HRMConfig is the Hierarchical Reasoning Model (Wang et al. 2025, "
// Hierarchical Reasoning Model", arXiv 2506.21734; sapientinc/HRM
// models/hrm/hrm_act_v1.py) in the layout bench/reference/hrm.py's
// docstring fixes: a sequence of SeqLen tokens after one learned puzzle
// token (position 0), an H (slow) and an L (fast) recurrent module of
// post-norm transformer blocks (non-causal attention with rotary position
// embedding, SwiGLU, RMSNorm without weights, no biases), run HCycles ×
// LCycles times per segment, and adaptive computation time with a Q head
// (halt, continue) on the puzzle token. The JSON names are hrm.py's
// ARCH_DEFAULTS keys (the "config" metadata of its weights files).
type HRMConfig struct {
	Hidden       int     `json:"hidden"`         // model width
	Heads        int     `json:"heads"`          // attention heads; Hidden/Heads is the head dimension
	HLayers      int     `json:"h_layers"`       // blocks of the H module
	LLayers      int     `json:"l_layers"`       // blocks of the L module
	HCycles      int     `json:"h_cycles"`       // H updates per segment
	LCycles      int     `json:"l_cycles"`       // L updates per H update
	Expansion    float64 `json:"expansion"`      // SwiGLU expansion (ops.SwiGLUInter)
	HaltMaxSteps int     `json:"halt_max_steps"` // segments at most (ACT)
	// HaltExplorationProb is the probability of ACT's exploration draw;
	// the draws come with the data (sudoku.MinHaltSteps), so the model
	// only records it.
	HaltExplorationProb float64 `json:"halt_exploration_prob"`
	Vocab               int     `json:"vocab"`          // tokens (Sudoku: 11, digit + 1 with 0 pad and 1 blank)
	SeqLen              int     `json:"seq_len"`        // cells (Sudoku: 81)
	NumPuzzleIDs        int     `json:"num_puzzle_ids"` // puzzle identifiers (Sudoku: 1)
	RopeTheta           float64 `json:"rope_theta"`     // RoPE base
	RMSEps              float64 `json:"rms_eps"`        // RMSNorm epsilon
}

// DefaultHRM is hrm.py's ARCH_DEFAULTS: the reference's Sudoku-Extreme
// run (config/arch/hrm_v1.yaml): hidden 512, 8 heads, 4 + 4 layers, 2 × 2
// cycles, expansion 4, at most 16 segments, exploration 0.1.
func DefaultHRM() HRMConfig {
	return HRMConfig{Hidden: 512, Heads: 8, HLayers: 4, LLayers: 4, HCycles: 2, LCycles: 2, Expansion: 4,
		HaltMaxSteps: 16, HaltExplorationProb: 0.1, Vocab: 11, SeqLen: 81, NumPuzzleIDs: 1, RopeTheta: 10000, RMSEps: 1e-5}
}

// ErrHRMConfig reports an unusable HRMConfig, weights file or batch.
var ErrHRMConfig = errors.New("nn: invalid HRM configuration")

// Validate checks the configuration.
func (c HRMConfig) Validate() error {
	switch {
	case c.Hidden < 1 || c.Heads < 1 || c.Hidden%c.Heads != 0:
		return fmt.Errorf("%w: hidden %d must be a positive multiple of heads %d", ErrHRMConfig, c.Hidden, c.Heads)
	case c.HeadDim() > 128 || c.HeadDim()%2 != 0:
		return fmt.Errorf("%w: head dimension %d (want even, at most 128)", ErrHRMConfig, c.HeadDim())
	case c.HLayers < 1 || c.LLayers < 1 || c.HCycles < 1 || c.LCycles < 1:
		return fmt.Errorf("%w: layers %d/%d and cycles %d/%d must be ≥ 1", ErrHRMConfig, c.HLayers, c.LLayers, c.HCycles, c.LCycles)
	case !(c.Expansion > 0) || math.IsInf(c.Expansion, 0):
		return fmt.Errorf("%w: expansion %v", ErrHRMConfig, c.Expansion)
	case c.HaltMaxSteps < 1:
		return fmt.Errorf("%w: halt max steps %d", ErrHRMConfig, c.HaltMaxSteps)
	case !(c.HaltExplorationProb >= 0 && c.HaltExplorationProb <= 1):
		return fmt.Errorf("%w: halt exploration probability %v", ErrHRMConfig, c.HaltExplorationProb)
	case c.NumPuzzleIDs != 1:
		// The sign-SGD of the puzzle embedding is applied densely, which is
		// HRM's sparse update only when every batch holds every identifier.
		return fmt.Errorf("%w: %d puzzle identifiers (one is supported: Sudoku's)", ErrHRMConfig, c.NumPuzzleIDs)
	case c.Vocab < 1 || c.Vocab+c.NumPuzzleIDs > 256:
		return fmt.Errorf("%w: vocabulary %d (tokens are bytes on the device: at most %d)", ErrHRMConfig, c.Vocab, 256-c.NumPuzzleIDs)
	case c.SeqLen < 1:
		return fmt.Errorf("%w: sequence length %d", ErrHRMConfig, c.SeqLen)
	case !(c.RopeTheta > 0) || !(c.RMSEps >= 0):
		return fmt.Errorf("%w: rope theta %v, rms eps %v", ErrHRMConfig, c.RopeTheta, c.RMSEps)
	}
	return nil
}

// HeadDim is Hidden / Heads.
func (c HRMConfig) HeadDim() int { return c.Hidden / c.Heads }

// Positions is the model's sequence length: the puzzle token and the cells.
func (c HRMConfig) Positions() int { return c.SeqLen + 1 }

// Inter is the SwiGLU width (ops.SwiGLUInter: 1536 at the defaults).
func (c HRMConfig) Inter() int { return ops.SwiGLUInter(c.Hidden, c.Expansion) }

// PuzzleToken is the embedding-table row of puzzle identifier 0: the
// model reads its token embeddings and its puzzle embedding from one table
// of Vocab + NumPuzzleIDs rows (embed_tokens then puzzle_emb, adjacent in
// the weights), so position 0 takes row Vocab.
func (c HRMConfig) PuzzleToken() int { return c.Vocab }

// HRMTensor is one tensor of the weights file: its name (the reference's
// state_dict name), shape, and offset in the flat parameter buffer.
type HRMTensor struct {
	Name   string
	Shape  []int
	Offset int
}

// Numel is the tensor's element count.
func (t HRMTensor) Numel() int { return tensor.Numel(t.Shape) }

// hrmAlign is the alignment (elements) of each tensor's offset in the flat
// buffer (256 bytes in f32: GEMM operands and their bf16 copies aligned).
const hrmAlign = 64

// Tensors lists the weights file's tensors in hrm.py's tensor_names order
// with their offsets in the flat buffer: embed_tokens and puzzle_emb
// adjacent (one embedding table), every other tensor starting at a
// multiple of 64 elements.
func (c HRMConfig) Tensors() (ts []HRMTensor, flat int) {
	h, v, inter := c.Hidden, c.Vocab, c.Inter()
	add := func(name string, align bool, shape ...int) {
		if align {
			flat = (flat + hrmAlign - 1) / hrmAlign * hrmAlign
		}
		ts = append(ts, HRMTensor{Name: name, Shape: shape, Offset: flat})
		flat += tensor.Numel(shape)
	}
	add("inner.embed_tokens.embedding_weight", true, v, h)
	add("inner.puzzle_emb.weights", false, c.NumPuzzleIDs, h)
	add("inner.lm_head.weight", true, v, h)
	add("inner.q_head.weight", true, 2, h)
	add("inner.q_head.bias", true, 2)
	add("inner.H_init", true, h)
	add("inner.L_init", true, h)
	for _, lv := range []struct {
		name string
		n    int
	}{{"H", c.HLayers}, {"L", c.LLayers}} {
		for i := 0; i < lv.n; i++ {
			p := "inner." + lv.name + "_level.layers." + strconv.Itoa(i) + "."
			add(p+"self_attn.qkv_proj.weight", true, 3*h, h)
			add(p+"self_attn.o_proj.weight", true, h, h)
			add(p+"mlp.gate_up_proj.weight", true, 2*inter, h)
			add(p+"mlp.down_proj.weight", true, h, inter)
		}
	}
	return ts, (flat + hrmAlign - 1) / hrmAlign * hrmAlign
}

// HRMFormat is the "format" metadata of HRM weights files (hrm.py's).
const HRMFormat = "gpukit-hrm/1"

// HRM holds an HRM's f32 master weights in one flat buffer (the tensors of
// HRMConfig.Tensors are views of it), their gradients (a flat buffer of the
// same layout, for training), the weights the forward computes with (the
// masters, or a bf16 copy of the flat buffer under bf16 autocast, refreshed
// by every step), and the rotary tables.
type HRM struct {
	cfg      HRMConfig
	layout   []HRMTensor
	n        int
	flat     *tensor.Tensor
	grad     *tensor.Tensor
	params   []Param // layout order: views of flat (and grad)
	byName   map[string]int
	shadow   *tensor.Tensor // bf16 [n], or nil
	cos, sin *tensor.Tensor // f32 [Positions, HeadDim]
	owned    owned
}

// NewHRM allocates an HRM's weights through a (<prefix>/params/flat, with
// grads <prefix>/grads/flat) and initialises them as the reference does
// (hrm.py init): truncated normals (models/common.py trunc_normal_init_,
// JAX's: cut at ±2 standard deviations and rescaled to the given std) of
// std 1/√fan_in for every linear weight, 1/√Hidden for the token
// embedding, 1 for H_init and L_init (rounded to bf16, as the reference
// draws them in bf16); zeros for the puzzle embedding and the Q head's
// weight, −5 for its bias (so training starts by continuing). The draws
// come from math/rand/v2's PCG seeded by seed, tensor by tensor in layout
// order: the same seed gives the same weights on every machine (not
// PyTorch's: hrm.py parity loads one file on both sides). Errors wrap
// ErrHRMConfig or the allocator's; nothing stays allocated on error.
func NewHRM(a device.Allocator, prefix string, cfg HRMConfig, grads bool, seed uint64) (*HRM, error) {
	m, err := newHRM(a, prefix, cfg, grads)
	if err != nil {
		return nil, err
	}
	vals := make([]float32, m.n)
	r := rand.New(rand.NewPCG(seed, 0x68726d)) // "hrm"
	h := float64(cfg.Hidden)
	for _, t := range m.layout {
		v := vals[t.Offset : t.Offset+t.Numel()]
		switch t.Name {
		case "inner.embed_tokens.embedding_weight":
			truncNormal(r, 1/math.Sqrt(h), v)
		case "inner.puzzle_emb.weights", "inner.q_head.weight":
		case "inner.q_head.bias":
			v[0], v[1] = -5, -5
		case "inner.H_init", "inner.L_init":
			truncNormal(r, 1, v)
			copy(v, tensor.RoundBF16(v))
		default: // linear weights [out, in]
			truncNormal(r, 1/math.Sqrt(float64(t.Shape[1])), v)
		}
	}
	if err := m.flat.WriteF32(vals); err != nil {
		m.Free()
		return nil, fmt.Errorf("nn: initialising the HRM: %w", err)
	}
	return m, nil
}

// truncNormal fills v with draws of models/common.py's trunc_normal_init_:
// the normal cut at ±2 of its unit form, rescaled so the std is std
// (erfinv of a uniform between the cut's CDF values).
func truncNormal(r *rand.Rand, std float64, v []float32) {
	if std == 0 {
		clear(v)
		return
	}
	const lo, hi = -2.0, 2.0
	a, b := math.Erf(lo/math.Sqrt2), math.Erf(hi/math.Sqrt2)
	z := (b - a) / 2
	c := 1 / math.Sqrt(2*math.Pi)
	pu, pl := c*math.Exp(-0.5*lo*lo), c*math.Exp(-0.5*hi*hi)
	comp := std / math.Sqrt(1-(hi*pu-lo*pl)/z-((pu-pl)/z)*((pu-pl)/z))
	for i := range v {
		x := math.Erfinv(a+(b-a)*r.Float64()) * math.Sqrt2 * comp
		v[i] = float32(math.Min(math.Max(x, lo*comp), hi*comp))
	}
}

func newHRM(a device.Allocator, prefix string, cfg HRMConfig, grads bool) (m *HRM, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	layout, n := cfg.Tensors()
	m = &HRM{cfg: cfg, layout: layout, n: n, byName: map[string]int{}, owned: owned{a: a, prefix: prefix}}
	defer func() {
		if err != nil {
			m.Free()
			m = nil
		}
	}()
	if m.flat, err = m.owned.alloc("params", "flat", tensor.F32, n); err != nil {
		return m, err
	}
	if grads {
		if m.grad, err = m.owned.alloc("grads", "flat", tensor.F32, n); err != nil {
			return m, err
		}
		if err := m.grad.Write(make([]byte, m.grad.Bytes())); err != nil {
			return m, err
		}
	}
	// Zero the padding between tensors (a bf16 copy of the flat buffer
	// reads it).
	if err := m.flat.Write(make([]byte, m.flat.Bytes())); err != nil {
		return m, err
	}
	for i, t := range layout {
		p := Param{Name: t.Name}
		if p.Value, err = m.view(m.flat, t.Offset, t.Shape...); err != nil {
			return m, err
		}
		if grads {
			if p.Grad, err = m.view(m.grad, t.Offset, t.Shape...); err != nil {
				return m, err
			}
		}
		m.params = append(m.params, p)
		m.byName[t.Name] = i
	}
	T, D := cfg.Positions(), cfg.HeadDim()
	cs, sn, err := ops.RoPETable(T, D, cfg.RopeTheta)
	if err != nil {
		return m, err
	}
	for _, x := range []struct {
		dst **tensor.Tensor
		v   []float32
		n   string
	}{{&m.cos, cs, "rope.cos"}, {&m.sin, sn, "rope.sin"}} {
		if *x.dst, err = m.owned.alloc("acts", x.n, tensor.F32, T, D); err != nil {
			return m, err
		}
		if err := (*x.dst).WriteF32(x.v); err != nil {
			return m, err
		}
	}
	return m, nil
}

func (m *HRM) view(flat *tensor.Tensor, off int, shape ...int) (*tensor.Tensor, error) {
	v, err := flat.Narrow(0, off, tensor.Numel(shape))
	if err != nil {
		return nil, err
	}
	return v.View(shape...)
}

// LoadHRM builds an HRM from a weights file (hrm.py's init and parity
// outputs, or SaveWeights'): its architecture from the "config" metadata
// (JSON of HRMConfig's keys; keys it lacks take DefaultHRM's values, as
// hrm.py fills ARCH_DEFAULTS), then every tensor strictly: the file must
// hold exactly the names of HRMConfig.Tensors (tensors named "optim/..."
// aside), F32, of their shapes. Errors wrap ErrHRMConfig, ckpt's errors
// or the allocator's.
func LoadHRM(a device.Allocator, prefix string, f *ckpt.File, grads bool) (*HRM, error) {
	js, ok := f.Metadata["config"]
	if !ok {
		return nil, fmt.Errorf("%w: the weights file has no \"config\" metadata", ErrHRMConfig)
	}
	cfg := DefaultHRM()
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		return nil, fmt.Errorf("%w: config metadata: %v", ErrHRMConfig, err)
	}
	m, err := newHRM(a, prefix, cfg, grads)
	if err != nil {
		return nil, err
	}
	if err := m.LoadWeights(f); err != nil {
		m.Free()
		return nil, err
	}
	return m, nil
}

// LoadWeights copies every tensor of f into the model (strict, as
// LoadHRM).
func (m *HRM) LoadWeights(f *ckpt.File) error {
	want := map[string]bool{}
	for _, t := range m.layout {
		want[t.Name] = true
	}
	for _, name := range f.Names() {
		if strings.HasPrefix(name, "optim/") {
			continue
		}
		if !want[name] {
			return fmt.Errorf("%w: the weights file holds %q, which the model has not", ErrHRMConfig, name)
		}
	}
	for _, p := range m.params {
		if err := f.Load(p.Name, p.Value); err != nil {
			return fmt.Errorf("%w: %w", ErrHRMConfig, err)
		}
	}
	return nil
}

// SaveWeights writes the weights file of the contract (every tensor F32 by
// its state_dict name; metadata "config" and "format", plus meta).
func (m *HRM) SaveWeights(path string, meta map[string]string) error {
	js, err := json.Marshal(m.cfg)
	if err != nil {
		return err
	}
	md := map[string]string{"config": string(js), "format": HRMFormat}
	for k, v := range meta {
		md[k] = v
	}
	named := make([]ckpt.Named, len(m.params))
	for i, p := range m.params {
		named[i] = ckpt.Named{Name: p.Name, T: p.Value}
	}
	return ckpt.Save(path, named, md)
}

// Config is the model's configuration.
func (m *HRM) Config() HRMConfig { return m.cfg }

// Params lists every tensor of the weights file in HRMConfig.Tensors
// order: views of the flat buffer, with their gradient views when the
// model has gradients. It is the state dict of a checkpoint. The slice is
// shared; do not modify it.
func (m *HRM) Params() []Param { return m.params }

// Param returns the tensor called name.
func (m *HRM) Param(name string) (Param, bool) {
	i, ok := m.byName[name]
	if !ok {
		return Param{}, false
	}
	return m.params[i], true
}

// Flat is the flat f32 buffer of the master weights; FlatGrad its
// gradient's (nil without gradients).
func (m *HRM) Flat() *tensor.Tensor     { return m.flat }
func (m *HRM) FlatGrad() *tensor.Tensor { return m.grad }

// Layout is the flat buffer's layout (HRMConfig.Tensors).
func (m *HRM) Layout() []HRMTensor { return m.layout }

// AdamParams are the tensors AdamATan2 trains: every weight but the
// puzzle embedding (sign-SGD's) and H_init, L_init (fixed buffers in the
// reference).
func (m *HRM) AdamParams() []Param {
	var out []Param
	for _, p := range m.params {
		switch p.Name {
		case "inner.puzzle_emb.weights", "inner.H_init", "inner.L_init":
			continue
		}
		out = append(out, p)
	}
	return out
}

// SignParams are the tensors sign-SGD trains: the puzzle embedding.
func (m *HRM) SignParams() []Param {
	p, _ := m.Param("inner.puzzle_emb.weights")
	return []Param{p}
}

// NumParams counts the trained parameters (AdamParams and SignParams).
func (m *HRM) NumParams() int {
	n := 0
	for _, p := range m.AdamParams() {
		n += p.Value.Numel()
	}
	return n + m.SignParams()[0].Value.Numel()
}

// Free releases the model's buffers.
func (m *HRM) Free() error { return m.owned.free() }

// computeWeights makes the weights the forward computes with available in
// dtype dt: the masters for f32, a bf16 copy of the flat buffer (one per
// model, shared by its steps and evaluations) for bf16.
func (m *HRM) computeWeights(dt tensor.DType) error {
	switch dt {
	case tensor.F32:
		return nil
	case tensor.BF16:
		if m.shadow != nil {
			return nil
		}
		var err error
		m.shadow, err = m.owned.alloc("params", "flat.bf16", tensor.BF16, m.n)
		return err
	}
	return fmt.Errorf("%w: activations in %v (want f32 or bf16)", ErrHRMConfig, dt)
}

// castWeights queues the refresh of the bf16 copy from the masters.
func (m *HRM) castWeights(e *ops.Engine) error {
	if m.shadow == nil {
		return nil
	}
	return e.Cast(m.shadow, m.flat)
}

// weight is the compute view of tensor name in dt (computeWeights first).
func (m *HRM) weight(name string, dt tensor.DType) (*tensor.Tensor, error) {
	i, ok := m.byName[name]
	if !ok {
		return nil, fmt.Errorf("%w: no tensor %q", ErrHRMConfig, name)
	}
	if dt == tensor.F32 {
		return m.params[i].Value, nil
	}
	t := m.layout[i]
	return m.view(m.shadow, t.Offset, t.Shape...)
}

// table is the embedding table [Vocab + NumPuzzleIDs, Hidden] (f32
// masters: embed_tokens then puzzle_emb) and its gradient view.
func (m *HRM) table() (value, grad *tensor.Tensor, err error) {
	rows := m.cfg.Vocab + m.cfg.NumPuzzleIDs
	if value, err = m.view(m.flat, 0, rows, m.cfg.Hidden); err != nil || m.grad == nil {
		return value, nil, err
	}
	grad, err = m.view(m.grad, 0, rows, m.cfg.Hidden)
	return value, grad, err
}

// recordEmbed records the input embedding x = √Hidden·table[tokens]
// (hrm.py's embed_scale·cat(puzzle_emb, embed_tokens(tokens)), the puzzle
// token's row being the table's row Vocab) in the graph's dtype.
func (m *HRM) recordEmbed(g *ops.Graph, table, tokens *ops.Var) *ops.Var {
	return g.Scale(g.Embedding(table, tokens), float32(math.Sqrt(float64(m.cfg.Hidden))))
}

// recordLevel records one level of blocks on h = z + injection (hrm.py's
// Level.forward after its add): per block, post-norm attention and SwiGLU
// (h = rms(h + attn(h)); h = rms(h + mlp(h))), attention non-causal with
// RoPE on q and k. w gives the Var of a weight by name.
func (m *HRM) recordLevel(g *ops.Graph, level string, h *ops.Var, w func(name string) *ops.Var) *ops.Var {
	c := m.cfg
	n := c.HLayers
	if level == "L" {
		n = c.LLayers
	}
	eps := float32(c.RMSEps)
	for i := 0; i < n; i++ {
		p := "inner." + level + "_level.layers." + strconv.Itoa(i) + "."
		s := g.Scope(level + strconv.Itoa(i))
		if h == nil {
			return nil // an earlier call failed: g.Err says why
		}
		B, T := h.Value.Dim(0), h.Value.Dim(1)
		qkv := s.Linear(h, w(p+"self_attn.qkv_proj.weight"), nil, ops.ActNone)
		r := s.RoPE(s.View(qkv, B, T, 3*c.Heads, c.HeadDim()), m.cos, m.sin, 2*c.Heads)
		a := s.SelfAttention(s.View(r, B, T, 3*c.Hidden), c.Heads, false, 0)
		a = s.Linear(a, w(p+"self_attn.o_proj.weight"), nil, ops.ActNone)
		h = s.AddRMSNorm(h, a, nil, eps)
		f := s.SwiGLU(s.Linear(h, w(p+"mlp.gate_up_proj.weight"), nil, ops.ActNone))
		f = s.Linear(f, w(p+"mlp.down_proj.weight"), nil, ops.ActNone)
		h = s.AddRMSNorm(h, f, nil, eps)
	}
	return h
}
