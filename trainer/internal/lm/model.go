package lm

import (
	"context"
	"fmt"
	"strings"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
	"gpukit/libgpu/zero"
	"gpukit/trainer/internal/driver"
)

// Checkpoint layout: the state dict of nanoGPT's GPT module (its names:
// transformer.wte.weight, ..., lm_head.weight, tied to the embedding) in
// model.safetensors; the state file adds the optimizer's state under
// "optim/". Metadata config (JSON Config), tokenizer (JSON
// data.CharTokenizer) and seed.
const (
	optimPrefix = "optim/"
	metaTok     = "tokenizer"
)

// evalSeed separates the validation batches' draws from the training ones.
const evalSeed = 0x6576616c // "eval"

// lm is a GPT, its optimizer and its recorded training and evaluation
// steps on one engine.
type lm struct {
	cfg Config
	m   *nn.GPT
	opt optim.Optimizer
	// z is AdamW with its state split across the ranks (--shard-optimizer,
	// ZeRO-1; opt is then nil), and gathered its whole state, assembled
	// on rank 0 for the next checkpoint (GatherState), in alloc's memory.
	z        *zero.AdamW
	gathered []nn.Param
	alloc    device.Allocator
	// set is a non-AdamW optimizer (cfg.Optim); an eager one steps after
	// the graph. hostLR: its learning rate is set from the host each step
	// (else it reads the device's scale, l.lr, as AdamW does).
	set    *driver.OptimizerSet
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
	// the model's own); local is the rows of each batch this rank runs.
	dp    *driver.GradBuckets
	local int
}

