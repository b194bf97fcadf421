package nn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// ErrConfig: an MLPConfig is unusable.
var ErrConfig = errors.New("nn: invalid configuration")

// Param is a trainable tensor and its gradient (same shape, f32). Name is
// PyTorch-style: "fc0.weight" ([out, in]), "fc0.bias" ([out]).
type Param struct {
	Name        string
	Value, Grad *tensor.Tensor
}

// MLPConfig describes a multi-layer perceptron classifier.
type MLPConfig struct {
	// Widths are the layer widths: Widths[0] inputs, Widths[last] classes,
	// at least two entries, all positive. Layer i (named "fc<i>") maps
	// Widths[i] → Widths[i+1].
	Widths []int
	// Act follows every layer but the last (whose output is the logits).
	Act ops.Act
	// Batch is the static number of rows per step.
	Batch int
	// Seed makes the initialisation deterministic.
	Seed uint64
	// Prefix starts every buffer name: Prefix+"/params/fc0.weight",
	// Prefix+"/grads/fc0.weight", Prefix+"/acts/...". Empty: no prefix.
	Prefix string
	// Graph, when set, records the MLP on an ops.Graph over this engine
	// with Autocast's activation dtype (tensor.BF16: activations, GEMM
	// operands and the logits in bf16, weights cast once per step, f32
	// masters and gradients), instead of the hand-fused f32 chain. Forward
	// and Backward must then be given this engine.
	Graph    *ops.Engine
	Autocast tensor.DType
	// OnLinear is the recorded graph's ops.GraphOptions.OnLinear (with
	// Graph only): K-FAC's factors read from each layer's input and
	// pre-activation gradient.
	OnLinear func(weight string, x, dy *tensor.Tensor) error
}

// MLP is a stack of Linear layers with a fused activation, ending in
// softmax cross-entropy. All buffers live on the allocator's device.
type MLP struct {
	cfg       MLPConfig
	graph     *ops.Graph     // the recorded graph (MLPConfig.Graph), or nil
	logitsF32 *tensor.Tensor // f32 copy of bf16 logits for Predict (graph only)
	params    []Param
	bufs      []*tensor.Tensor // everything to free
	input     *tensor.Tensor
	labels    *tensor.Tensor
	logits    *slot
	loss      *tensor.Tensor
	tape      steps
	// each layer's input and pre-activation gradient (Linears; not with
	// a graph, whose Linear layers K-FAC reads through OnLinear)
	layerIn, layerOutGrad []*tensor.Tensor
}

func join(prefix, kind, name string) string {
	if prefix == "" {
		return kind + "/" + name
	}
	return prefix + "/" + kind + "/" + name
}

// owned are buffers allocated under a prefix (<prefix>/<kind>/<name>) and
// released together: a model's or a recorded step's own.
type owned struct {
	a      device.Allocator
	prefix string
	ts     []*tensor.Tensor
}

// alloc allocates <prefix>/<kind>/<name> and keeps it.
func (o *owned) alloc(kind, name string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	t, err := tensor.Alloc(o.a, join(o.prefix, kind, name), dt, shape...)
	if err != nil {
		return nil, fmt.Errorf("nn: allocating %s/%s: %w", kind, name, err)
	}
	o.ts = append(o.ts, t)
	return t, nil
}

// free releases every buffer alloc made (their errors joined).
func (o *owned) free() error {
	var errs []error
	for _, t := range o.ts {
		errs = append(errs, t.Buf.Free())
	}
	o.ts = nil
	return errors.Join(errs...)
}

