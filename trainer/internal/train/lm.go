package train

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// LMOptions are the parts of a language-model run that do not change its
// numbers.
type LMOptions struct {
	Alloc     device.Allocator
	Precision ops.Precision // PrecBF16: bf16 autocast (activations and GEMM operands bf16)
	Graph     bool          // replay each step as a CUDA graph (GPU only)
	Run       string        // buffer name prefix
	Corpus    *data.Corpus
	Out       string
	LogEvery  int
	Stdout    io.Writer
	Log       io.Writer // human messages, or nil
	Progress  io.Writer // progress bar (a terminal), or nil
	// Resume, when non-nil, is a checkpoint to continue from after Step
	// steps.
	Resume *ckpt.File
	Step   int
	// OptimizerSocket, when set, runs the optimizer in the service there
	// (`optimizer serve`); Alloc must then be a pool client.
	OptimizerSocket string
	// World is this process's place in a data-parallel job (dist.FromEnv;
	// the zero World is a process alone). With several ranks, Alloc is
	// this rank's GPU, and each rank trains on its rows of every global
	// batch of cfg.Batch sequences (see dataparallel.go).
	World dist.World
	// BucketBytes is the size limit of a gradient bucket of a
	// data-parallel run (0: dist.DefaultBucketBytes, PyTorch DDP's 25 MiB;
	// the first bucket's is dist.DefaultFirstBucketBytes, 1 MiB, or
	// BucketBytes when smaller).
	BucketBytes int64
	// GradComm is the dtype the f32 gradient buckets of a data-parallel
	// run travel in: 0 or tensor.F32 as they are; tensor.BF16 cast to bf16
	// for the all-reduce and back (PyTorch DDP's bf16_compress_hook; half
	// the bytes, gradients rounded to bf16). A process alone ignores it.
	GradComm tensor.DType
	// buckets puts the gradients in bucket buffers and runs the reducer
	// even alone (tests: a Solo communicator reduces nothing).
	buckets bool
	// comm, when set, is the communicator of World instead of NCCL's
	// (tests: ranks in goroutines of one process, on the host).
	comm collective
}

// LMStepLine is the JSON line written every LogEvery steps: the loss of
// that step's batch, the learning rate it used, throughput over the
// interval since the last line, MFU (nanoGPT's FLOP count over the
// device's peak) and, with clipping, the gradient norm before clipping.
type LMStepLine struct {
	Step       int      `json:"step"`
	Loss       float32  `json:"loss"`
	LR         float32  `json:"lr"`
	TokensPerS float64  `json:"tokens_per_s"`
	StepMS     float64  `json:"step_ms"`
	MFU        *float64 `json:"mfu,omitempty"`
	GradNorm   *float32 `json:"grad_norm,omitempty"`
}

// LMEvalLine is written every EvalEvery steps and at the end: the mean
// loss over the fixed validation batches.
type LMEvalLine struct {
	Step    int        `json:"step"`
	ValLoss float64    `json:"val_loss"`
	Elapsed float64    `json:"elapsed_s"`
	Roots   *RootsLine `json:"roots,omitempty"` // Shampoo, SOAP, K-FAC
}

// LMResult says how a run ended.
type LMResult struct {
	Step        int
	Interrupted bool
	ValLoss     float64 // at the last evaluation (NaN if none ran)
	Elapsed     time.Duration
}

// evalSeed separates the validation batches' draws from the training ones.
const evalSeed = 0x6576616c // "eval"

// lm is a GPT, its optimizer and its recorded training and evaluation
// steps on one engine.
type lm struct {
	cfg LMConfig
	m   *nn.GPT
	opt optim.Optimizer
	// set is a non-AdamW optimizer (cfg.Optim); an eager one steps after
	// the graph. hostLR: its learning rate is set from the host each step
	// (else it reads the device's scale, l.lr, as AdamW does).
	set    *optimizerSet
	hostLR bool
	hook   bool           // K-FAC reads the graph's Linear layers through OnLinear
	lr     *tensor.Tensor // [1] f32: the learning rate's scale, an input of every step
	norm   *tensor.Tensor // [1] f32 gradient norm (Clip > 0)
	coef   *tensor.Tensor // [1] f32 clipping coefficient AdamW applies (Clip > 0, in-process AdamW)
	grads  []*tensor.Tensor
	train  *nn.GPTStep
	eval   *nn.GPTStep
	bufs   []*tensor.Tensor
	// dp is the data-parallel part (nil: a process alone, gradients of
	// the model's own).
	dp *lmDP
}

