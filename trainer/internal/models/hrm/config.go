package hrm

import (
	"encoding/json"
	"fmt"
	"math"

	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/trainer/internal/driver"
)

// Name is the model's registered name (--model hrm, checkpoints' "model").
const Name = "hrm"

// Config defines an HRM run on Sudoku (`trainer run --model hrm`). It is
// stored as the checkpoints' "config" metadata; its architecture keys are
// nn.HRMConfig's, flat at the top level, which are hrm.py's ARCH_DEFAULTS
// keys: bench/reference/hrm.py and nn.LoadHRM read the architecture of a
// model.safetensors from it (ignoring the training keys).
type Config struct {
	nn.HRMConfig
	// Steps are segment steps: one segment of the batch, its forward,
	// backward and optimizer step (the driver's step).
	Steps int `json:"steps"`
	Batch int `json:"batch"` // sequences per segment step (the reference's global batch 768)
	// AdamATan2 at LR (β Beta1, Beta2, decoupled weight decay WeightDecay)
	// on every weight but the puzzle embedding, which sign-SGD trains at
	// PuzzleEmbLR with PuzzleEmbWeightDecay; both after a linear warmup of
	// Warmup steps, then cosine to LRMinRatio·LR over Steps (pretrain.py's
	// cosine_schedule_with_warmup_lr_lambda; ratio 1: constant).
	LR                   float32 `json:"lr"`
	PuzzleEmbLR          float32 `json:"puzzle_emb_lr"`
	WeightDecay          float32 `json:"weight_decay"`
	PuzzleEmbWeightDecay float32 `json:"puzzle_emb_weight_decay"`
	Beta1                float32 `json:"beta1"`
	Beta2                float32 `json:"beta2"`
	Warmup               int     `json:"warmup"`
	LRMinRatio           float64 `json:"lr_min_ratio"`
	// Seed draws the initial weights (nn.NewHRM); DataSeed the batches,
	// the augmentation copies and the ACT exploration draws
	// (libgpu/data/sudoku: Sampler, Augmenter, MinHaltSteps), the seed
	// `trainer data replay --seed` takes.
	Seed     uint64 `json:"seed"`
	DataSeed uint64 `json:"data_seed"`
	// NumAug is the augmented copies of each training puzzle besides
	// itself (the reference's 1k setting: 1000); Limit trains on the
	// first Limit puzzles of the set (0: all).
	NumAug int `json:"num_aug"`
	Limit  int `json:"limit,omitempty"`
	// Evaluation on the first EvalN test puzzles (0: all) every EvalEvery
	// steps and at the end; a checkpoint also every SaveEvery steps.
	EvalEvery int `json:"eval_every"`
	EvalN     int `json:"eval_n,omitempty"`
	SaveEvery int `json:"save_every"`
	// Data is the data directory (absolute), which a resumed run reads
	// again unless given --data.
	Data string `json:"data"`
}

// Default is `trainer run --model hrm` without flags: the reference's
// Sudoku 1k run (sapientinc/HRM README, config/arch/hrm_v1.yaml,
// config/cfg_pretrain.yaml; hrm.py's ARCH_DEFAULTS and TRAIN_DEFAULTS):
// the default architecture (nn.DefaultHRM: hidden 512, 8 heads, 4 + 4
// layers, 2 × 2 cycles, at most 16 segments, exploration 0.1), batch 768,
// AdamATan2 β (0.9, 0.95) at 1e-4 with weight decay 1, sign-SGD at 1e-4
// with weight decay 1 on the puzzle embedding, 2000 warmup steps, no
// decay, 1000 augmented copies per puzzle, and 26041 segment steps: the
// reference's 20000 epochs of 1000 puzzles at batch 768
// (pretrain.py: epochs · groups / global batch).
func Default() Config {
	return Config{HRMConfig: nn.DefaultHRM(), Steps: 26041, Batch: 768, LR: 1e-4, PuzzleEmbLR: 1e-4, WeightDecay: 1,
		PuzzleEmbWeightDecay: 1, Beta1: 0.9, Beta2: 0.95, Warmup: 2000, LRMinRatio: 1, Seed: 1, DataSeed: 1,
		NumAug: 1000, EvalEvery: 2500, SaveEvery: 1000}
}

