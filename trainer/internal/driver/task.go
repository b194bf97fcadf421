package driver

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// Task is one model's part of a run, made from the flags by Model.New (or
// Model.Resume): its configuration, its length, its data and how to build
// it on a device. Nothing in it touches a device until Build.
type Task interface {
	// Config is the model's configuration, stored as JSON in the
	// checkpoints' metadata "config" (what eval, generate and a resumed
	// run rebuild the model from).
	Config() any
	// Steps is the run's number of optimizer steps in all (called after
	// Load: an MLP's depends on the data's size).
	Steps() int
	// Load reads the training data this rank of world needs (the
	// expensive part of a run's set-up after the flags are checked,
	// before any device work); errors that are bad flag values for the
	// data (a batch larger than the data) wrap ErrConfig.
	Load(world dist.World) error
	// Init is the model's initial weights, as a fresh run draws them
	// (trainer init): Checkpoint.Model and Meta are used. It loads what
	// it needs of the data itself (a GPT's vocabulary).
	Init(a device.Allocator) (Checkpoint, error)
	// Build makes the model, its optimizer and its recorded step on env.
	Build(env *Env) (Trainer, error)
	// Summary is the human line (without "trainer: ") the run ends with,
	// for a run that was not interrupted, e.g. "300 steps in 12.3s;
	// validation loss 1.4671 ...". model is the model file's path.
	Summary(r Result, model string) string
}

// Env is where a task is built: the engine of the run's device, the
// allocator (a pool client with --pool), the run's buffer name prefix,
// the precision, and the data-parallel world.
type Env struct {
	Engine    *ops.Engine
	Alloc     device.Allocator
	Run       string // buffer name prefix
	Precision ops.Precision
	Graph     bool // the run replays its steps as CUDA graphs (models may replay their evaluation too)
	// World is this process's place in a data-parallel job (the zero
	// World, or one of Size 1, is a process alone), and DP its
	// communicator and bucket settings (nil alone; set for a model that
	// registers DataParallel when the world has several ranks, or in
	// tests). A model with DP set keeps its gradients in GradBuckets.
	World dist.World
	DP    *DP
	// OptimizerSocket, when set, asks for the optimizer in the service
	// there (BuildOptimizer; Alloc is then a pool client).
	OptimizerSocket string
	Log             io.Writer // human messages (stderr), or nil
}

// Trainer is a task built on a device (Task.Build): its model, optimizer
// and the recorded training step the driver runs every step. The driver
// calls Fill, then queues the copies of the staging slot into Inputs and
// Compute (eagerly or as one replayed CUDA graph), reads Metrics().Loss
// every --log-every steps, evaluates and checkpoints at the cadence the
// task asks for, and Frees it at the end.
type Trainer interface {
	// Describe is what the run's first human line says the model is:
	// "training on cuda:0: ..." for "training", "GPT of 0.12M
	// parameters (...) on cuda:0: ..." for a GPT.
	Describe() string
	// Inputs are the step's input tensors (contiguous, on the device):
	// each step copies them from a staging slot the host filled (Fill).
	Inputs() []*tensor.Tensor
	// Fill writes the inputs of step (0-based) into in (in[i] is the
	// staging bytes of Inputs()[i]); it may also do host work of the
	// step (an optimizer's learning rate set from the host). It must be
	// a function of the step (and the configuration), so a resumed run
	// draws what an uninterrupted one would.
	Fill(step int, in [][]byte) error
	// Compute queues one training step on the engine — forward, loss,
	// backward, clipping, the optimizer — with no host synchronisation,
	// each phase through BeginPhase or RunPhases (gt times them on the
	// GPU in eager steps; nil inside a capture).
	Compute(gt *trace.GPUTimer) error
	// Capturable reports whether Compute may be captured and replayed as
	// a CUDA graph (false: a hook decides on the host each step, e.g.
	// K-FAC's factors).
	Capturable() bool
	// Metrics are the device scalars and figures of the loss lines.
	Metrics() Metrics
	// LR is the learning rate of step (0-based), for its loss line.
	LR(step int) float32
	// Checkpoint is what the checkpoint after step steps holds.
	Checkpoint(step int) (Checkpoint, error)
	// Load restores a run from its state file (the model's tensors,
	// Checkpoint.Model, and the rest, Checkpoint.State).
	Load(state *ckpt.File) error
	// Free releases the device memory.
	Free()
}

// Metrics are a trainer's loss-line figures: the loss of the last step
// ([1] f32 on the device), the gradient norm before clipping (nil: no
// clipping), extra loss terms (logged after the norm, e.g. aux_loss and
// z_loss of a Mixture-of-Experts model; averaged across ranks as the loss
// is), the throughput's unit and items
// per step of the whole job (samples_per_s: Unit "samples", Items the
// batch), the FLOPs of one step on this device (0: no mfu), and whether
// the last step is logged even off the --log-every cadence.
type Metrics struct {
	Loss     *tensor.Tensor
	GradNorm *tensor.Tensor
	Terms    []Term
	Unit     string
	Items    float64
	FLOPs    float64
	LogFinal bool
	// LossName labels the loss in the plot ("cross-entropy").
	LossName string
}

// Term is a scalar logged on every loss line under Name, read from T
// ([1] f32 on the device) when the line is written.
type Term struct {
	Name string
	T    *tensor.Tensor
}