func (l *lm) free() {
	for _, s := range []*nn.GPTStep{l.train, l.eval} {
		if s != nil {
			s.Free()
		}
	}
	if l.dp != nil {
		l.dp.free()
	}
	if l.opt != nil {
		l.opt.Free()
	}
	if l.m != nil {
		l.m.Free()
	}
	for _, t := range l.bufs {
		t.Buf.Free()
	}
}

// newLM builds the model and its evaluation graph, and for training
// (training true) the gradients, the optimizer and the training graph.
func newLM(e *ops.Engine, a device.Allocator, run string, cfg LMConfig, prec ops.Precision, training bool) (l *lm, err error) {
	return newLMWith(e, a, run, cfg, prec, training, "", nil)
}

// newLMWith is newLM with the optimizer in the service at socket (when
// not empty; a is then a pool client) and, with dp, as one rank of a
// data-parallel job: graphs of the rank's rows of each batch, gradients
// in bucket buffers that dp's reducer all-reduces during the backward.
func newLMWith(e *ops.Engine, a device.Allocator, run string, cfg LMConfig, prec ops.Precision, training bool, socket string,
	dp *dpConfig) (l *lm, err error) {
	l = &lm{cfg: cfg}
	batch, shard := cfg.Batch, 0
	if dp != nil {
		if batch, err = dp.localBatch(cfg.Batch); err != nil {
			return nil, err
		}
		shard = dp.comm.Rank()
	}
	a, book, mem, err := serviceAlloc(a, socket)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			l.free()
			l = nil
		}
	}()
	if l.m, err = nn.NewGPT(a, run, cfg.Model, training && dp == nil, cfg.Seed); err != nil {
		return l, fmt.Errorf("building the model: %w", err)
	}
	if training && dp != nil {
		if l.dp, err = newLMDP(a, run, l.m, dp); err != nil {
			return l, err
		}
	}
	cast := tensor.F32
	if prec == ops.PrecBF16 && e.IsGraphCapable() {
		cast = tensor.BF16
	}
	if l.eval, err = l.m.Record(e, a, join(run, "eval"), batch, ops.GraphOptions{Autocast: cast}, false); err != nil {
		return l, fmt.Errorf("recording the evaluation step: %w", err)
	}
	if !training {
		return l, nil
	}
	alloc1 := func(name string) (*tensor.Tensor, error) {
		t, err := tensor.Alloc(a, join(run, name), tensor.F32, 1)
		if err == nil {
			l.bufs = append(l.bufs, t)
		}
		return t, err
	}
	if l.lr, err = alloc1("acts/lr_scale"); err != nil {
		return l, err
	}
	noDecay := make([]bool, len(l.m.Params()))
	for i, p := range l.m.Params() {
		noDecay[i] = p.Value.Rank() < 2 // biases and norm weights (nanoGPT's optim groups)
		l.grads = append(l.grads, p.Grad)
	}
	var counter *tensor.Tensor
	if cfg.Clip > 0 {
		if l.norm, err = alloc1("acts/grad_norm"); err != nil {
			return l, err
		}
	}
	if name := cfg.optimName(); name == "adamw" && socket == "" {
		ac := ops.AdamWConfig{LR: cfg.LR, Beta1: cfg.Beta1, Beta2: cfg.Beta2, Eps: 1e-8, WeightDecay: cfg.WeightDecay,
			LRScale: l.lr, NoDecay: noDecay}
		if cfg.Clip > 0 {
			// Clipping fused into AdamW: the coefficient scales each gradient
			// as AdamW reads it (ops.Engine.ClipCoef; same results as
			// clipping first, one pass over the gradients fewer).
			if l.coef, err = alloc1("acts/clip_coef"); err != nil {
				return l, err
			}
			ac.GradScale = l.coef
		}
		adam, err := optim.NewAdamW(a, run, l.m.Params(), ac)
		if err != nil {
			return l, fmt.Errorf("building the optimizer: %w", err)
		}
		l.opt, counter = adam, adam.Counter()
	} else {
		if name == "kfac" && socket != "" {
			return l, fmt.Errorf("%w: --optim kfac runs in process for a GPT (the service cannot hook its graph's Linear layers)", ErrConfig)
		}
		spec, err := cfg.Precond.spec(name, cfg.LR, cfg.WeightDecay, 0.9, cfg.Beta1, cfg.Beta2)
		if err != nil {
			return l, err
		}
		if l.set, err = buildOptimizer(e, a, run, l.m.Params(), nil, spec, socket, book, mem, l.lr); err != nil {
			return l, err
		}
		l.opt, counter, l.hook = l.set.Optimizer, l.set.counter, name == "kfac"
		// AdamW and Muon follow the schedule through the device scale (in
		// a captured step too); the others take it from the host each step.
		l.hostLR = !l.set.scaled
		if counter == nil && cfg.Model.Dropout > 0 {
			return l, fmt.Errorf("%w: dropout needs an optimizer with a step counter (--optim %s has none)", ErrConfig, name)
		}
	}
	gopts := ops.GraphOptions{Autocast: cast, Train: cfg.Model.Dropout > 0, Seed: cfg.Seed, Counter: counter, Shard: shard}
	if l.hook {
		gopts.OnLinear = l.set.Optimizer.(*optim.KFAC).OnLinear(e)
	}
	if l.train, err = l.m.Record(e, a, run, batch, gopts, true); err != nil {
		return l, fmt.Errorf("recording the training step: %w", err)
	}
	if l.dp != nil {
		if err := l.dp.attach(e, a, run, l.m, l.train.Graph); err != nil {
			return l, err
		}
	}
	return l, nil
}

