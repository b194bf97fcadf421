package train

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/tensor"
)

// LMConfig defines a language-model training run (`trainer run --model
// gpt`); it is stored in every checkpoint (metadata "config", with "model"
// = "gpt") so resume, eval and generate rebuild the same model.
type LMConfig struct {
	Model nn.GPTConfig `json:"gpt"`
	Batch int          `json:"batch"` // sequences per step, each Model.Block tokens
	Steps int          `json:"steps"` // optimizer steps in all
	// AdamW with nanoGPT's schedule (train.py get_lr): linear warmup to LR
	// over Warmup steps, cosine decay to MinLR at DecaySteps, MinLR after.
	LR          float32 `json:"lr"`
	MinLR       float32 `json:"min_lr"`
	Warmup      int     `json:"warmup"`
	DecaySteps  int     `json:"decay_steps"`
	WeightDecay float32 `json:"weight_decay"` // on weights of rank ≥ 2 only (nanoGPT's groups)
	Beta1       float32 `json:"beta1"`
	Beta2       float32 `json:"beta2"`
	Clip        float32 `json:"clip,omitempty"` // joint gradient norm bound (0: off)
	Seed        uint64  `json:"seed"`           // initialisation, batches, dropout
	EvalEvery   int     `json:"eval_every"`     // steps between validation losses
	EvalBatches int     `json:"eval_batches"`   // fixed validation batches per evaluation
	Data        string  `json:"data,omitempty"` // the text file trained on (informational)
	// Optim is the optimizer ("" or "adamw": AdamW as above; shampoo, soap,
	// muon, kfac, sgd: libgpu/optim's, with LR, WeightDecay, Beta1 and
	// Beta2 where they take them and Precond's settings).
	Optim   string      `json:"optim,omitempty"`
	Precond OptimConfig `json:"precond,omitempty"`
}

// optimName is Optim with its default.
func (c LMConfig) optimName() string {
	if c.Optim == "" {
		return "adamw"
	}
	return c.Optim
}

// DefaultLM is `trainer run --model gpt` without flags: a small GPT (2
// layers, 4 heads, d 128, block 64) on batches of 32 for 600 steps, which
// trains on the host's two cores in about two minutes.
func DefaultLM() LMConfig {
	return LMConfig{
		Model: nn.GPTConfig{Layers: 2, Heads: 4, DModel: 128, Block: 64},
		Batch: 16, Steps: 300, LR: 2e-3, MinLR: 2e-4, Warmup: 30, DecaySteps: 300,
		WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.99, Clip: 1, Seed: 1, EvalEvery: 100, EvalBatches: 8,
	}
}

// Validate checks every field but the vocabulary (known once the text is read).
func (c LMConfig) Validate() error {
	m := c.Model
	if m.Vocab == 0 {
		m.Vocab = 1
	}
	if err := m.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	switch {
	case c.Batch < 1:
		return fmt.Errorf("%w: --batch %d (want ≥ 1)", ErrConfig, c.Batch)
	case c.Steps < 1:
		return fmt.Errorf("%w: --steps %d (want ≥ 1)", ErrConfig, c.Steps)
	case !(c.LR > 0) || c.LR > 10:
		return fmt.Errorf("%w: --lr %v (want 0 < lr ≤ 10)", ErrConfig, c.LR)
	case !(c.MinLR >= 0) || c.MinLR > c.LR:
		return fmt.Errorf("%w: --min-lr %v (want 0 ≤ min-lr ≤ lr)", ErrConfig, c.MinLR)
	case c.Warmup < 0 || c.DecaySteps < c.Warmup:
		return fmt.Errorf("%w: --warmup %d, --decay-steps %d (want 0 ≤ warmup ≤ decay-steps)", ErrConfig, c.Warmup, c.DecaySteps)
	case !(c.WeightDecay >= 0):
		return fmt.Errorf("%w: --weight-decay %v", ErrConfig, c.WeightDecay)
	case !(c.Beta1 >= 0 && c.Beta1 < 1 && c.Beta2 >= 0 && c.Beta2 < 1):
		return fmt.Errorf("%w: --beta1 %v, --beta2 %v (want 0 ≤ β < 1)", ErrConfig, c.Beta1, c.Beta2)
	case !(c.Clip >= 0) || math.IsInf(float64(c.Clip), 1):
		return fmt.Errorf("%w: --clip %v", ErrConfig, c.Clip)
	case c.EvalEvery < 1 || c.EvalBatches < 1:
		return fmt.Errorf("%w: --eval-every %d, --eval-batches %d (want ≥ 1)", ErrConfig, c.EvalEvery, c.EvalBatches)
	}
	return c.Precond.validate(c.optimName())
}

