package train

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/optim/service"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// Checkpoint layout (one safetensors file, written atomically):
//
//	<param>            every model parameter under its PyTorch-style name ("fc0.weight")
//	optim/<state>      the optimizer's state ("fc0.weight.exp_avg", "step", ...)
//	metadata: format, config (JSON Config), step (steps done), epoch and
//	batch (the next batch to run: batch `batch` of epoch `epoch`, 0-based),
//	seed.
const (
	optimPrefix = "optim/"
	formatName  = "gpukit.trainer/1"
)

// ErrCheckpoint reports a checkpoint that cannot be used.
var ErrCheckpoint = errors.New("train: unusable checkpoint")

// Position is how far a run has gone.
type Position struct {
	Step  int // optimizer steps done
	Epoch int // epoch of the next batch (0-based)
	Batch int // next batch within Epoch (0-based)
}

// model is an MLP and its optimizer on one allocator.
type model struct {
	cfg Config
	mlp *nn.MLP
	opt *optimizerSet
	// hook: K-FAC reads the layers of an MLP recorded on a graph through
	// its OnLinear hook (the step is then not captured: the hook decides on
	// the host whether factors are due).
	hook    bool
	setHook func(func(string, *tensor.Tensor, *tensor.Tensor) error)
	grads   []*tensor.Tensor // every Param.Grad, for clipping
	norm    *tensor.Tensor   // [1] f32: the gradient norm before clipping (cfg.Clip > 0)
}

func newModel(a device.Allocator, cfg Config, run string, batch int, withOptim bool) (*model, error) {
	return newModelOn(a, cfg, run, batch, withOptim, nil, ops.PrecF32)
}

// newModelOn is newModel for training on e at prec: with bf16 on a GPU the
// MLP is recorded on an ops.Graph with bf16 activations (weights cast once
// per step, f32 masters), not the f32 chain whose GEMMs cast both operands.
func newModelOn(a device.Allocator, cfg Config, run string, batch int, withOptim bool, e *ops.Engine, prec ops.Precision) (*model, error) {
	mc := nn.MLPConfig{Widths: cfg.Widths, Act: cfg.act(), Batch: batch, Seed: cfg.Seed, Prefix: run}
	if e != nil && prec == ops.PrecBF16 && e.IsGraphCapable() {
		mc.Graph, mc.Autocast = e, tensor.BF16
	}
	var hook func(string, *tensor.Tensor, *tensor.Tensor) error
	if mc.Graph != nil && cfg.Optim == "kfac" {
		mc.OnLinear = func(w string, x, dy *tensor.Tensor) error {
			if hook == nil {
				return nil
			}
			return hook(w, x, dy)
		}
	}
	mlp, err := nn.NewMLP(a, mc)
	if err != nil {
		return nil, fmt.Errorf("building the model: %w", err)
	}
	m := &model{cfg: cfg, mlp: mlp, hook: mc.OnLinear != nil,
		setHook: func(h func(string, *tensor.Tensor, *tensor.Tensor) error) { hook = h }}
	if !withOptim {
		return m, nil
	}
	if m.opt, err = m.buildOptimizer(e, a, run, "", nil, nil); err != nil {
		mlp.Free()
		return nil, err
	}
	if err := m.setupClip(a, run); err != nil {
		m.free()
		return nil, err
	}
	return m, nil
}

// setupClip allocates what gradient clipping needs (cfg.Clip > 0).
func (m *model) setupClip(a device.Allocator, run string) error {
	if m.cfg.Clip <= 0 {
		return nil
	}
	for _, p := range m.mlp.Params() {
		m.grads = append(m.grads, p.Grad)
	}
	var err error
	if m.norm, err = tensor.Alloc(a, join(run, "acts/grad_norm"), tensor.F32, 1); err != nil {
		return fmt.Errorf("building the model: %w", err)
	}
	return nil
}

// useService makes a model built without an optimizer train through the
// optimizer service at socket (its buffers named through book, the state
// mapped through mem) on e.
func (m *model) useService(e *ops.Engine, a device.Allocator, run, socket string, book *service.NameBook, mem service.Opener) error {
	var err error
	if m.opt, err = m.buildOptimizer(e, a, run, socket, book, mem); err != nil {
		return err
	}
	return m.setupClip(a, run)
}

func (m *model) free() {
	if m.norm != nil {
		m.norm.Buf.Free()
	}
	if m.opt != nil {
		m.opt.Free()
	}
	m.mlp.Free()
}

// compute runs one training step on the batch already in the model's input
// and label buffers: forward, loss, backward, gradient clipping (cfg.Clip >
// 0) and the optimizer. On a GPU everything is queued on the engine's
// stream with no host synchronisation. Each phase is a host span on the
// trace and, with gt set (an eager GPU step: the caller runs compute inside
// the device's Do, never while capturing), a GPU span.
func (m *model) compute(e *ops.Engine, gt *trace.GPUTimer) error {
	p := beginPhase(gt, spanForward)
	err := m.mlp.Forward(e)
	p.end()
	if err != nil {
		return err
	}
	p = beginPhase(gt, spanBackward)
	err = m.mlp.Backward(e)
	p.end()
	if err != nil {
		return err
	}
	if m.cfg.Clip > 0 {
		p = beginPhase(gt, spanClip)
		err = e.ClipGradNorm(m.grads, m.cfg.Clip, m.norm)
		p.end()
		if err != nil {
			return err
		}
	}
	if m.opt.eager {
		return nil // the step runner steps it after the (captured) step
	}
	p = beginPhase(gt, spanOptimizer)
	err = m.opt.Step(e)
	p.end()
	return err
}

