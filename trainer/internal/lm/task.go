package lm

import (
	"context"
	"fmt"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
	"gpukit/trainer/internal/driver"
)

// task is a language model's run on a text (driver.Task).
type task struct {
	v          Variant
	cfg        Config
	tok        *data.CharTokenizer // a resumed run's (nil: built from the text)
	batchesOut string
	corpus     *data.Corpus // after Load
}

func (t *task) Config() any { return t.cfg }
func (t *task) Steps() int  { return t.cfg.Steps }

// Load reads the text (cfg.Data) with the run's tokenizer, or a new one
// built from it, and checks the configuration against the text and the
// world; rank 0 writes --batches-out.
func (t *task) Load(w dist.World) error {
	if w.Size > 0 && t.cfg.Batch%w.Size != 0 {
		return driver.Configf("--batch %d does not divide by the world size %d: each rank takes --batch/%d rows of every global batch", t.cfg.Batch, w.Size, w.Size)
	}
	corpus, err := data.LoadText(t.cfg.Data, t.tok)
	if err != nil {
		return fmt.Errorf("--data: %w", err)
	}
	t.corpus = corpus
	t.cfg.Model.Vocab = corpus.Tok.Vocab()
	if err := t.cfg.Validate(); err != nil {
		return err
	}
	for _, part := range [][]int32{corpus.Train, corpus.Val} {
		if len(part) <= t.cfg.Model.Block {
			return driver.Configf("the text's %d training and %d validation tokens must each exceed --block %d",
				len(corpus.Train), len(corpus.Val), t.cfg.Model.Block)
		}
	}
	if w.Distributed() && t.cfg.optimName() == "kfac" {
		// The other optimizers read only the averaged gradients, so every
		// rank's step is the same; K-FAC's factors come from each rank's
		// own activations and output gradients, which nothing averages.
		return driver.Configf("--optim kfac with %d ranks: K-FAC's factors would be each rank's own (not averaged across ranks); use another --optim for data-parallel runs", w.Size)
	}
	if t.batchesOut != "" && w.IsMain() {
		if err := WriteBatches(t.batchesOut, t.cfg, corpus, t.cfg.Steps); err != nil {
			return fmt.Errorf("--batches-out: %w", err)
		}
	}
	return nil
}

// Init is the GPT's initial weights, as a run draws them from the seed:
// what a reference implementation loads to start from the same point.
func (t *task) Init(a device.Allocator) (driver.Checkpoint, error) {
	if t.corpus == nil {
		if err := t.Load(dist.World{}); err != nil {
			return driver.Checkpoint{}, err
		}
	}
	m, err := nn.NewGPT(a, "init", t.cfg.Model, false, t.cfg.Seed)
	if err != nil {
		return driver.Checkpoint{}, err
	}
	defer m.Free()
	l := &lm{cfg: t.cfg, m: m}
	return l.checkpoint(t.corpus.Tok)
}

func (t *task) Build(env *driver.Env) (driver.Trainer, error) {
	if env.DP != nil && env.OptimizerSocket != "" {
		return nil, driver.Configf("--optimizer-socket with %d ranks: the optimizer service is not built for data-parallel runs", env.DP.Comm.Size())
	}
	l, err := newLMWith(env.Engine, env.Alloc, env.Run, t.cfg, env.Precision, true, env.OptimizerSocket, env.DP)
	if err != nil {
		return nil, err
	}
	ev, err := newEvaluator(env.Engine, l, t.corpus.Val, env.Graph, env.DP)
	if err != nil {
		l.free()
		return nil, err
	}
	rank := 0
	if env.DP != nil {
		rank = env.DP.Comm.Rank()
	}
	return &trainer{t: t, l: l, e: env.Engine, ev: ev, first: rank * l.local}, nil
}

func (t *task) Summary(r driver.Result, model string) string {
	if !r.Trained {
		return fmt.Sprintf("nothing to do: the checkpoint already has %d steps (raise --steps)", r.Step)
	}
	val := nan()
	if r.Eval != nil {
		val = r.Eval.ValLoss
	}
	unigram := data.UnigramEntropy(t.corpus.Val, t.corpus.Tok.Vocab())
	return fmt.Sprintf("%d steps in %.1fs; validation loss %.4f (unigram entropy of the text %.4f); wrote %s",
		r.Step, r.Elapsed.Seconds(), val, unigram, model)
}

// trainer is a language model on a device (driver.Trainer, Evaluator,
// PostStepper, DataParallel, StateGatherer).
type trainer struct {
	t     *task
	l     *lm
	e     *ops.Engine
	ev    *evaluator
	first int // this rank's first row of every global batch
}

func (r *trainer) Describe() string {
	c := r.t.cfg.Model
	s := fmt.Sprintf("%s of %.2fM parameters (%d layers, %d heads, d %d, block %d, vocabulary %d)", r.t.v.Kind,
		float64(r.l.m.NumParams(true))/1e6, c.Layers, c.Heads, c.DModel, c.Block, c.Vocab)
	if r.t.v.Describe != nil {
		s += "; " + r.t.v.Describe(r.l.m, c)
	}
	return s
}

func (r *trainer) Inputs() []*tensor.Tensor {
	return []*tensor.Tensor{r.l.train.Idx, r.l.train.Targets, r.l.lr}
}