// LRAt is the learning rate of step it (0-based), nanoGPT's get_lr:
// lr·(it+1)/(warmup+1) during warmup, then a cosine from lr down to min_lr
// at decay_steps, min_lr after. (nanoGPT's formula; Loshchilov & Hutter
// 2017 for the cosine.)
func (c LMConfig) LRAt(it int) float32 {
	switch {
	case it < c.Warmup:
		return c.LR * float32(it+1) / float32(c.Warmup+1)
	case it > c.DecaySteps:
		return c.MinLR
	}
	span := c.DecaySteps - c.Warmup
	ratio := 0.0
	if span > 0 {
		ratio = float64(it-c.Warmup) / float64(span)
	}
	coeff := 0.5 * (1 + math.Cos(math.Pi*ratio))
	return c.MinLR + float32(coeff)*(c.LR-c.MinLR)
}

// Checkpoint metadata of a language model.
const (
	lmModelName = "gpt"
	metaModel   = "model"
	metaTok     = "tokenizer"
)

// saveLM writes the state dict (nanoGPT's names), the optimizer state under
// optim/ (when given) and the metadata to path.
func saveLM(path string, cfg LMConfig, tok *data.CharTokenizer, m *nn.GPT, optState []nn.Param, step int) error {
	var ts []ckpt.Named
	for _, p := range m.StateDict() {
		ts = append(ts, ckpt.Named{Name: p.Name, T: p.Value})
	}
	for _, s := range optState {
		ts = append(ts, ckpt.Named{Name: optimPrefix + s.Name, T: s.Value})
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	tb, err := json.Marshal(tok)
	if err != nil {
		return err
	}
	meta := map[string]string{"format": formatName, metaModel: lmModelName, "config": string(cb),
		metaTok: string(tb), "step": strconv.Itoa(step), "seed": strconv.FormatUint(cfg.Seed, 10)}
	if err := ckpt.Save(path, ts, meta); err != nil {
		return fmt.Errorf("writing checkpoint: %w", err)
	}
	return nil
}

// IsLMCheckpoint reports whether f was written by a language-model run.
func IsLMCheckpoint(f *ckpt.File) bool { return f.Metadata[metaModel] == lmModelName }

// IsLMCheckpointFile reports whether the checkpoint at path was written by
// a language-model run (false when it cannot be read: the caller's own read
// reports why).
func IsLMCheckpointFile(path string) bool {
	f, err := ckpt.ReadFile(path)
	return err == nil && IsLMCheckpoint(f)
}

// WriteLMEvalBatches writes the fixed validation batches of cfg (what
// val_loss lines average over) as i32 "x", "y" [EvalBatches, batch, block]
// with the config in the metadata, for bench/reference/gpt.py eval.
func WriteLMEvalBatches(path string, cfg LMConfig, corpus *data.Corpus) error {
	n := cfg.Batch * cfg.Model.Block
	x, y := make([]int32, cfg.EvalBatches*n), make([]int32, cfg.EvalBatches*n)
	for k := 0; k < cfg.EvalBatches; k++ {
		if err := data.Blocks(corpus.Val, x[k*n:(k+1)*n], y[k*n:(k+1)*n], cfg.Batch, cfg.Model.Block, cfg.Seed^evalSeed, uint64(k)); err != nil {
			return err
		}
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	shape := []int{cfg.EvalBatches, cfg.Batch, cfg.Model.Block}
	return ckpt.WriteFile(path, []ckpt.Entry{
		{Name: "x", DType: tensor.I32, Shape: shape, Data: tensor.AsBytes(x)},
		{Name: "y", DType: tensor.I32, Shape: shape, Data: tensor.AsBytes(y)},
	}, map[string]string{"format": formatName + "/lm-batches", "config": string(cb)})
}

// ReadLMCheckpoint reads a language model's checkpoint: its configuration,
// tokenizer and the number of steps done.
func ReadLMCheckpoint(path string) (*ckpt.File, LMConfig, *data.CharTokenizer, int, error) {
	var cfg LMConfig
	f, err := ckpt.ReadFile(path)
	if err != nil {
		return nil, cfg, nil, 0, err
	}
	if !IsLMCheckpoint(f) {
		return nil, cfg, nil, 0, fmt.Errorf("%s: %w: not a language model (metadata model = %q)", path, ErrCheckpoint, f.Metadata[metaModel])
	}
	if err := json.Unmarshal([]byte(f.Metadata["config"]), &cfg); err != nil {
		return nil, cfg, nil, 0, fmt.Errorf("%s: %w: config: %v", path, ErrCheckpoint, err)
	}
	var tok data.CharTokenizer
	if err := json.Unmarshal([]byte(f.Metadata[metaTok]), &tok); err != nil {
		return nil, cfg, nil, 0, fmt.Errorf("%s: %w: %v", path, ErrCheckpoint, err)
	}
	if tok.Vocab() != cfg.Model.Vocab {
		return nil, cfg, nil, 0, fmt.Errorf("%s: %w: tokenizer has %d tokens, model %d", path, ErrCheckpoint, tok.Vocab(), cfg.Model.Vocab)
	}
	step, err := strconv.Atoi(f.Metadata["step"])
	if err != nil || step < 0 {
		return nil, cfg, nil, 0, fmt.Errorf("%s: %w: step %q", path, ErrCheckpoint, f.Metadata["step"])
	}
	if err := cfg.Validate(); err != nil {
		return nil, cfg, nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	return f, cfg, &tok, step, nil
}

// InitLM writes the GPT's initial weights, as RunLM draws them from
// cfg.Seed, to path in the checkpoint format (state dict with nanoGPT's
// names, no optimizer state, step 0): what a reference implementation
// loads to start from the same point.
func InitLM(a device.Allocator, cfg LMConfig, tok *data.CharTokenizer, path string) error {
	cfg.Model.Vocab = tok.Vocab()
	if err := cfg.Validate(); err != nil {
		return err
	}
	m, err := nn.NewGPT(a, "init", cfg.Model, false, cfg.Seed)
	if err != nil {
		return err
	}
	defer m.Free()
	return saveLM(path, cfg, tok, m, nil, 0)
}

// WriteLMBatches writes the batches and learning rates of a run's first
// steps to path: i32 "x", "y" [steps, batch, block] (data.Blocks of the
// training split, draw = step) and f32 "lr" [steps] (LRAt), with the run's
// config in the metadata — what bench/reference/gpt.py parity replays.
func WriteLMBatches(path string, cfg LMConfig, corpus *data.Corpus, steps int) error {
	cfg.Model.Vocab = corpus.Tok.Vocab()
	if err := cfg.Validate(); err != nil {
		return err
	}
	n := cfg.Batch * cfg.Model.Block
	x, y := make([]int32, steps*n), make([]int32, steps*n)
	lr := make([]float32, steps)
	for s := 0; s < steps; s++ {
		if err := data.Blocks(corpus.Train, x[s*n:(s+1)*n], y[s*n:(s+1)*n], cfg.Batch, cfg.Model.Block, cfg.Seed, uint64(s)); err != nil {
			return err
		}
		lr[s] = cfg.LR * (cfg.LRAt(s) / cfg.LR) // the f32 value the device's scale gives
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	shape := []int{steps, cfg.Batch, cfg.Model.Block}
	err = ckpt.WriteFile(path, []ckpt.Entry{
		{Name: "x", DType: tensor.I32, Shape: shape, Data: tensor.AsBytes(x)},
		{Name: "y", DType: tensor.I32, Shape: shape, Data: tensor.AsBytes(y)},
		{Name: "lr", DType: tensor.F32, Shape: []int{steps}, Data: tensor.AsBytes(lr)},
	}, map[string]string{"format": formatName + "/lm-batches", "config": string(cb), "steps": strconv.Itoa(steps)})
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