// NewMLP allocates parameters (initialised as the package doc says),
// gradients, activations, labels and loss, and records the graph. Buffers:
// params and grads per layer; acts "input" [Batch, Widths[0]], "labels"
// [Batch] i32, "fc<i>.out" [Batch, Widths[i+1]] (the last layer's are the
// logits), "fc<i>.pre.grad" [Batch, Widths[i+1]] (∂L/∂z_i, the gradient of
// the layer's pre-activation; for the last layer the gradient of the
// logits), "fc<i>.pre" (the pre-activation z_i, only for GELU),
// "fc<i>.mask" (u8 [Batch, ops.ReLUMaskCols(Widths[i+1])], the ReLU
// bit-mask, only for ReLU) and "loss" [1]. Errors wrap ErrConfig or the
// allocator's error; nothing stays allocated on error.
func NewMLP(a device.Allocator, cfg MLPConfig) (m *MLP, err error) {
	if len(cfg.Widths) < 2 {
		return nil, fmt.Errorf("%w: need at least 2 widths, got %v", ErrConfig, cfg.Widths)
	}
	for _, w := range cfg.Widths {
		if w <= 0 {
			return nil, fmt.Errorf("%w: widths must be positive, got %v", ErrConfig, cfg.Widths)
		}
	}
	if cfg.Batch <= 0 {
		return nil, fmt.Errorf("%w: batch must be positive, got %d", ErrConfig, cfg.Batch)
	}
	if cfg.Act > ops.ActGELU {
		return nil, fmt.Errorf("%w: unknown activation %v", ErrConfig, cfg.Act)
	}
	cfg.Widths = append([]int(nil), cfg.Widths...)
	m = &MLP{cfg: cfg}
	defer func() {
		if err != nil {
			m.Free()
			m = nil
		}
	}()
	alloc := func(kind, name string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
		full := join(cfg.Prefix, kind, name)
		t, err := tensor.Alloc(a, full, dt, shape...)
		if err != nil {
			return nil, fmt.Errorf("nn: allocating %s: %w", full, err)
		}
		m.bufs = append(m.bufs, t)
		return t, nil
	}
	param := func(name string, shape ...int) (*slot, error) {
		v, err := alloc("params", name, tensor.F32, shape...)
		if err != nil {
			return nil, err
		}
		g, err := alloc("grads", name, tensor.F32, shape...)
		if err != nil {
			return nil, err
		}
		m.params = append(m.params, Param{Name: name, Value: v, Grad: g})
		return &slot{Value: v, Grad: g}, nil
	}

	B := cfg.Batch
	if m.input, err = alloc("acts", "input", tensor.F32, B, cfg.Widths[0]); err != nil {
		return m, err
	}
	if m.labels, err = alloc("acts", "labels", tensor.I32, B); err != nil {
		return m, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6770756b6974)) // "gpukit"
	L := len(cfg.Widths) - 1
	var ws, bs []*slot
	for i := 0; i < L; i++ {
		in, out := cfg.Widths[i], cfg.Widths[i+1]
		name := fmt.Sprintf("fc%d", i)
		w, err := param(name+".weight", out, in)
		if err != nil {
			return m, err
		}
		b, err := param(name+".bias", out)
		if err != nil {
			return m, err
		}
		bound := 1 / math.Sqrt(float64(in))
		if err := uniformInit(rng, w.Value, bound); err != nil {
			return m, err
		}
		if err := uniformInit(rng, b.Value, bound); err != nil {
			return m, err
		}
		ws, bs = append(ws, w), append(bs, b)
	}
	if cfg.Graph != nil {
		return m, m.recordGraph(a, ws, bs)
	}
	x := &slot{Value: m.input}
	var layers []*layer
	for i := 0; i < L; i++ {
		out := cfg.Widths[i+1]
		name := fmt.Sprintf("fc%d", i)
		w, b := ws[i], bs[i]
		act := cfg.Act
		if i == L-1 {
			act = ops.ActNone
		}
		yv, err := alloc("acts", name+".out", tensor.F32, B, out)
		if err != nil {
			return m, err
		}
		yg, err := alloc("acts", name+".pre.grad", tensor.F32, B, out)
		if err != nil {
			return m, err
		}
		l := &layer{name: name, x: x, y: &slot{Value: yv, Grad: yg}, w: w, b: b, act: act}
		switch act {
		case ops.ActGELU:
			if l.pre, err = alloc("acts", name+".pre", tensor.F32, B, out); err != nil {
				return m, err
			}
		case ops.ActReLU:
			if l.mask, err = alloc("acts", name+".mask", tensor.U8, B, ops.ReLUMaskCols(out)); err != nil {
				return m, err
			}
		}
		layers = append(layers, l)
		m.layerIn, m.layerOutGrad = append(m.layerIn, x.Value), append(m.layerOutGrad, yg)
		x = l.y
	}
	for i, l := range layers {
		var prev *layer
		if i > 0 {
			prev = layers[i-1]
		}
		m.tape.record(l.name, l.forward, func(e *ops.Engine) error { return l.backward(e, prev, i == L-1) })
	}
	m.logits = x
	if m.loss, err = alloc("acts", "loss", tensor.F32, 1); err != nil {
		return m, err
	}
	logits := m.logits
	m.tape.record("loss", func(e *ops.Engine) error {
		return e.CrossEntropy(m.loss, logits.Grad, logits.Value, m.labels, false)
	}, nil)
	return m, nil
}

// layer is one recorded Linear: y = act(x·wᵀ + b).
type layer struct {
	name    string
	x, y    *slot // y.Grad holds ∂L/∂z (the chain) or ∂L/∂y (LinearBackward)
	w, b    *slot
	act     ops.Act
	pre     *tensor.Tensor // z, for GELU
	mask    *tensor.Tensor // ReLU bit-mask, for ReLU with LinearBackwardChain
	chained bool           // the last forward wrote mask (the engine has the chain)
}

// forward runs y = act(x·wᵀ + b), saving what the backward will read: z
// for GELU; for ReLU the bit-mask when the engine has LinearBackwardChain
// (else y itself is what LinearBackward reads).
func (l *layer) forward(e *ops.Engine) error {
	aux := l.pre
	l.chained = e.HasLinearChain()
	if l.act == ops.ActReLU && l.chained {
		aux = l.mask
	}
	return e.Linear(l.y.Value, l.x.Value, l.w.Value, l.b.Value, aux, l.act)
}

// backward, with the chain (ops.Engine.LinearBackwardChain): y.Grad holds
// this layer's ∂L/∂z (the last layer's is ∂L/∂logits from the loss); one
// call writes dw, and the previous layer's ∂L/∂z and bias gradient straight
// from the dx GEMM, fused with the previous activation's derivative. A
// layer's own db is computed here only when no later layer did (the last
// layer, and layers followed by no activation). Layer 0 computes no dx.
//
// Without the chain (a backend lacking it), each layer runs LinearBackward
// from ∂L/∂y (ops.Engine.LinearBackward).
func (l *layer) backward(e *ops.Engine, prev *layer, last bool) error {
	if !l.chained {
		saved := l.pre
		if l.act == ops.ActReLU {
			saved = l.y.Value
		}
		var dx *tensor.Tensor
		if prev != nil {
			dx = prev.y.Grad
		}
		return e.LinearBackward(dx, l.w.Grad, l.b.Grad, l.y.Grad, l.x.Value, l.w.Value, saved, l.act)
	}
	db := l.b.Grad
	if !last && l.act != ops.ActNone {
		db = nil // the next layer's dx GEMM wrote it
	}
	if prev == nil {
		return e.LinearBackwardChain(nil, l.w.Grad, db, nil, l.y.Grad, l.x.Value, l.w.Value, nil, ops.ActNone)
	}
	var dbPrev, auxPrev *tensor.Tensor
	switch prev.act {
	case ops.ActReLU:
		dbPrev, auxPrev = prev.b.Grad, prev.mask
	case ops.ActGELU:
		dbPrev, auxPrev = prev.b.Grad, prev.pre
	}
	return e.LinearBackwardChain(prev.y.Grad, l.w.Grad, db, dbPrev, l.y.Grad, l.x.Value, l.w.Value, auxPrev, prev.act)
}

// uniformInit writes U(−bound, bound) draws into t through tensor.WriteF32
// (works on any device).
func uniformInit(rng *rand.Rand, t *tensor.Tensor, bound float64) error {
	v := make([]float32, t.Numel())
	for i := range v {
		v[i] = float32((2*rng.Float64() - 1) * bound)
	}
	if err := t.WriteF32(v); err != nil {
		return fmt.Errorf("nn: initialising parameters: %w", err)
	}
	return nil
}

// Config is the configuration the model was made with.
func (m *MLP) Config() MLPConfig { return m.cfg }