func (l *lm) free() {
	for _, s := range []*nn.GPTStep{l.train, l.eval} {
		if s != nil {
			s.Free()
		}
	}
	if l.z != nil {
		l.z.Free()
	}
	l.freeGathered()
	if l.dp != nil {
		l.dp.Free()
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
func newLM(e *ops.Engine, a device.Allocator, run string, cfg Config, prec ops.Precision, training bool) (l *lm, err error) {
	return newLMWith(e, a, run, cfg, prec, training, "", nil)
}

// newLMWith is newLM with the optimizer in the service at socket (when
// not empty; a is then a pool client) and, with dp, as one rank of a
// data-parallel job: graphs of the rank's rows of each batch, gradients
// in bucket buffers that dp's reducer all-reduces during the backward.
func newLMWith(e *ops.Engine, a device.Allocator, run string, cfg Config, prec ops.Precision, training bool, socket string,
	dp *driver.DP) (l *lm, err error) {
	l = &lm{cfg: cfg}
	batch, shard := cfg.Batch, 0
	if dp != nil {
		if batch, err = dp.LocalBatch(cfg.Batch); err != nil {
			return nil, err
		}
		shard = dp.Comm.Rank()
	}
	l.local = batch
	a, book, mem, err := driver.ServiceAlloc(a, socket)
	if err != nil {
		return nil, err
	}
	l.alloc = a
	if training && dp != nil && dp.Shard && cfg.optimName() != "adamw" {
		return nil, driver.Configf("--shard-optimizer splits AdamW's state (not --optim %s's)", cfg.optimName())
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
		// Before any graph is recorded: with dp.Shard the parameters move
		// into bucket storage (the graphs must read them there).
		if l.dp, err = driver.NewGradBuckets(a, run, l.m.Params(), l.m.SetParams, l.m.SetGrads, dp); err != nil {
			return l, err
		}
	}
	cast := tensor.F32
	if prec == ops.PrecBF16 && e.IsGraphCapable() {
		cast = tensor.BF16
	}
	if l.eval, err = l.m.Record(e, a, driver.Join(run, "eval"), batch, ops.GraphOptions{Autocast: cast}, false); err != nil {
		return l, fmt.Errorf("recording the evaluation step: %w", err)
	}
	if !training {
		return l, nil
	}
	alloc1 := func(name string) (*tensor.Tensor, error) {
		t, err := tensor.Alloc(a, driver.Join(run, name), tensor.F32, 1)
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
		noDecay[i] = !Decayed(p)
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
		if l.dp != nil && l.dp.Sharded() {
			// ZeRO-1: this rank's parts of the moments; ClipCoef takes the
			// global norm across the ranks.
			if l.z, err = l.dp.NewAdamW(a, run, ac); err != nil {
				return l, err
			}
			counter = l.z.Counter()
		} else {
			adam, err := optim.NewAdamW(a, run, l.m.Params(), ac)
			if err != nil {
				return l, fmt.Errorf("building the optimizer: %w", err)
			}
			l.opt, counter = adam, adam.Counter()
		}
	} else {
		if name == "kfac" && socket != "" {
			return l, driver.Configf("--optim kfac runs in process for a GPT (the service cannot hook its graph's Linear layers)")
		}
		spec, err := cfg.Precond.Spec(name, cfg.LR, cfg.WeightDecay, 0.9, cfg.Beta1, cfg.Beta2)
		if err != nil {
			return l, err
		}
		if l.set, err = driver.BuildOptimizer(e, a, run, l.m.Params(), nil, spec, socket, book, mem, l.lr, dp); err != nil {
			return l, err
		}
		l.opt, counter, l.hook = l.set.Optimizer, l.set.Counter, name == "kfac"
		// AdamW, Muon, Shampoo and SOAP follow the schedule through the
		// device scale (in a captured step too); the others take it from
		// the host each step.
		l.hostLR = !l.set.Scaled
		if counter == nil && cfg.Model.Dropout > 0 {
			return l, driver.Configf("dropout needs an optimizer with a step counter (--optim %s has none)", name)
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
		if err := l.dp.Attach(e, a, run, l.m.Params(), l.train.Graph.Tape()); err != nil {
			return l, err
		}
	}
	return l, nil
}

// Decayed reports whether AdamW decays p: weights of rank ≥ 2 but biases
// (nanoGPT's optimizer groups, where every bias and norm weight has rank
// 1; a Mixture-of-Experts layer's stacked expert biases, [E, W], are
// biases too, as in bench/reference/moe.py's groups).
func Decayed(p nn.Param) bool {
	return p.Value.Rank() >= 2 && !strings.HasSuffix(p.Name, "bias")
}

// compute queues one training step on the batch in the train graph's
// inputs: forward, loss, backward, the data-parallel join, clipping and
// the optimizer.
func (l *lm) compute(e *ops.Engine, gt *trace.GPUTimer) error {
	g := l.train.Graph
	return driver.RunPhases(gt, []driver.NamedPhase{
		{Name: driver.SpanForward, F: g.Forward},
		{Name: driver.SpanBackward, F: g.Backward},
		{Name: driver.SpanReduce, F: func() error {
			if l.dp == nil {
				return nil
			}
			return l.dp.Wait() // the last buckets, then the join: clipping and AdamW see averaged gradients
		}},
		{Name: driver.SpanClip, F: func() error {
			switch {
			case l.norm == nil:
				return nil
			case l.z != nil:
				return l.z.ClipCoef(e, l.cfg.Clip, l.norm, l.coef) // the global norm: each rank's parts, all-reduced
			case l.coef != nil:
				return e.ClipCoef(l.grads, l.cfg.Clip, l.norm, l.coef)
			}
			return e.ClipGradNorm(l.grads, l.cfg.Clip, l.norm)
		}},
		{Name: driver.SpanOptimizer, F: func() error {
			switch {
			case l.z != nil:
				return l.z.Step(e) // this rank's parts, then the parameters' all-gather
			case l.set != nil && l.set.Eager:
				return nil // stepped after the (captured) step: PostStep
			}
			return l.opt.Step(e)
		}},
	})
}

// checkpoint is the state dict (Model) and the optimizer state (State,
// under optim/) with the tokenizer and seed.
func (l *lm) checkpoint(tok *data.CharTokenizer) (driver.Checkpoint, error) {
	var ck driver.Checkpoint
	var sd []ckpt.Named
	for _, p := range l.m.StateDict() {
		sd = append(sd, ckpt.Named{Name: p.Name, T: p.Value})
	}
	var err error
	if ck.Model, err = driver.Entries("", sd); err != nil {
		return ck, err
	}
	var state []nn.Param
	switch {
	case l.z != nil:
		// The whole state, as optim.AdamW names it (gather first).
		if l.gathered == nil {
			return ck, fmt.Errorf("trainer: the sharded optimizer state was not gathered for this checkpoint")
		}
		defer l.freeGathered()
		state = l.gathered
	case l.opt != nil:
		state = l.opt.State()
	}
	if state != nil {
		var st []ckpt.Named
		for _, s := range state {
			st = append(st, ckpt.Named{Name: s.Name, T: s.Value})
		}
		if ck.State, err = driver.Entries(optimPrefix, st); err != nil {
			return ck, err
		}
	}
	ck.Meta, err = modelMeta(l.cfg, tok)
	return ck, err
}

// gatherState assembles the sharded optimizer's whole state on rank 0
// for the next checkpoint (a collective: every rank calls it; a no-op
// without sharding).
func (l *lm) gatherState(e *ops.Engine) error {
	if l.z == nil {
		return nil
	}
	l.freeGathered()
	st, err := l.z.GatherState(e, l.alloc, 0)
	if err != nil {
		return err
	}
	l.gathered = st
	return nil
}

func (l *lm) freeGathered() {
	for _, s := range l.gathered {
		s.Value.Buf.Free()
	}
	l.gathered = nil
}

// load reads the parameters (and, when training, the optimizer state)
// from f.
func (l *lm) load(f *ckpt.File) error {
	for _, p := range l.m.Params() {
		if err := f.Load(p.Name, p.Value); err != nil {
			return fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
	}
	if l.z != nil {
		// Whole tensors of any world size, sharded or not: this rank's
		// parts (every rank loads; nothing of the state is broadcast).
		err := l.z.LoadState(func(n string, t *tensor.Tensor) error { return f.Load(optimPrefix+n, t) })
		if err != nil {
			return fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
		return nil
	}
	if l.opt == nil {
		return nil
	}
	for _, s := range l.opt.State() {
		if err := f.Load(optimPrefix+s.Name, s.Value); err != nil {
			return fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
	}
	return nil
}

// evaluator runs the evaluation graph over the fixed validation batches
// (in a data-parallel run, over this rank's rows of each).
type evaluator struct {
	l    *lm
	comm driver.Collective // data-parallel: the batches' mean is averaged across ranks
	sum  *tensor.Tensor    // [1] f32: the batches' losses added on the device
	r    *driver.Runner
	xs   [][]int32 // the batches, drawn once
	ys   [][]int32
}

func newEvaluator(e *ops.Engine, l *lm, val []int32, graph bool, dp *driver.DP) (*evaluator, error) {
	c := l.cfg
	ev := &evaluator{l: l}
	b, first := c.Batch, 0
	if dp != nil {
		n := dp.Comm.Size()
		b = c.Batch / n
		first = dp.Comm.Rank() * b
		ev.comm = dp.Comm
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
	ev.r, err = driver.NewRunner(e, []*tensor.Tensor{l.eval.Idx, l.eval.Targets},
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
	err := ev.r.Close()
	ev.sum.Buf.Free()
	return err
}

// loss is the mean validation loss (averaged across ranks: every rank
// calls it at the same step). A process alone stops between batches when
// ctx is cancelled and returns its error; ranks of a data-parallel run
// finish (their all-reduce must meet).
func (ev *evaluator) loss(ctx context.Context) (float64, error) {
	e := ev.r.Engine()
	if err := e.Fill(ev.sum, 0); err != nil {
		return 0, err
	}
	for k := range ev.xs {
		if ev.comm == nil && ctx.Err() != nil {
			return 0, ctx.Err()
		}
		b, err := ev.r.Stage()
		if err != nil {
			return 0, err
		}
		copy(tensor.BytesAs[int32](ev.r.View(b, 0)), ev.xs[k])
		copy(tensor.BytesAs[int32](ev.r.View(b, 1)), ev.ys[k])
		if err := ev.r.Run(); err != nil {
			return 0, err
		}
	}
	if ev.comm != nil {
		if err := ev.comm.AllReduce(e, ev.sum, ev.sum, nccl.Avg); err != nil {
			return 0, fmt.Errorf("averaging the validation loss across ranks: %w", err)
		}
	}
	v, err := ev.sum.ReadF32() // waits for the device
	if err != nil {
		return 0, err
	}
	return float64(v[0]) / float64(len(ev.xs)), nil
}