// compute queues one training step on the batch in the train graph's
// inputs: forward, loss, backward, clipping, AdamW.
func (l *lm) compute(e *ops.Engine, gt *trace.GPUTimer) error {
	g := l.train.Graph
	return runPhases(gt, []namedPhase{
		{spanForward, g.Forward},
		{spanBackward, g.Backward},
		{spanReduce, func() error {
			if l.dp == nil {
				return nil
			}
			return l.dp.red.Wait() // the last buckets, then the join: clipping and AdamW see averaged gradients
		}},
		{spanClip, func() error {
			switch {
			case l.norm == nil:
				return nil
			case l.coef != nil:
				return e.ClipCoef(l.grads, l.cfg.Clip, l.norm, l.coef)
			}
			return e.ClipGradNorm(l.grads, l.cfg.Clip, l.norm)
		}},
		{spanOptimizer, func() error {
			if l.set != nil && l.set.eager {
				return nil // stepped by the runner after the (captured) step
			}
			return l.opt.Step(e)
		}},
	})
}

// save writes the checkpoint (state dict, optimizer state, metadata).
func (l *lm) save(path string, tok *data.CharTokenizer, step int) error {
	return saveLM(path, l.cfg, tok, l.m, l.opt.State(), step)
}

// load reads the parameters (and, when training, the optimizer state)
// from f.
func (l *lm) load(f *ckpt.File) error {
	for _, p := range l.m.Params() {
		if err := f.Load(p.Name, p.Value); err != nil {
			return fmt.Errorf("%w: %v", ErrCheckpoint, err)
		}
	}
	if l.opt == nil {
		return nil
	}
	for _, s := range l.opt.State() {
		if err := f.Load(optimPrefix+s.Name, s.Value); err != nil {
			return fmt.Errorf("%w: %v", ErrCheckpoint, err)
		}
	}
	return nil
}

// evaluator runs the evaluation graph over the fixed validation batches
// (in a data-parallel run, over this rank's rows of each).
type evaluator struct {
	l   *lm
	sum *tensor.Tensor // [1] f32: the batches' losses added on the device
	r   *stepRunner
	xs  [][]int32 // the batches, drawn once
	ys  [][]int32
}

