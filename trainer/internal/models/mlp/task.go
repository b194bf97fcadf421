package mlp

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
	"gpukit/trainer/internal/driver"
)

// task is an MLP run on Fashion-MNIST (driver.Task).
type task struct {
	cfg        Config
	dataDir    string
	batchesOut string
	// After Load: the training set (after --limit), the test set and the
	// batches per epoch (the last partial one is dropped).
	train, test *data.Set
	nb          int
}

// dataHint follows a failure to read Fashion-MNIST.
const dataHint = "(install the Debian package dataset-fashion-mnist or pass --data)"

func (t *task) Config() any { return t.cfg }
func (t *task) Steps() int  { return t.nb * t.cfg.Epochs }
func (t *task) EngineOptions(o ops.Options) ops.Options {
	o.NoLinearChain = !t.cfg.FuseBackward
	return o
}

// Load reads Fashion-MNIST (both splits: every epoch ends with the test
// accuracy) and writes --batches-out.
func (t *task) Load(w dist.World) error {
	train, test, err := data.LoadFashionMNIST(t.dataDir)
	if err != nil {
		return fmt.Errorf("%w %s", err, dataHint)
	}
	if t.batchesOut != "" && w.IsMain() {
		if err := WriteBatches(t.batchesOut, t.cfg, train.N); err != nil {
			return fmt.Errorf("--batches-out: %w", err)
		}
	}
	t.train, t.test = train.Limit(t.cfg.Limit), test
	if err := checkShapes(t.cfg, t.train, t.test); err != nil {
		return err
	}
	if t.nb = data.Batches(t.train.N, t.cfg.Batch, true); t.nb == 0 {
		return driver.Configf("%d training examples make no batch of %d", t.train.N, t.cfg.Batch)
	}
	return nil
}

// Init is the MLP's initial weights as NewMLP draws them from the seed.
func (t *task) Init(a device.Allocator) (driver.Checkpoint, error) {
	m, err := newModel(a, t.cfg, "init", 1, false)
	if err != nil {
		return driver.Checkpoint{}, err
	}
	defer m.free()
	return m.checkpoint(Position{})
}

func (t *task) Build(env *driver.Env) (driver.Trainer, error) {
	alloc, book, mem, err := driver.ServiceAlloc(env.Alloc, env.OptimizerSocket)
	if err != nil {
		return nil, err
	}
	m, err := newModelOn(alloc, t.cfg, env.Run, t.cfg.Batch, env.OptimizerSocket == "", env.Engine, env.Precision)
	if err != nil {
		return nil, err
	}
	if env.OptimizerSocket != "" {
		if err := m.useService(env.Engine, alloc, env.Run, env.OptimizerSocket, book, mem); err != nil {
			m.free()
			return nil, err
		}
	}
	return &trainer{t: t, m: m, e: env.Engine, a: env.Alloc, run: env.Run, orderEpoch: -1}, nil
}

func (t *task) Summary(r driver.Result, model string) string {
	acc, ok := evalField(r.Eval, "test_accuracy")
	if !ok {
		return fmt.Sprintf("nothing to do: the checkpoint already has %d epochs (raise --epochs)", t.cfg.Epochs)
	}
	return fmt.Sprintf("%d epochs, %d steps in %.1fs; test accuracy %.2f%%; wrote %s", t.cfg.Epochs, r.Step, r.Elapsed.Seconds(), 100*acc, model)
}

// evalField is the number under key in an evaluation's fields.
func evalField(e *driver.Eval, key string) (float64, bool) {
	if e == nil {
		return 0, false
	}
	for _, f := range e.Fields {
		if v, ok := f.Value.(float64); ok && f.Key == key {
			return v, true
		}
	}
	return 0, false
}

// trainer is the MLP on a device (driver.Trainer, Evaluator, Positioner,
// PostStepper).
type trainer struct {
	t          *task
	m          *model
	e          *ops.Engine
	a          device.Allocator
	run        string
	order      []int // the training set's order in orderEpoch
	orderEpoch int
}

func (r *trainer) Describe() string { return "training" }

func (r *trainer) Inputs() []*tensor.Tensor {
	return []*tensor.Tensor{r.m.mlp.Input(), r.m.mlp.Labels()}
}