// Params lists weights and biases layer by layer: fc0.weight, fc0.bias, fc1.weight, ...
// The slice is shared; do not modify it.
func (m *MLP) Params() []Param { return m.params }

// LinearIO is what K-FAC (libgpu/optim.KFACLayer) reads of a linear
// layer: its parameters' names, its input [Batch, in] and the gradient of
// the loss with respect to its pre-activation [Batch, out].
type LinearIO struct {
	Weight, Bias   string
	Input, OutGrad *tensor.Tensor
}

// Linears lists every layer's LinearIO, in layer order: the buffers the
// forward and backward write, valid after a Backward. OutGrad is the
// gradient of the pre-activation on engines with ops.Engine.HasLinearChain
// (host and CUDA: Backward takes the chain); on others it is the gradient
// of the layer's output. An MLP recorded on a graph (MLPConfig.Graph) has
// no such static buffers: Input and OutGrad are nil, and MLPConfig.OnLinear
// hands them over instead.
func (m *MLP) Linears() []LinearIO {
	var out []LinearIO
	for i := 0; i+1 < len(m.cfg.Widths); i++ {
		name := fmt.Sprintf("fc%d", i)
		l := LinearIO{Weight: name + ".weight", Bias: name + ".bias"}
		if i < len(m.layerIn) {
			l.Input, l.OutGrad = m.layerIn[i], m.layerOutGrad[i]
		}
		out = append(out, l)
	}
	return out
}

// Input is the static [Batch, Widths[0]] f32 input the caller writes each step.
func (m *MLP) Input() *tensor.Tensor { return m.input }

// Labels is the static [Batch] i32 class labels (in [0, Widths[last])) the caller writes each step.
func (m *MLP) Labels() *tensor.Tensor { return m.labels }

// Logits is the [Batch, Widths[last]] f32 output of the last layer.
func (m *MLP) Logits() *tensor.Tensor { return m.logits.Value }

// Loss is the [1] f32 mean cross-entropy of the batch.
func (m *MLP) Loss() *tensor.Tensor { return m.loss }

// Forward computes the logits and the loss from Input and Labels (and, fused
// with the loss, the gradient of the loss with respect to the logits). Labels
// must be valid even for evaluation-only use.
func (m *MLP) Forward(e *ops.Engine) error {
	if m.graph != nil {
		return m.graph.Forward()
	}
	return m.tape.runForward(e)
}

// Backward fills every Param.Grad with the gradient of Loss (overwriting).
// It needs a Forward on the same engine since the last Backward (else
// autograd.ErrNoForward). On engines with ops.Engine.HasLinearChain (host
// and CUDA) it runs one LinearBackwardChain per layer: each layer's data
// gradient GEMM yields the previous layer's pre-activation gradient and
// bias gradient directly (cuBLASLt's DRELU_BGRAD / DGELU_BGRAD epilogues
// on a GPU), and layer 0 computes no data gradient.
func (m *MLP) Backward(e *ops.Engine) error {
	if m.graph != nil {
		return m.graph.Backward()
	}
	return m.tape.runBackward(e)
}

// Predict writes out[Batch] (i32) = argmax of each row of the logits of the
// last Forward. It always predicts Batch rows: to evaluate N examples with N
// not a multiple of Batch, pad the last batch and ignore the padded rows.
func (m *MLP) Predict(e *ops.Engine, out *tensor.Tensor) error {
	if m.logitsF32 != nil {
		if err := e.Cast(m.logitsF32, m.logits.Value); err != nil {
			return err
		}
		return e.Argmax(out, m.logitsF32)
	}
	return e.Argmax(out, m.logits.Value)
}

// Free releases every buffer the model allocated. Further use is an error
// of the device (device.ErrFreed).
func (m *MLP) Free() error {
	var errs []error
	if m.graph != nil {
		errs = append(errs, m.graph.Free())
		m.graph = nil
	}
	for _, t := range m.bufs {
		if err := t.Buf.Free(); err != nil {
			errs = append(errs, err)
		}
	}
	m.bufs = nil
	return errors.Join(errs...)
}
