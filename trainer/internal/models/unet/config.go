package unet

import (
	"math"

	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/nn"
	"gpukit/trainer/internal/driver"
)

// Config defines a diffusion training run (`trainer run --model unet`): a
// class-conditional DDPM on Fashion-MNIST (28×28 padded to the model's
// size with the background value). It is stored in every checkpoint
// (metadata "config", with "model" = "unet"); its "unet", "schedule" and
// "timesteps" fields are the diffusion.ModelConfig a sampler rebuilds the
// model from.
type Config struct {
	diffusion.ModelConfig
	// PUncond is the probability that a label is replaced by the null
	// class (Ho & Salimans 2022: 0.1 to 0.2), training the unconditional
	// model that classifier-free guidance needs.
	PUncond float32 `json:"p_uncond"`
	Batch   int     `json:"batch"`
	Steps   int     `json:"steps"`
	// AdamW at LR after a linear warmup of Warmup steps (DDPM trains at a
	// constant 2e-4 after 5000 warmup steps; this small model takes more).
	LR          float32 `json:"lr"`
	Warmup      int     `json:"warmup"`
	WeightDecay float32 `json:"weight_decay"`
	Beta1       float32 `json:"beta1"`
	Beta2       float32 `json:"beta2"`
	Clip        float32 `json:"clip,omitempty"` // joint gradient norm bound (0: off)
	// EMADecay is the decay of the average of the weights that samplers
	// use; with EMAWarmup the decay of step s (0-based) is
	// min(EMADecay, (1+s)/(10+s)), 0 at the first step (diffusers'
	// EMAModel.get_decay), so the average follows the weights early in
	// training instead of staying near their random start for
	// 1/(1−EMADecay) steps.
	EMADecay  float32 `json:"ema_decay"`
	EMAWarmup bool    `json:"ema_warmup,omitempty"`
	Seed      uint64  `json:"seed"` // initialisation, batches, labels dropped, noise
	Limit     int     `json:"limit,omitempty"`
	SaveEvery int     `json:"save_every"` // steps between checkpoints
}

// Name is the model's registered name (diffusion.ModelName, what samplers
// look for).
const Name = diffusion.ModelName

// Default is `trainer run --model unet` without flags: the 5.3 M
// parameter U-Net (64-128-256, attention at 8×8) on batches of 128 for
// 20000 steps, linear schedule of 1000 steps, labels dropped with
// probability 0.1, EMA 0.9995 with warm-up.
func Default() Config {
	return Config{
		ModelConfig: diffusion.ModelConfig{UNet: nn.DefaultUNet(), Schedule: "linear", Timesteps: 1000},
		PUncond:     0.1, Batch: 128, Steps: 20000, LR: 2e-4, Warmup: 500, WeightDecay: 0, Beta1: 0.9, Beta2: 0.999,
		Clip: 1, EMADecay: 0.9995, EMAWarmup: true, Seed: 1, SaveEvery: 2000,
	}
}

// Validate checks every field and names the first bad one.
func (c Config) Validate() error {
	if err := c.ModelConfig.Validate(); err != nil {
		return driver.Configf("%v", err)
	}
	switch {
	case !(c.PUncond >= 0 && c.PUncond <= 1):
		return driver.Configf("--p-uncond %v (want 0 to 1)", c.PUncond)
	case c.Batch < 1 || c.Batch > 1<<16:
		return driver.Configf("--batch %d (want 1 to 65536)", c.Batch)
	case c.Steps < 1:
		return driver.Configf("--steps %d (want ≥ 1)", c.Steps)
	case !(c.LR > 0) || c.LR > 10:
		return driver.Configf("--lr %v (want 0 < lr ≤ 10)", c.LR)
	case c.Warmup < 0:
		return driver.Configf("--warmup %d (want ≥ 0)", c.Warmup)
	case !(c.WeightDecay >= 0):
		return driver.Configf("--weight-decay %v (want ≥ 0)", c.WeightDecay)
	case !(c.Beta1 >= 0 && c.Beta1 < 1):
		return driver.Configf("--beta1 %v (want 0 ≤ β < 1)", c.Beta1)
	case !(c.Beta2 >= 0 && c.Beta2 < 1):
		return driver.Configf("--beta2 %v (want 0 ≤ β < 1)", c.Beta2)
	case !(c.Clip >= 0) || math.IsInf(float64(c.Clip), 1):
		return driver.Configf("--clip %v (want a finite norm ≥ 0; 0 turns clipping off)", c.Clip)
	case !(c.EMADecay >= 0 && c.EMADecay <= 1):
		return driver.Configf("--ema-decay %v (want 0 to 1)", c.EMADecay)
	case c.Limit < 0:
		return driver.Configf("--limit %d (want ≥ 0)", c.Limit)
	case c.SaveEvery < 1:
		return driver.Configf("--save-every %d (want ≥ 1)", c.SaveEvery)
	}
	return nil
}

// LRAt is the learning rate of step it (0-based): linear warmup to LR,
// then constant.
func (c Config) LRAt(it int) float32 {
	if it < c.Warmup {
		return c.LR * float32(it+1) / float32(c.Warmup+1)
	}
	return c.LR
}

// EMADecayAt is the decay of the weights' average at step s (0-based):
// EMADecay, or with EMAWarmup min(EMADecay, (1+s)/(10+s)) and 0 at the
// first step (the average starts at the weights after it), as
// huggingface/diffusers' EMAModel.get_decay (training_utils.py) does
// without its inverse-gamma warm-up.
func (c Config) EMADecayAt(s int) float32 {
	if !c.EMAWarmup {
		return c.EMADecay
	}
	if s <= 0 {
		return 0
	}
	return min(c.EMADecay, float32(1+s)/float32(10+s))
}