// Fill draws this rank's rows of the global batch of step (data.BlockRows
// of the training split, from the seed and the step) and the learning
// rate's scale.
func (r *trainer) Fill(step int, in [][]byte) error {
	c := r.t.cfg
	n := r.l.local * c.Model.Block
	x, y := tensor.BytesAs[int32](in[0]), tensor.BytesAs[int32](in[1])
	if err := data.BlockRows(r.t.corpus.Train, x[:n], y[:n], c.Batch, c.Model.Block, c.Seed, uint64(step), r.first, r.l.local); err != nil {
		return err
	}
	lr := c.LRAt(step)
	tensor.BytesAs[float32](in[2])[0] = lr / c.LR
	if r.l.hostLR {
		r.l.opt.SetLR(lr) // a host value: these optimizers take no device scale
	}
	return nil
}

func (r *trainer) Compute(gt *trace.GPUTimer) error { return r.l.compute(r.e, gt) }

// Capturable: K-FAC's hook decides on the host, in the backward, whether
// factors are due: its steps are not replayed from a graph.
func (r *trainer) Capturable() bool { return !r.l.hook }

// PostPhases: the optimizer's step, captured per phase where it may be
// (driver.OptimizerSet.PostPhases).
func (r *trainer) PostPhases() (func() int, func()) {
	if r.l.set == nil || !r.l.set.Eager {
		return nil, nil
	}
	return r.l.set.PostPhases(false) // a schedule: only optimizers that read the device's scale
}

func (r *trainer) PostStep() func(int, *trace.GPUTimer) error {
	if r.l.set == nil || !r.l.set.Eager {
		return nil
	}
	return func(_ int, gt *trace.GPUTimer) error { return driver.EagerStep(r.e, r.l.set, gt) }
}

// Metrics: the loss of that step's batch (with several ranks, averaged
// across them by the driver), tokens/s of the whole job, MFU per GPU
// (nanoGPT's FLOP count, nn.GPT.FLOPsPerToken, over the device's peak)
// and, with clipping, the gradient norm before clipping.
func (r *trainer) Metrics() driver.Metrics {
	c := r.t.cfg
	m := driver.Metrics{Loss: r.l.train.Loss, GradNorm: r.l.norm, Unit: "tokens", Items: float64(c.Batch * c.Model.Block),
		FLOPs:    r.l.m.FLOPsPerToken(c.Model.Block) * float64(r.l.local*c.Model.Block), // this GPU's share
		LogFinal: true, LossName: "cross-entropy"}
	if r.t.v.Terms != nil {
		m.Terms = r.t.v.Terms(r.l.train)
	}
	return m
}

func (r *trainer) LR(step int) float32 { return r.t.cfg.LRAt(step) }

func (r *trainer) Checkpoint(int) (driver.Checkpoint, error) { return r.l.checkpoint(r.t.corpus.Tok) }

// GatherState: with --shard-optimizer, every rank sends its parts of the
// optimizer state to rank 0 for the checkpoint (driver.StateGatherer).
func (r *trainer) GatherState() error      { return r.l.gatherState(r.e) }
func (r *trainer) Load(f *ckpt.File) error { return r.l.load(f) }

func (r *trainer) Free() {
	r.ev.close()
	r.l.free()
}

func (r *trainer) EvalEvery() int { return r.t.cfg.EvalEvery }

// Eval is the mean loss over the fixed validation batches: the line
// {step, val_loss, elapsed_s[, roots]} (roots: Shampoo, SOAP, K-FAC).
func (r *trainer) Eval(ctx context.Context, _ int, elapsed time.Duration) (driver.Eval, error) {
	v, err := r.ev.loss(ctx)
	if err != nil {
		return driver.Eval{}, err
	}
	fields := []driver.Field{{Key: "val_loss", Value: driver.Round(v, 4)}, {Key: "elapsed_s", Value: driver.Round(elapsed.Seconds(), 2)}}
	if r.l.set != nil {
		if rl := driver.Roots(r.l.set.Optimizer); rl != nil {
			fields = append(fields, driver.Field{Key: "roots", Value: rl})
		}
	}
	return driver.Eval{Fields: fields, ValLoss: v}, nil
}

// Replicas are the parameters and the optimizer state, which rank 0
// broadcasts (the initial ones, or the checkpoint's); sharded, the
// parameters' buckets alone (each rank loaded its parts of the state).
func (r *trainer) Replicas() []*tensor.Tensor {
	if r.l.z != nil {
		return r.l.dp.ParamBuckets()
	}
	var ts []*tensor.Tensor
	for _, p := range r.l.m.Params() {
		ts = append(ts, p.Value)
	}
	for _, s := range r.l.opt.State() {
		ts = append(ts, s.Value)
	}
	return ts
}

func (r *trainer) Share() (string, *driver.GradBuckets) {
	return fmt.Sprintf("%d sequences per rank of each global batch of %d", r.l.local, r.t.cfg.Batch), r.l.dp
}

// Eval loads a language model's checkpoint and returns its mean loss
// over cfg.EvalBatches fixed validation batches of corpus (the same
// batches a run's val_loss lines use).
func Eval(a device.Allocator, prec ops.Precision, f *ckpt.File, cfg Config, corpus *data.Corpus, graph bool) (float64, error) {
	eng, err := ops.NewEngine(a.Device(), ops.Options{Precision: prec})
	if err != nil {
		return 0, err
	}
	defer driver.CloseEngine(eng)
	l, err := newLM(eng, a, "", cfg, prec, false)
	if err != nil {
		return 0, err
	}
	defer l.free()
	if err := l.load(f); err != nil {
		return 0, err
	}
	ev, err := newEvaluator(eng, l, corpus.Val, graph, nil)
	if err != nil {
		return 0, err
	}
	defer ev.close()
	return ev.loss(context.Background())
}