// buildOptimizer makes the model's optimizer (cfg.Optim): in this process,
// or with a socket in the optimizer service (see train.buildOptimizer).
// K-FAC's layers are the MLP's Linears (static buffers).
func (m *model) buildOptimizer(e *ops.Engine, a device.Allocator, run, socket string, book *service.NameBook, mem service.Opener) (*optimizerSet, error) {
	cfg := m.cfg
	spec, err := cfg.Precond.spec(cfg.Optim, cfg.LR, cfg.WeightDecay, cfg.Momentum, ops.DefaultAdamW.Beta1, ops.DefaultAdamW.Beta2)
	if err != nil {
		return nil, err
	}
	var layers []optim.KFACLayer
	if cfg.Optim == "kfac" {
		for _, l := range m.mlp.Linears() {
			layers = append(layers, optim.KFACLayer{Weight: l.Weight, Bias: l.Bias, Input: l.Input, OutGrad: l.OutGrad})
		}
	}
	return buildOptimizer(e, a, run, m.mlp.Params(), layers, spec, socket, book, mem, nil)
}

// tensors lists what a checkpoint holds: parameters, then (withOptim) the
// optimizer state under optim/.
func (m *model) tensors(withOptim bool) []ckpt.Named {
	var out []ckpt.Named
	for _, p := range m.mlp.Params() {
		out = append(out, ckpt.Named{Name: p.Name, T: p.Value})
	}
	if withOptim && m.opt != nil {
		for _, s := range m.opt.State() {
			out = append(out, ckpt.Named{Name: optimPrefix + s.Name, T: s.Value})
		}
	}
	return out
}

// save writes the model (and optimizer state) with the run position to path.
func (m *model) save(path string, pos Position, withOptim bool) error {
	meta := map[string]string{
		"format": formatName,
		"config": m.cfg.marshal(),
		"step":   strconv.Itoa(pos.Step),
		"epoch":  strconv.Itoa(pos.Epoch),
		"batch":  strconv.Itoa(pos.Batch),
		"seed":   strconv.FormatUint(m.cfg.Seed, 10),
	}
	if err := ckpt.Save(path, m.tensors(withOptim), meta); err != nil {
		return fmt.Errorf("writing checkpoint: %w", err)
	}
	return nil
}

// load copies parameters (and, withOptim, the optimizer state) from f.
func (m *model) load(f *ckpt.File, withOptim bool) error {
	for _, nt := range m.tensors(withOptim) {
		if err := f.Load(nt.Name, nt.T); err != nil {
			return fmt.Errorf("%w: %v", ErrCheckpoint, err)
		}
	}
	return nil
}

// ReadCheckpoint reads a checkpoint and the Config and Position in its
// metadata. A file without trainer metadata (e.g. written by PyTorch's
// safetensors.torch.save_file) gets a Config inferred from the shapes of
// fc<i>.weight, with act, and a zero Position.
func ReadCheckpoint(path, act string) (*ckpt.File, Config, Position, error) {
	f, err := ckpt.ReadFile(path)
	if err != nil {
		return nil, Config{}, Position{}, err
	}
	var pos Position
	s, ok := f.Metadata["config"]
	if !ok {
		cfg, err := inferConfig(f, act)
		return f, cfg, pos, err
	}
	cfg, err := parseConfig(s)
	if err != nil {
		return nil, cfg, pos, fmt.Errorf("%s: %w", path, err)
	}
	for _, kv := range []struct {
		key string
		dst *int
	}{{"step", &pos.Step}, {"epoch", &pos.Epoch}, {"batch", &pos.Batch}} {
		v, err := strconv.Atoi(f.Metadata[kv.key])
		if err != nil || v < 0 {
			return nil, cfg, pos, fmt.Errorf("%s: %w: metadata %q is %q", path, ErrCheckpoint, kv.key, f.Metadata[kv.key])
		}
		*kv.dst = v
	}
	return f, cfg, pos, nil
}

func inferConfig(f *ckpt.File, act string) (Config, error) {
	cfg := Default()
	cfg.Act = act
	cfg.Widths = nil
	for i := 0; ; i++ {
		in, ok := f.Tensors["fc"+strconv.Itoa(i)+".weight"]
		if !ok {
			break
		}
		if len(in.Shape) != 2 || (i > 0 && cfg.Widths[i] != in.Shape[1]) {
			return cfg, fmt.Errorf("%w: fc%d.weight has shape %v", ErrCheckpoint, i, in.Shape)
		}
		if i == 0 {
			cfg.Widths = append(cfg.Widths, in.Shape[1])
		}
		cfg.Widths = append(cfg.Widths, in.Shape[0])
	}
	if len(cfg.Widths) < 2 {
		return cfg, fmt.Errorf("%w: no trainer metadata and no fc0.weight (tensors: %s)", ErrCheckpoint, strings.Join(f.Names(), ", "))
	}
	return cfg, cfg.Validate()
}
