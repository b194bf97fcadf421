package ops

import (
	"errors"
	"fmt"
	"sync"

	"gpukit/libgpu/device"
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

// Impl is one backend's implementation. Engine validates arguments first.
type Impl interface {
	// Linear computes y[M,N] = act(x[M,K]·w[N,K]ᵀ + b[N]). b may be nil. When aux
	// is non-nil ([M,N], same dtype as y) it receives the pre-activation z, which
	// LinearBackward needs for GELU (for ReLU, y itself is enough). Backends
	// that implement LinearChainer also take, for act = ActReLU, a u8 aux
	// [M, ReLUMaskCols(N)] that receives the ReLU bit-mask.
	Linear(y, x, w, b, aux *tensor.Tensor, act Act) error
	// LinearBackward, given dy[M,N] and aux (z for GELU, y for ReLU, unused for
	// none), computes dz = dy ⊙ act'(z) and then dx[M,K] = dz·w, dw[N,K] = dzᵀ·x,
	// db[N] = Σ_rows dz. dx and db may be nil (not wanted). Outputs are
	// overwritten, not accumulated.
	LinearBackward(dx, dw, db, dy, x, w, aux *tensor.Tensor, act Act) error
	// SoftmaxCrossEntropy computes, for logits[M,C] and labels[M] (i32 in [0,C)),
	// loss[1] = mean_i(−log softmax(logits_i)[label_i]) and
	// dlogits[M,C] = (softmax(logits) − onehot(labels)) / M, in one pass.
	SoftmaxCrossEntropy(loss, dlogits, logits, labels *tensor.Tensor) error
	// AdamW updates every params[i] in place from grads[i], with moments m[i], v[i].
	// step is an i32 scalar tensor on the device: the op increments it and uses the
	// new value t for bias correction (so a captured graph advances it on replay).
	AdamW(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamWConfig) error
	// SGD updates params in place with momentum buffers mom (zero-initialised).
	SGD(params, grads, mom []*tensor.Tensor, cfg SGDConfig) error
	// Argmax writes out[M] (i32) = argmax over the last dimension of x[M,N]
	// (the first index on ties).
	Argmax(out, x *tensor.Tensor) error
	// Fill sets every element of a contiguous f32 or i32 tensor to v.
	Fill(t *tensor.Tensor, v float64) error
}

// Errors.
var (
	ErrNoBackend = errors.New("ops: no backend for this device")
	ErrDevice    = errors.New("ops: tensors on different devices")
)

var (
	regMu    sync.Mutex
	backends = map[device.Kind]func(device.Device, Options) (Impl, error){}
)

// Register makes a backend constructor available for a device kind. Backends
// call it from init.
func Register(k device.Kind, newImpl func(device.Device, Options) (Impl, error)) {
	regMu.Lock()
	defer regMu.Unlock()
	backends[k] = newImpl
}

// Options configure an Engine.
type Options struct {
	// Precision for f32 GEMMs (default PrecF32 on the zero value; tools pick TF32 on GPUs).
	Precision Precision
	// NoLinearChain makes HasLinearChain false, so models take the per-layer
	// backward (LinearBackward) even where the backend fuses the previous
	// layer's activation derivative into the dx GEMM (LinearBackwardChain).
	NoLinearChain bool
	// HighPriorityComm makes the communication stream (CommSide) a stream
	// of the context's greatest priority (cuStreamCreateWithPriority), so
	// that as SMs free up the block scheduler starts the collectives'
	// blocks (NCCL's CTAs, one per channel) before the backward's pending
	// GEMM blocks, and a bucket's all-reduce is not held up behind the
	// backward it overlaps — ProcessGroupNCCL's is_high_priority_stream
	// option in PyTorch. Off: the default priority, as every other stream.
	// No effect on the host.
	HighPriorityComm bool
}

// Engine runs ops on one device. Not safe for concurrent use: on CUDA it owns
// a stream, and ops are queued on it in call order.
type Engine struct {
	dev  device.Device
	opts Options
	impl Impl
}

// NewEngine returns an engine for dev with the backend registered for its kind.
func NewEngine(dev device.Device, opts Options) (*Engine, error) {
	regMu.Lock()
	f := backends[dev.Kind()]
	regMu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("%w: %v", ErrNoBackend, dev)
	}
	impl, err := f(dev, opts)
	if err != nil {
		return nil, err
	}
	return &Engine{dev: dev, opts: opts, impl: impl}, nil
}

// Device is the engine's device.
func (e *Engine) Device() device.Device { return e.dev }

// Impl is the backend, for backend-specific extensions (streams, graphs).
func (e *Engine) Impl() Impl { return e.impl }

// Options is what the engine was made with.
func (e *Engine) Options() Options { return e.opts }