// Validate checks every field and names the first bad one by its flag.
func (c Config) Validate() error {
	if err := c.HRMConfig.Validate(); err != nil {
		return driver.Configf("%v", err)
	}
	d := nn.DefaultHRM()
	switch {
	case c.Vocab != d.Vocab || c.SeqLen != d.SeqLen:
		return driver.Configf("vocabulary %d and %d cells: Sudoku's are %d and %d", c.Vocab, c.SeqLen, d.Vocab, d.SeqLen)
	case c.HaltMaxSteps < 2:
		return driver.Configf("--halt-max-steps %d (want ≥ 2: the Q-continue target needs a next segment)", c.HaltMaxSteps)
	case c.Steps < 1:
		return driver.Configf("--steps %d (want ≥ 1)", c.Steps)
	case c.Batch < 1 || c.Batch > 1<<16:
		return driver.Configf("--batch %d (want 1 to 65536)", c.Batch)
	case !(c.LR > 0) || c.LR > 10:
		return driver.Configf("--lr %v (want 0 < lr ≤ 10)", c.LR)
	case !(c.PuzzleEmbLR >= 0) || c.PuzzleEmbLR > 10:
		return driver.Configf("--puzzle-emb-lr %v (want 0 ≤ lr ≤ 10)", c.PuzzleEmbLR)
	case !(c.WeightDecay >= 0) || math.IsInf(float64(c.WeightDecay), 1):
		return driver.Configf("--weight-decay %v (want a finite value ≥ 0)", c.WeightDecay)
	case !(c.PuzzleEmbWeightDecay >= 0) || math.IsInf(float64(c.PuzzleEmbWeightDecay), 1):
		return driver.Configf("--puzzle-emb-weight-decay %v (want a finite value ≥ 0)", c.PuzzleEmbWeightDecay)
	case !(c.Beta1 >= 0 && c.Beta1 < 1):
		return driver.Configf("--beta1 %v (want 0 ≤ β < 1)", c.Beta1)
	case !(c.Beta2 >= 0 && c.Beta2 < 1):
		return driver.Configf("--beta2 %v (want 0 ≤ β < 1)", c.Beta2)
	case c.Warmup < 0:
		return driver.Configf("--warmup %d (want ≥ 0)", c.Warmup)
	case !(c.LRMinRatio >= 0 && c.LRMinRatio <= 1):
		return driver.Configf("--lr-min-ratio %v (want 0 to 1)", c.LRMinRatio)
	case c.NumAug < 0:
		return driver.Configf("--num-aug %d (want ≥ 0)", c.NumAug)
	case c.Limit < 0:
		return driver.Configf("--limit %d (want ≥ 0)", c.Limit)
	case c.EvalEvery < 1:
		return driver.Configf("--eval-every %d (want ≥ 1)", c.EvalEvery)
	case c.EvalN < 0:
		return driver.Configf("--eval-n %d (want ≥ 0; 0: every test puzzle)", c.EvalN)
	case c.SaveEvery < 1:
		return driver.Configf("--save-every %d (want ≥ 1)", c.SaveEvery)
	}
	return nil
}

// LRScale is the learning-rate scale of step it (0-based): ops.ACTScheduleScale
// of the 1-based step, what the device computes for the step.
func (c Config) LRScale(it int) float64 {
	return ops.ACTScheduleScale(it+1, c.Warmup, c.Steps, c.LRMinRatio)
}

// SegmentFLOPs is the model FLOPs of one segment step (for mfu): the
// matrix products and attention of every level update — the
// gradient-free ones (HCycles·LCycles − 1 L updates, HCycles − 1 H
// updates), the last L and H updates with their backward (3× a forward),
// and the second forward of the whole segment for the Q-continue target —
// counted as 2 FLOPs per multiply-add; heads and norms left out.
func (c Config) SegmentFLOPs() float64 {
	B, T, C, I := float64(c.Batch), float64(c.Positions()), float64(c.Hidden), float64(c.Inter())
	block := 2*B*T*(3*C*C+C*C+2*C*I+I*C) + 4*B*T*T*C
	lLevels := float64(c.HCycles*c.LCycles-1) + 3 + float64(c.HCycles*c.LCycles)
	hLevels := float64(c.HCycles-1) + 3 + float64(c.HCycles)
	return block * (lLevels*float64(c.LLayers) + hLevels*float64(c.HLayers))
}

// storedConfig is a resumed run's configuration.
func storedConfig(raw json.RawMessage) (Config, error) {
	var cfg Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return cfg, fmt.Errorf("%w: config: %v", driver.ErrCheckpoint, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
	}
	return cfg, nil
}