func newEvaluator(e *ops.Engine, l *lm, val []int32, graph bool) (*evaluator, error) {
	c := l.cfg
	ev := &evaluator{l: l}
	b, first := c.Batch, 0
	if l.dp != nil {
		n := l.dp.comm.Size()
		b = c.Batch / n
		first = l.dp.comm.Rank() * b
	}
	n := b * c.Model.Block
	for k := 0; k < c.EvalBatches; k++ {
		x, y := make([]int32, n), make([]int32, n)
		if err := data.BlockRows(val, x, y, c.Batch, c.Model.Block, c.Seed^evalSeed, uint64(k), first, b); err != nil {
			return nil, fmt.Errorf("validation batches: %w", err)
		}
		ev.xs, ev.ys = append(ev.xs, x), append(ev.ys, y)
	}
	// The batches' losses add up on the device (one read per evaluation,
	// so staging the next batch overlaps the device's work).
	var err error
	if ev.sum, err = tensor.Alloc(l.eval.Graph.Tape().Allocator(), "", tensor.F32, 1); err != nil {
		return nil, err
	}
	ev.r, err = newStepRunner(e, []*tensor.Tensor{l.eval.Idx, l.eval.Targets},
		func(*trace.GPUTimer) error {
			if err := l.eval.Graph.Forward(); err != nil {
				return err
			}
			return e.Scale(ev.sum, l.eval.Loss, 1, true)
		}, graph)
	if err != nil {
		ev.sum.Buf.Free()
	}
	return ev, err
}

// close frees the evaluator's runner and accumulator.
func (ev *evaluator) close() error {
	err := ev.r.close()
	ev.sum.Buf.Free()
	return err
}

// loss is the mean validation loss (averaged across ranks: every rank
// calls it at the same step).
func (ev *evaluator) loss() (float64, error) {
	sp := trace.Default().Begin(traceCat, spanEvaluate)
	defer sp.End()
	if err := ev.r.e.Fill(ev.sum, 0); err != nil {
		return 0, err
	}
	for k := range ev.xs {
		b, err := ev.r.stage()
		if err != nil {
			return 0, err
		}
		copy(tensor.BytesAs[int32](ev.r.view(b, 0)), ev.xs[k])
		copy(tensor.BytesAs[int32](ev.r.view(b, 1)), ev.ys[k])
		if err := ev.r.run(); err != nil {
			return 0, err
		}
	}
	if dp := ev.l.dp; dp != nil {
		if err := dp.comm.AllReduce(ev.r.e, ev.sum, ev.sum, nccl.Avg); err != nil {
			return 0, fmt.Errorf("averaging the validation loss across ranks: %w", err)
		}
	}
	v, err := ev.sum.ReadF32() // waits for the device
	if err != nil {
		return 0, err
	}
	return float64(v[0]) / float64(len(ev.xs)), nil
}

