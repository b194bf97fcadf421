package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
)

// ErrConfig reports an unusable configuration or flag value.
var ErrConfig = errors.New("train: invalid configuration")

// Config is what defines a training run; it is stored in every checkpoint
// (metadata "config") so eval and resume rebuild the same model.
type Config struct {
	Model       string  `json:"model"`          // "mlp"
	Widths      []int   `json:"widths"`         // layer widths, inputs first, classes last
	Act         string  `json:"act"`            // "relu" or "gelu"
	Optim       string  `json:"optim"`          // adamw, sgd, shampoo, soap, muon or kfac
	LR          float32 `json:"lr"`             // learning rate
	WeightDecay float32 `json:"weight_decay"`   // decoupled (AdamW) or L2 (SGD)
	Momentum    float32 `json:"momentum"`       // SGD only
	Batch       int     `json:"batch"`          // examples per step
	Seed        uint64  `json:"seed"`           // initialisation and data order
	Epochs      int     `json:"epochs"`         // passes over the training set
	Limit       int     `json:"limit"`          // use the first Limit training examples (0: all)
	Clip        float32 `json:"clip,omitempty"` // max gradient norm (0: no clipping)
	// LogEvery is the run's steps between loss lines, kept in checkpoints
	// so that a resumed run prints the lines an uninterrupted one would
	// (Options.LogEvery is what Run uses; 0 in older checkpoints).
	LogEvery int `json:"log_every,omitempty"`
	// Precond are the second-order optimizers' settings (zero: libgpu/optim's defaults).
	Precond OptimConfig `json:"precond,omitempty"`
}

// Default is the configuration of `trainer run` without flags: a
// 784-256-256-10 ReLU MLP trained with AdamW (PyTorch's defaults, lr 1e-3)
// on batches of 128 for 5 epochs (87–88% test accuracy).
func Default() Config {
	return Config{Model: "mlp", Widths: []int{784, 256, 256, 10}, Act: "relu", Optim: "adamw",
		LR: 1e-3, WeightDecay: 0.01, Momentum: 0.9, Batch: 128, Seed: 1, Epochs: 5}
}

// Validate checks every field and names the first bad one.
func (c Config) Validate() error {
	switch {
	case c.Model != "mlp":
		return fmt.Errorf("%w: --model %q (the only model is mlp)", ErrConfig, c.Model)
	case len(c.Widths) < 2:
		return fmt.Errorf("%w: --widths needs at least two layer widths, got %v", ErrConfig, c.Widths)
	case c.Act != "relu" && c.Act != "gelu":
		return fmt.Errorf("%w: --act %q (want relu or gelu)", ErrConfig, c.Act)
	case c.Precond.validate(c.Optim) != nil:
		return c.Precond.validate(c.Optim)
	case !(c.LR > 0) || c.LR > 10:
		return fmt.Errorf("%w: --lr %v (want 0 < lr <= 10)", ErrConfig, c.LR)
	case !(c.WeightDecay >= 0):
		return fmt.Errorf("%w: --weight-decay %v (want >= 0)", ErrConfig, c.WeightDecay)
	case !(c.Momentum >= 0) || c.Momentum >= 1:
		return fmt.Errorf("%w: --momentum %v (want 0 <= momentum < 1)", ErrConfig, c.Momentum)
	case c.Batch < 1 || c.Batch > 1<<16:
		return fmt.Errorf("%w: --batch %d (want 1 to 65536)", ErrConfig, c.Batch)
	case c.Epochs < 1:
		return fmt.Errorf("%w: --epochs %d (want at least 1)", ErrConfig, c.Epochs)
	case c.Limit < 0:
		return fmt.Errorf("%w: --limit %d (want >= 0)", ErrConfig, c.Limit)
	case !(c.Clip >= 0) || math.IsInf(float64(c.Clip), 1):
		return fmt.Errorf("%w: --clip %v (want a finite norm >= 0; 0 turns clipping off)", ErrConfig, c.Clip)
	case c.LogEvery < 0:
		return fmt.Errorf("%w: --log-every %d (want >= 1)", ErrConfig, c.LogEvery)
	}
	for _, w := range c.Widths {
		if w < 1 || w > 1<<16 {
			return fmt.Errorf("%w: --widths %v: every width must be 1 to 65536", ErrConfig, c.Widths)
		}
	}
	return nil
}

// act is the ops activation for c.Act (validated).
func (c Config) act() ops.Act {
	a, _ := ops.ParseAct(c.Act)
	return a
}

func (c Config) marshal() string {
	b, _ := json.Marshal(c)
	return string(b)
}

func parseConfig(s string) (Config, error) {
	var c Config
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return c, fmt.Errorf("%w: checkpoint config: %v", ErrConfig, err)
	}
	return c, c.Validate()
}
