package lm

import (
	"math"

	"gpukit/libgpu/nn"
	"gpukit/trainer/internal/driver"
)

// Config defines a language-model training run (`trainer run --model
// gpt`, or another registered Variant); it is stored in every checkpoint
// (metadata "config", with "model" the variant's name) so resume, eval
// and generate rebuild the same model.
type Config struct {
	Model nn.GPTConfig `json:"gpt"`
	Batch int          `json:"batch"` // sequences per step, each Model.Block tokens
	Steps int          `json:"steps"` // optimizer steps in all
	// AdamW with nanoGPT's schedule (train.py get_lr): linear warmup to LR
	// over Warmup steps, cosine decay to MinLR at DecaySteps, MinLR after.
	LR          float32 `json:"lr"`
	MinLR       float32 `json:"min_lr"`
	Warmup      int     `json:"warmup"`
	DecaySteps  int     `json:"decay_steps"`
	WeightDecay float32 `json:"weight_decay"` // on weights of rank ≥ 2 only, not biases (Decayed)
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
	Optim   string             `json:"optim,omitempty"`
	Precond driver.OptimConfig `json:"precond,omitempty"`
}

// optimName is Optim with its default.
func (c Config) optimName() string {
	if c.Optim == "" {
		return "adamw"
	}
	return c.Optim
}

// DefaultConfig is the GPT's run without flags: a small GPT (2 layers, 4
// heads, d 128, block 64) on batches of 16 for 300 steps, which trains on
// the host's two cores in a few minutes.
func DefaultConfig() Config {
	return Config{
		Model: nn.GPTConfig{Layers: 2, Heads: 4, DModel: 128, Block: 64},
		Batch: 16, Steps: 300, LR: 2e-3, MinLR: 2e-4, Warmup: 30, DecaySteps: 300,
		WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.99, Clip: 1, Seed: 1, EvalEvery: 100, EvalBatches: 8,
	}
}

// Validate checks every field but the vocabulary (known once the text is
// read) and names the first bad one.
func (c Config) Validate() error {
	m := c.Model
	if m.Vocab == 0 {
		m.Vocab = 1
	}
	if err := m.Validate(); err != nil {
		return driver.Configf("%v", err)
	}
	switch {
	case c.Batch < 1:
		return driver.Configf("--batch %d (want ≥ 1)", c.Batch)
	case c.Steps < 1:
		return driver.Configf("--steps %d (want ≥ 1)", c.Steps)
	case !(c.LR > 0) || c.LR > 10:
		return driver.Configf("--lr %v (want 0 < lr ≤ 10)", c.LR)
	case !(c.MinLR >= 0) || c.MinLR > c.LR:
		return driver.Configf("--min-lr %v (want 0 ≤ min-lr ≤ lr)", c.MinLR)
	case c.Warmup < 0:
		return driver.Configf("--warmup %d (want ≥ 0)", c.Warmup)
	case c.DecaySteps < c.Warmup:
		return driver.Configf("--decay-steps %d (want ≥ --warmup %d)", c.DecaySteps, c.Warmup)
	case !(c.WeightDecay >= 0):
		return driver.Configf("--weight-decay %v (want ≥ 0)", c.WeightDecay)
	case !(c.Beta1 >= 0 && c.Beta1 < 1):
		return driver.Configf("--beta1 %v (want 0 ≤ β < 1)", c.Beta1)
	case !(c.Beta2 >= 0 && c.Beta2 < 1):
		return driver.Configf("--beta2 %v (want 0 ≤ β < 1)", c.Beta2)
	case !(c.Clip >= 0) || math.IsInf(float64(c.Clip), 1):
		return driver.Configf("--clip %v (want a finite norm ≥ 0; 0 turns clipping off)", c.Clip)
	case c.EvalEvery < 1:
		return driver.Configf("--eval-every %d (want ≥ 1)", c.EvalEvery)
	case c.EvalBatches < 1:
		return driver.Configf("--eval-batches %d (want ≥ 1)", c.EvalBatches)
	}
	return c.Precond.Validate(c.optimName())
}

// LRAt is the learning rate of step it (0-based), nanoGPT's get_lr:
// lr·(it+1)/(warmup+1) during warmup, then a cosine from lr down to min_lr
// at decay_steps, min_lr after. (nanoGPT's formula; Loshchilov & Hutter
// 2017 for the cosine.)
func (c Config) LRAt(it int) float32 {
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