// Fill writes batch step%nb of epoch step/nb, in the epoch's seeded order.
func (r *trainer) Fill(step int, in [][]byte) error {
	epoch, b := step/r.t.nb, step%r.t.nb
	if epoch != r.orderEpoch {
		r.order, r.orderEpoch = data.Order(r.t.train.N, r.t.cfg.Seed, epoch), epoch
	}
	return fill(r.t.train, tensor.BytesAs[float32](in[0]), tensor.BytesAs[int32](in[1]), data.Batch(r.order, r.t.cfg.Batch, b))
}

func (r *trainer) Compute(gt *trace.GPUTimer) error { return r.m.compute(r.e, gt) }

// Capturable: K-FAC's hook decides on the host, in the backward, whether
// factors are due; with phase graphs (driver.PhaseGraphs) the step is
// captured per phase of that decision (ComputePhases).
func (r *trainer) Capturable() bool { return !r.m.hook || r.ComputePhases() != nil }

// ComputePhases: K-FAC's factor hooks, per phase (optim.KFAC.ComputePhase).
func (r *trainer) ComputePhases() func() int {
	if !r.m.hook || !driver.PhaseGraphs || r.m.opt == nil {
		return nil
	}
	k, ok := r.m.opt.Optimizer.(*optim.KFAC)
	if !ok {
		return nil
	}
	return k.ComputePhase
}

// PostPhases: the optimizer's step, captured per phase where it may be
// (driver.OptimizerSet.PostPhases; the MLP's learning rate is constant).
func (r *trainer) PostPhases() (func() int, func()) {
	if r.m.opt == nil || !r.m.opt.Eager {
		return nil, nil
	}
	return r.m.opt.PostPhases(true)
}

func (r *trainer) PostStep() func(int, *trace.GPUTimer) error {
	if !r.m.opt.Eager {
		return nil
	}
	return func(_ int, gt *trace.GPUTimer) error { return driver.EagerStep(r.e, r.m.opt, gt) }
}

// Metrics: StepLine's figures. Loss is the mean cross-entropy of that
// step's batch (not an average over the interval, so an interrupted and
// resumed run prints the same lines); MFU is the GEMM FLOP/s of the steps
// (nn.MLP.StepFLOPs) over the device's peak; GradNorm, with clipping on,
// the norm of that step's gradients before clipping.
func (r *trainer) Metrics() driver.Metrics {
	return driver.Metrics{Loss: r.m.mlp.Loss(), GradNorm: r.m.norm, Unit: "samples", Items: float64(r.t.cfg.Batch),
		FLOPs: r.m.mlp.StepFLOPs(), LossName: "cross-entropy"}
}

func (r *trainer) LR(int) float32 { return r.t.cfg.LR }

// Position: the epoch (1-based) of step's loss line.
func (r *trainer) Position(step int) []driver.Field {
	return []driver.Field{{Key: "epoch", Value: step/r.t.nb + 1}}
}

func (r *trainer) Checkpoint(step int) (driver.Checkpoint, error) {
	return r.m.checkpoint(positionAt(step, r.t.nb))
}

func (r *trainer) Load(f *ckpt.File) error { return r.m.load(f, true) }
func (r *trainer) Free()                   { r.m.free() }

// EvalEvery: the test accuracy after every epoch.
func (r *trainer) EvalEvery() int { return r.t.nb }

// Eval is the accuracy of the model on the whole test set: the line
// {step, epoch, test_accuracy[, roots]} (roots: Shampoo, SOAP, K-FAC).
func (r *trainer) Eval(_ context.Context, step int, _ time.Duration) (driver.Eval, error) {
	acc, err := evaluate(r.e, r.a, r.run, r.m, r.t.test)
	if err != nil {
		return driver.Eval{}, err
	}
	fields := []driver.Field{{Key: "epoch", Value: step / r.t.nb}, {Key: "test_accuracy", Value: acc}}
	if r.m.opt != nil {
		if rl := driver.Roots(r.m.opt.Optimizer); rl != nil {
			fields = append(fields, driver.Field{Key: "roots", Value: rl})
		}
	}
	// No validation loss (the evaluation is the test set's accuracy): no
	// best.safetensors.
	return driver.Eval{Fields: fields, ValLoss: math.NaN()}, nil
}

// newTask is a fresh run's task from the flags.
func newTask(cfg Config, dataDir, batchesOut string) (*task, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &task{cfg: cfg, dataDir: dataDir, batchesOut: batchesOut}, nil
}

// storedConfig is a resumed run's configuration.
func storedConfig(raw json.RawMessage) (Config, error) {
	cfg, err := parseConfig(string(raw))
	if err != nil {
		return cfg, fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
	}
	return cfg, nil
}
