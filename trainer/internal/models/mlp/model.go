package mlp

import (
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
	"gpukit/trainer/internal/driver"
)

// Checkpoint layout: every model parameter under its PyTorch-style name
// ("fc0.weight", the names of bench/reference/mlp.py's module) in
// model.safetensors; the state file adds the optimizer's state under
// "optim/" ("optim/fc0.weight.exp_avg", "optim/step", ...). Metadata
// config (JSON Config) and seed; the state file's also epoch and batch
// (the next batch to run: batch `batch` of epoch `epoch`, 0-based).
const optimPrefix = "optim/"

// model is an MLP and its optimizer on one allocator.
type model struct {
	cfg Config
	mlp *nn.MLP
	opt *driver.OptimizerSet
	// hook: K-FAC reads the layers of an MLP recorded on a graph through
	// its OnLinear hook (the hook decides on the host whether factors are
	// due: the step is captured only per phase of that decision, with
	// driver.PhaseGraphs).
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
	if m.norm, err = tensor.Alloc(a, driver.Join(run, "acts/grad_norm"), tensor.F32, 1); err != nil {
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
	p := driver.BeginPhase(gt, driver.SpanForward)
	err := m.mlp.Forward(e)
	p.End()
	if err != nil {
		return err
	}
	p = driver.BeginPhase(gt, driver.SpanBackward)
	err = m.mlp.Backward(e)
	p.End()
	if err != nil {
		return err
	}
	if m.cfg.Clip > 0 {
		p = driver.BeginPhase(gt, driver.SpanClip)
		err = e.ClipGradNorm(m.grads, m.cfg.Clip, m.norm)
		p.End()
		if err != nil {
			return err
		}
	}
	if m.opt.Eager {
		return nil // stepped after the (captured) step: PostStep
	}
	p = driver.BeginPhase(gt, driver.SpanOptimizer)
	err = m.opt.Step(e)
	p.End()
	return err
}

// buildOptimizer makes the model's optimizer (cfg.Optim): in this process,
// or with a socket in the optimizer service (see driver.BuildOptimizer).
// K-FAC's layers are the MLP's Linears (static buffers).
func (m *model) buildOptimizer(e *ops.Engine, a device.Allocator, run, socket string, book *service.NameBook, mem service.Opener) (*driver.OptimizerSet, error) {
	cfg := m.cfg
	spec, err := cfg.Precond.Spec(cfg.Optim, cfg.LR, cfg.WeightDecay, cfg.Momentum, ops.DefaultAdamW.Beta1, ops.DefaultAdamW.Beta2)
	if err != nil {
		return nil, err
	}
	var layers []optim.KFACLayer
	if cfg.Optim == "kfac" {
		for _, l := range m.mlp.Linears() {
			layers = append(layers, optim.KFACLayer{Weight: l.Weight, Bias: l.Bias, Input: l.Input, OutGrad: l.OutGrad})
		}
	}
	return driver.BuildOptimizer(e, a, run, m.mlp.Params(), layers, spec, socket, book, mem, nil, nil)
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

// checkpoint is the model's tensors (Model) and the optimizer state
// (State, under optim/) with the metadata of a checkpoint at pos.
func (m *model) checkpoint(pos Position) (driver.Checkpoint, error) {
	var ck driver.Checkpoint
	var err error
	if ck.Model, err = driver.Entries("", m.tensors(false)); err != nil {
		return ck, err
	}
	if m.opt != nil {
		var st []ckpt.Named
		for _, s := range m.opt.State() {
			st = append(st, ckpt.Named{Name: s.Name, T: s.Value})
		}
		if ck.State, err = driver.Entries(optimPrefix, st); err != nil {
			return ck, err
		}
	}
	ck.Meta = map[string]string{"seed": strconv.FormatUint(m.cfg.Seed, 10)}
	ck.StateMeta = map[string]string{"epoch": strconv.Itoa(pos.Epoch), "batch": strconv.Itoa(pos.Batch)}
	return ck, nil
}

// load copies parameters (and, withOptim, the optimizer state) from f.
func (m *model) load(f *ckpt.File, withOptim bool) error {
	for _, nt := range m.tensors(withOptim) {
		if err := f.Load(nt.Name, nt.T); err != nil {
			return fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
	}
	return nil
}

// Position is how far a run has gone.
type Position struct {
	Step  int // optimizer steps done
	Epoch int // epoch of the next batch (0-based)
	Batch int // next batch within Epoch (0-based)
}

// positionAt is the position after step steps of nb batches an epoch.
func positionAt(step, nb int) Position {
	return Position{Step: step, Epoch: step / nb, Batch: step % nb}
}

// ReadCheckpoint reads a checkpoint (model or state file) and the Config
// in its metadata, and the steps done. A file without trainer metadata
// (e.g. written by PyTorch's safetensors.torch.save_file) gets a Config
// inferred from the shapes of fc<i>.weight, with act, and step 0.
func ReadCheckpoint(path, act string) (*ckpt.File, Config, int, error) {
	f, err := ckpt.ReadFile(path)
	if err != nil {
		return nil, Config{}, 0, err
	}
	s, ok := f.Metadata[driver.MetaConfig]
	if !ok {
		cfg, err := inferConfig(f, act)
		return f, cfg, 0, err
	}
	cfg, err := parseConfig(s)
	if err != nil {
		return nil, cfg, 0, fmt.Errorf("%s: %w", path, err)
	}
	step, err := strconv.Atoi(f.Metadata[driver.MetaStep])
	if err != nil || step < 0 {
		return nil, cfg, 0, fmt.Errorf("%s: %w: metadata step is %q", path, driver.ErrCheckpoint, f.Metadata[driver.MetaStep])
	}
	return f, cfg, step, nil
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
			return cfg, fmt.Errorf("%w: fc%d.weight has shape %v", driver.ErrCheckpoint, i, in.Shape)
		}
		if i == 0 {
			cfg.Widths = append(cfg.Widths, in.Shape[1])
		}
		cfg.Widths = append(cfg.Widths, in.Shape[0])
	}
	if len(cfg.Widths) < 2 {
		return cfg, fmt.Errorf("%w: no trainer metadata and no fc0.weight (tensors: %s)", driver.ErrCheckpoint, strings.Join(f.Names(), ", "))
	}
	return cfg, cfg.Validate()
}
