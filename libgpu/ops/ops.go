package ops

import (
	"fmt"

	"gpukit/libgpu/tensor"
)

// Act is the activation fused after a linear layer.
type Act uint8

const (
	// ActNone: y = x·wᵀ + b.
	ActNone Act = iota
	// ActReLU: y = max(0, x·wᵀ + b).
	ActReLU
	// ActGELU: the tanh approximation of GELU (Hendrycks & Gimpel 2016,
	// eq. for GELU ≈ 0.5x(1+tanh(√(2/π)(x+0.044715x³)))), which is what
	// cuBLASLt's GELU epilogues compute and PyTorch's gelu(approximate="tanh").
	ActGELU
)

func (a Act) String() string {
	switch a {
	case ActNone:
		return "none"
	case ActReLU:
		return "relu"
	case ActGELU:
		return "gelu"
	}
	return fmt.Sprintf("act(%d)", uint8(a))
}

// ParseAct accepts "none", "relu", "gelu".
func ParseAct(s string) (Act, error) {
	for _, a := range []Act{ActNone, ActReLU, ActGELU} {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("ops: unknown activation %q (want none, relu or gelu)", s)
}

// Precision selects how f32 GEMMs are computed on backends that can choose.
type Precision uint8

const (
	// PrecF32: full f32 arithmetic.
	PrecF32 Precision = iota
	// PrecTF32: f32 data, tensor cores in TF32 (10-bit mantissa products,
	// f32 accumulation). The host backend computes this as f32.
	PrecTF32
	// PrecBF16: bf16 autocast of GEMM operands, f32 accumulation and f32
	// master weights. The host backend computes this as f32.
	PrecBF16
)

// ParsePrecision reads a precision by the name the tools' --precision
// flags use: f32, tf32 or bf16.
func ParsePrecision(s string) (Precision, error) {
	switch s {
	case "f32":
		return PrecF32, nil
	case "tf32":
		return PrecTF32, nil
	case "bf16":
		return PrecBF16, nil
	}
	return 0, fmt.Errorf("%q: want f32, tf32 or bf16", s)
}

// AdamWConfig holds AdamW hyper-parameters (Loshchilov & Hutter 2019,
// "Decoupled Weight Decay Regularization", Algorithm 2):
//
//	m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
//	m̂ = m/(1−β1ᵗ);  v̂ = v/(1−β2ᵗ)
//	p ← p − lr·(m̂/(√v̂ + eps) + wd·p)
//
// LRScale, when set, is an f32 scalar on the engine's device that
// multiplies LR when the update runs (a learning-rate schedule that a
// captured CUDA graph follows: the caller rewrites the scalar, not the
// graph). NoDecay, when set (one entry per parameter), exempts parameters
// from weight decay, as PyTorch parameter groups with weight_decay 0 do for
// biases and norm weights.
type AdamWConfig struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	LRScale                            *tensor.Tensor
	NoDecay                            []bool
	// GradScale, when set, is an f32 scalar on the device multiplying
	// every gradient as it is read (Engine.ClipCoef's coefficient: clipping
	// fused into the update, one pass over the gradients fewer; the same
	// f32 products as scaling them first).
	GradScale *tensor.Tensor
}

// decay is the weight decay of parameter i.
func (c AdamWConfig) decay(i int) float32 {
	if i < len(c.NoDecay) && c.NoDecay[i] {
		return 0
	}
	return c.WeightDecay
}

// DefaultAdamW is PyTorch's torch.optim.AdamW default (lr 1e-3, betas
// (0.9, 0.999), eps 1e-8, weight_decay 1e-2).
var DefaultAdamW = AdamWConfig{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 1e-2}

// SGDConfig holds SGD with momentum as PyTorch's torch.optim.SGD computes it:
//
//	g ← g + wd·p;  buf ← μ·buf + g  (buf = g on the first step when Nesterov is false and dampening 0);
//	p ← p − lr·buf
//
// Momentum buffers start at zero, which gives the same first step.
type SGDConfig struct {
	LR, Momentum, WeightDecay float32
}
