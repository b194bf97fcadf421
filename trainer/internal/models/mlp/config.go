package mlp

import (
	"encoding/json"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/trainer/internal/driver"
)

// Config is what defines an MLP training run; it is stored in every
// checkpoint (metadata "config") so eval and resume rebuild the same model.
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
	// FuseBackward fuses each activation derivative into the next layer's
	// dx GEMM (ops.Engine.LinearBackwardChain): it changes the rounding,
	// not the formula, and is kept across a resume.
	FuseBackward bool `json:"fuse_backward,omitempty"`
	// Precond are the second-order optimizers' settings (zero: libgpu/optim's defaults).
	Precond driver.OptimConfig `json:"precond,omitempty"`
}

// Name is the model's registered name.
const Name = "mlp"

// Default is the configuration of `trainer run` without flags: a
// 784-256-256-10 ReLU MLP trained with AdamW (PyTorch's defaults, lr 1e-3)
// on batches of 128 for 5 epochs (87–88% test accuracy).
func Default() Config {
	return Config{Model: Name, Widths: []int{784, 256, 256, 10}, Act: "relu", Optim: "adamw",
		LR: 1e-3, WeightDecay: 0.01, Momentum: 0.9, Batch: 128, Seed: 1, Epochs: 5}
}

// Validate checks every field and names the first bad one.
func (c Config) Validate() error {
	switch {
	case c.Model != Name:
		return driver.Configf("model %q in an MLP's configuration (want %q)", c.Model, Name)
	case len(c.Widths) < 2:
		return driver.Configf("--widths needs at least two layer widths, got %v", c.Widths)
	case c.Act != "relu" && c.Act != "gelu":
		return driver.Configf("--act %q (want relu or gelu)", c.Act)
	case c.Precond.Validate(c.Optim) != nil:
		return c.Precond.Validate(c.Optim)
	case !(c.LR > 0) || c.LR > 10:
		return driver.Configf("--lr %v (want 0 < lr ≤ 10)", c.LR)
	case !(c.WeightDecay >= 0):
		return driver.Configf("--weight-decay %v (want ≥ 0)", c.WeightDecay)
	case !(c.Momentum >= 0) || c.Momentum >= 1:
		return driver.Configf("--momentum %v (want 0 ≤ momentum < 1)", c.Momentum)
	case c.Batch < 1 || c.Batch > 1<<16:
		return driver.Configf("--batch %d (want 1 to 65536)", c.Batch)
	case c.Epochs < 1:
		return driver.Configf("--epochs %d (want at least 1)", c.Epochs)
	case c.Limit < 0:
		return driver.Configf("--limit %d (want ≥ 0)", c.Limit)
	case !(c.Clip >= 0) || math.IsInf(float64(c.Clip), 1):
		return driver.Configf("--clip %v (want a finite norm ≥ 0; 0 turns clipping off)", c.Clip)
	}
	for _, w := range c.Widths {
		if w < 1 || w > 1<<16 {
			return driver.Configf("--widths %v: every width must be 1 to 65536", c.Widths)
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
		return c, driver.Configf("checkpoint config: %v", err)
	}
	return c, c.Validate()
}