// RunLM trains a GPT on o.Corpus. It stops after the step during which
// ctx is cancelled (with several ranks: at the next loss line, where the
// ranks agree on it), writing a checkpoint that RunLM with o.Resume
// continues from with the same losses.
//
// With o.World of several ranks every rank calls RunLM with the same
// configuration (see dataparallel.go): the ranks meet through
// dist.Rendezvous and NCCL, rank 0's parameters and optimizer state are
// broadcast (after o.Resume loads them on every rank), and only rank 0
// writes to o.Out, o.Stdout, o.Log and o.Progress; the loss lines carry
// the loss averaged across ranks, tokens/s of the whole job and MFU per
// GPU.
func RunLM(ctx context.Context, cfg LMConfig, o LMOptions) (res LMResult, err error) {
	res = LMResult{ValLoss: math.NaN()}
	start := time.Now()
	cfg.Model.Vocab = o.Corpus.Tok.Vocab()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	if o.LogEvery < 1 {
		return res, fmt.Errorf("%w: --log-every %d (want ≥ 1)", ErrConfig, o.LogEvery)
	}
	if o.GradComm != 0 && o.GradComm != tensor.F32 && o.GradComm != tensor.BF16 {
		return res, fmt.Errorf("%w: --grad-comm %v (want f32 or bf16)", ErrConfig, o.GradComm)
	}
	for _, part := range [][]int32{o.Corpus.Train, o.Corpus.Val} {
		if len(part) <= cfg.Model.Block {
			return res, fmt.Errorf("%w: the text's %d training and %d validation tokens must each exceed --block %d",
				ErrConfig, len(o.Corpus.Train), len(o.Corpus.Val), cfg.Model.Block)
		}
	}
	w := o.World
	if w.Size == 0 {
		w = dist.Single()
	}
	if cfg.Batch%w.Size != 0 {
		return res, fmt.Errorf("%w: --batch %d does not divide by the world size %d (each rank takes --batch/%d rows of every global batch)",
			ErrConfig, cfg.Batch, w.Size, w.Size)
	}
	main := w.IsMain()
	if !main {
		o.Stdout, o.Log, o.Progress = io.Discard, nil, nil
	}
	if w.Distributed() && o.OptimizerSocket != "" {
		return res, fmt.Errorf("%w: --optimizer-socket with %d ranks: the optimizer service is not built for data-parallel runs", ErrConfig, w.Size)
	}
	if name := cfg.optimName(); w.Distributed() && name != "adamw" {
		return res, fmt.Errorf("%w: --optim %s with %d ranks: data-parallel runs use adamw", ErrConfig, name, w.Size)
	}
	if main {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return res, fmt.Errorf("train: %w", err)
		}
	}
	eng, err := ops.NewEngine(o.Alloc.Device(), ops.Options{Precision: o.Precision})
	if err != nil {
		return res, err
	}
	defer closeEngine(eng)
	var dpc *dpConfig
	if o.comm != nil {
		dpc = &dpConfig{comm: o.comm, bucket: bucketConfig(o.BucketBytes), gradComm: o.GradComm}
	} else if w.Distributed() || o.buckets {
		comm, err := nccl.Connect(ctx, eng, &dist.Rendezvous{World: w, Logf: func(format string, args ...any) {
			if o.Log != nil {
				fmt.Fprintf(o.Log, "trainer: "+format+"\n", args...)
			}
		}})
		if err != nil {
			return res, err
		}
		// A failed rank leaves its peers mid-collective: abort rather
		// than wait for them (ncclCommAbort; Close waits for queued work).
		defer func() {
			if err != nil {
				comm.Abort()
			} else if cerr := comm.Close(); cerr != nil {
				err = cerr
			}
		}()
		dpc = &dpConfig{comm: comm, bucket: bucketConfig(o.BucketBytes), gradComm: o.GradComm}
	}
	l, err := newLMWith(eng, o.Alloc, o.Run, cfg, o.Precision, true, o.OptimizerSocket, dpc)
	if err != nil {
		return res, err
	}
	defer l.free()
	step := 0
	if o.Resume != nil {
		if err := l.load(o.Resume); err != nil {
			return res, err
		}
		step = o.Step
	}
	if l.dp != nil {
		// Rank 0's weights and optimizer state everywhere (the initial
		// ones, or the checkpoint's), as DDP's constructor broadcasts the
		// module's state from rank 0.
		var ts []*tensor.Tensor
		for _, p := range l.m.Params() {
			ts = append(ts, p.Value)
		}
		for _, s := range l.opt.State() {
			ts = append(ts, s.Value)
		}
		if err := l.dp.comm.BroadcastAll(eng, ts, 0); err != nil {
			return res, fmt.Errorf("broadcasting the parameters from rank 0: %w", err)
		}
	}
	var ml *metricsLog // nil on ranks other than 0: they write no metrics
	if main {
		if ml, err = openMetrics(o.Out, o.Resume != nil, o.Stdout); err != nil {
			return res, err
		}
		defer ml.close()
	}
	emit := ml.emit
	save := func(step int) error {
		if !main {
			return nil
		}
		sp := trace.Default().Begin(traceCat, spanCheckpoint)
		defer sp.End()
		return l.save(filepath.Join(o.Out, ModelFile), o.Corpus.Tok, step)
	}
	// K-FAC's hook decides on the host, in the backward, whether factors
	// are due: its steps are not replayed from a graph.
	inputs := []*tensor.Tensor{l.train.Idx, l.train.Targets, l.lr}
	distributed := l.dp != nil && w.Distributed()
	if distributed {
		inputs = append(inputs, l.dp.stop)
	}
	r, err := newStepRunner(eng, inputs, func(gt *trace.GPUTimer) error { return l.compute(eng, gt) }, o.Graph && !l.hook)
	if err != nil {
		return res, err
	}
	defer r.close()
	if l.set != nil && l.set.eager {
		r.post = func(gt *trace.GPUTimer) error { return eagerStep(eng, l.set, gt) }
	}
	ev, err := newEvaluator(eng, l, o.Corpus.Val, o.Graph)
	if err != nil {
		return res, err
	}
	defer ev.close()
	evaluate := func(step int) error {
		v, err := ev.loss()
		if err != nil {
			return err
		}
		res.ValLoss = v
		line := LMEvalLine{Step: step, ValLoss: round(v, 4), Elapsed: round(time.Since(start).Seconds(), 2)}
		if l.set != nil {
			line.Roots = rootsLine(l.set.Optimizer)
		}
		return emit(line)
	}
	finish := func(step int) error {
		if !main {
			return nil
		}
		if err := save(step); err != nil {
			return err
		}
		return Plot(filepath.Join(o.Out, MetricsFile), filepath.Join(o.Out, PlotFile))
	}
	local := cfg.Batch / w.Size
	if o.Log != nil {
		how := "f32 (the host computes every precision in f32)"
		if eng.IsGraphCapable() {
			how = fmt.Sprintf("%s, CUDA graph %s", precisionName(o.Precision), map[bool]string{true: "on", false: "off"}[o.Graph])
		}
		fmt.Fprintf(o.Log, "trainer: GPT of %.2fM parameters (%d layers, %d heads, d %d, block %d, vocabulary %d) on %v: %s\n",
			float64(l.m.NumParams(true))/1e6, cfg.Model.Layers, cfg.Model.Heads, cfg.Model.DModel, cfg.Model.Block,
			cfg.Model.Vocab, o.Alloc.Device(), how)
		if distributed {
			v, _ := nccl.LibraryVersion()
			fmt.Fprintf(o.Log, "trainer: data parallel over %d ranks on %d node(s) (NCCL %v): %d sequences per rank of each global batch of %d; gradients in %d bucket(s) of ≤ %g MiB (first %g MiB), averaged during the backward%s\n",
				w.Size, w.Nodes, v, local, cfg.Batch, len(l.dp.layout.Buckets), bucketMiB(dpc.bucket.Bytes), bucketMiB(dpc.bucket.FirstBytes),
				gradCommNote(o.GradComm))
		} else if o.GradComm == tensor.BF16 {
			fmt.Fprintf(o.Log, "trainer: --grad-comm bf16 ignored: one process communicates no gradients\n")
		}
	}
	peak, havePeak := ops.PeakFLOPS(o.Alloc.Device(), o.Precision)
	flops := l.m.FLOPsPerToken(cfg.Model.Block) * float64(local*cfg.Model.Block) // this GPU's share
	bar := newProgress(o.Progress, 0, cfg.Steps)
	tk := trace.Default().Main()
	last, lastStep := time.Now(), step
	var lastLoss float32
	n := local * cfg.Model.Block
	first := w.Rank * local
	for ; step < cfg.Steps; step++ {
		sp := tk.Begin(traceCat, spanStep)
		sp.Arg(trace.Int(argStep, int64(step+1)))
		dp := tk.Begin(traceCat, spanData)
		b, err := r.stage()
		if err != nil {
			return res, err
		}
		x, y := tensor.BytesAs[int32](r.view(b, 0)), tensor.BytesAs[int32](r.view(b, 1))
		if err := data.BlockRows(o.Corpus.Train, x[:n], y[:n], cfg.Batch, cfg.Model.Block, cfg.Seed, uint64(step), first, local); err != nil {
			return res, err
		}
		lr := cfg.LRAt(step)
		tensor.BytesAs[float32](r.view(b, 2))[0] = lr / cfg.LR
		if distributed {
			stop := float32(0)
			if ctx.Err() != nil {
				stop = 1
			}
			tensor.BytesAs[float32](r.view(b, 3))[0] = stop
		}
		if l.hostLR {
			l.opt.SetLR(lr) // a host value: these optimizers take no device scale
		}
		dp.End()
		if err := r.run(); err != nil {
			return res, fmt.Errorf("step %d: %w", step+1, err)
		}
		done := step + 1
		stopAll := false // every rank agrees to stop here
		if done%o.LogEvery == 0 || done == cfg.Steps {
			lp := tk.Begin(traceCat, spanLog)
			lossT := l.train.Loss
			if distributed {
				// The loss of the whole global batch (the mean of equal
				// shards' means) and whether any rank was signalled.
				err := l.dp.comm.Group(eng, func() error {
					if err := l.dp.comm.AllReduce(eng, l.dp.lossAvg, l.train.Loss, nccl.Avg); err != nil {
						return err
					}
					return l.dp.comm.AllReduce(eng, l.dp.stopAll, l.dp.stop, nccl.Max)
				})
				if err != nil {
					return res, fmt.Errorf("step %d: averaging the loss across ranks: %w", done, err)
				}
				lossT = l.dp.lossAvg
			}
			v, err := lossT.ReadF32()
			if err != nil {
				return res, err
			}
			if distributed {
				s, err := l.dp.stopAll.ReadF32()
				if err != nil {
					return res, err
				}
				stopAll = s[0] > 0
			}
			lastLoss = v[0]
			now := time.Now()
			k := done - lastStep
			dt := now.Sub(last).Seconds()
			line := LMStepLine{Step: done, Loss: v[0], LR: lr, TokensPerS: round(float64(k*n*w.Size)/dt, 1),
				StepMS: round(dt*1000/float64(k), 3)}
			if havePeak {
				u := roundSig(flops*float64(k)/dt/peak, 3)
				line.MFU = &u
			}
			if l.norm != nil {
				g, err := l.norm.ReadF32()
				if err != nil {
					return res, err
				}
				line.GradNorm = &g[0]
			}
			if err := emit(line); err != nil {
				return res, err
			}
			lp.End()
			last, lastStep = now, done
		}
		sp.End()
		bar.update(0, done, lastLoss)
		if done%cfg.EvalEvery == 0 || done == cfg.Steps {
			if err := evaluate(done); err != nil {
				return res, err
			}
			if err := save(done); err != nil {
				return res, err
			}
			last = time.Now() // evaluation is not training time
		}
		stopping := ctx.Err() != nil
		if distributed {
			stopping = stopAll
		}
		if stopping && done < cfg.Steps {
			bar.done()
			res.Step, res.Interrupted, res.Elapsed = done, true, time.Since(start)
			return res, finish(done)
		}
	}
	bar.done()
	res.Step, res.Elapsed = step, time.Since(start)
	return res, finish(step)
}

// gradCommNote is the data-parallel log line's word on the gradients'
// communication dtype.
func gradCommNote(dt tensor.DType) string {
	if dt == tensor.BF16 {
		return " in bf16 (cast from and back to the f32 gradients)"
	}
	return " in f32"
}

// bucketMiB is a bucket limit in MiB, for messages.
func bucketMiB(b int64) float64 { return float64(b) / (1 << 20) }

// EvalLM loads a language model's checkpoint and returns its mean loss
// over cfg.EvalBatches fixed validation batches of corpus (the same
// batches a run's val_loss lines use).
func EvalLM(a device.Allocator, prec ops.Precision, f *ckpt.File, cfg LMConfig, corpus *data.Corpus) (float64, error) {
	eng, err := ops.NewEngine(a.Device(), ops.Options{Precision: prec})
	if err != nil {
		return 0, err
	}
	defer closeEngine(eng)
	l, err := newLM(eng, a, "", cfg, prec, false)
	if err != nil {
		return 0, err
	}
	defer l.free()
	if err := l.load(f); err != nil {
		return 0, err
	}
	ev, err := newEvaluator(eng, l, corpus.Val, false)
	if err != nil {
		return 0, err
	}
	defer ev.close()
	return ev.loss()
}