// Checkpoint is what a trainer writes at a checkpoint: Model, the model's
// tensors under the names of the matching PyTorch module (model.safetensors
// and best.safetensors hold these alone, so a strict load_state_dict takes
// them); State, everything else a resumed run needs (optimizer state under
// "optim/", the U-Net's raw weights under "raw/", carried recurrent state),
// which the state file holds after Model; Meta, model metadata of every
// file (e.g. "tokenizer"), and StateMeta, the state file's alone (e.g. a
// data position). The driver adds format, model, config and step.
type Checkpoint struct {
	Model     []ckpt.Entry
	State     []ckpt.Entry
	Meta      map[string]string
	StateMeta map[string]string
}

// Entries reads named device tensors into checkpoint entries, with prefix
// before each name.
func Entries(prefix string, ts []ckpt.Named) ([]ckpt.Entry, error) {
	out := make([]ckpt.Entry, 0, len(ts))
	for _, nt := range ts {
		b, err := nt.T.Read()
		if err != nil {
			return nil, err
		}
		out = append(out, ckpt.Entry{Name: prefix + nt.Name, DType: nt.T.DType, Shape: nt.T.Shape, Data: b})
	}
	return out, nil
}

// Field is one key and value of a JSON line, kept in order.
type Field struct {
	Key   string
	Value any
}

// Line is a JSON line whose fields keep their order.
type Line []Field

// MarshalJSON writes the fields in order (no HTML escaping).
func (l Line) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, f := range l {
		if i > 0 {
			b = append(b, ',')
		}
		k, err := json.Marshal(f.Key)
		if err != nil {
			return nil, err
		}
		v, err := marshalNoEscape(f.Value)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, k...), ':'), v...)
	}
	return append(b, '}'), nil
}

// Evaluator is a Trainer that evaluates: every EvalEvery steps and at the
// end, the driver calls Eval and writes a line of step and the fields.
// ctx is the run's context: a process alone may stop evaluating when it is
// cancelled (returning ctx.Err()); the evaluation then runs when the run
// resumes. Ranks of a data-parallel run must all evaluate (their
// collectives must match) and ignore it.
type Evaluator interface {
	EvalEvery() int
	Eval(ctx context.Context, step int, elapsed time.Duration) (Eval, error)
}

// Eval is an evaluation's line fields (after "step") and, when the model
// has one, the validation loss (NaN: none) by which the driver keeps
// best.safetensors.
type Eval struct {
	Fields  []Field
	ValLoss float64
}

// Saver is a Trainer with its own checkpoint cadence besides the
// evaluations (which always checkpoint): every SaveEvery steps.
type Saver interface{ SaveEvery() int }

// Positioner is a Trainer whose loss lines carry fields of the step
// before "loss" (the MLP's epoch).
type Positioner interface{ Position(step int) []Field }

// PostStepper is a Trainer that may have eager device work after every
// step, outside any captured graph (an optimizer that cannot be captured,
// an average whose decay changes each step): PostStep returns it (nil:
// none), a func of the step (0-based) queued in the device's Do, its
// phases timed by gt as Compute's are.
type PostStepper interface {
	PostStep() func(step int, gt *trace.GPUTimer) error
}

// PostPhaser is a PostStepper whose post-step work may be captured per
// phase (its optimizer's, OptimizerSet.PostPhases; Runner.SetPostPhases):
// PostPhases returns nil, nil when it may not.
type PostPhaser interface {
	PostPhases() (phase func() int, replayed func())
}

// ComputePhaser is a Trainer whose step is capturable at some steps only
// (K-FAC's factor hooks in the MLP's backward): ComputePhases returns the
// phase of the next step's compute (Runner.SetComputePhases), or nil.
type ComputePhaser interface {
	ComputePhases() func() int
}

// AfterStepper is a Trainer with host work after each step's line
// (publishing a weight snapshot); done is the steps done.
type AfterStepper interface{ AfterStep(done int) error }

// Sharer is a data-parallel Trainer's description of a rank's share of
// a global batch and its gradient buckets, for the run's first lines.
type Sharer interface {
	Share() (share string, b *GradBuckets)
}

// StateGatherer is a data-parallel Trainer part of whose checkpoint lives
// on other ranks (ZeRO-1's optimizer state: GradBuckets.NewAdamW). The
// driver calls GatherState on every rank at every checkpoint, before rank
// 0's Checkpoint (a collective: the ranks meet in it), which then writes
// the gathered state as an unsharded run would.
type StateGatherer interface {
	GatherState() error
}

// Result says how a run ended.
type Result struct {
	Step        int           // steps done
	Trained     bool          // the run did steps or an evaluation (false: the checkpoint had them all)
	Interrupted bool          // stopped by its context before the end
	Loss        float32       // of the last loss line (0: none)
	Eval        *Eval         // the last evaluation (nil: none)
	Elapsed     time.Duration // wall time of the run
}

// marshalNoEscape is json.Marshal without HTML escaping.
func marshalNoEscape(v any) ([]byte, error) {
	var b bytesBuffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.b[:len(b.b)-1], nil // Encode adds a newline
}

type bytesBuffer struct{ b []byte }

func (w *bytesBuffer) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }
