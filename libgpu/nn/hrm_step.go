package nn

import (
	"errors"
	"fmt"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// hrmInner is HRM's recurrent core at batch B without gradients: the
// states zH and zL [B, T, C] that the cycles update in place, the input
// embedding x of the tokens, and three forward-only graphs over them — the
// embedding, one L update (zL ← L(zL, zH + x)) and one H update (zH ←
// H(zH, zL)) — whose activations are reused by every cycle, so the
// gradient-free part of a segment takes constant memory however many
// cycles run. The heads (lm_head, q_head) are plain GEMMs on zH.
type hrmInner struct {
	m             *HRM
	e             *ops.Engine
	dt            tensor.DType
	B             int
	tokens        *tensor.Tensor // i32 [B, T]
	zH, zL        *tensor.Tensor // dt [B, T, C]
	x             *tensor.Tensor // dt [B, T, C]: the embed graph's output
	embed, lg, hg *ops.Graph
	lOut, hOut    *tensor.Tensor
	qW, qB, lmW   *tensor.Tensor // compute weights of the heads
	owned         owned
}

func newHRMInner(m *HRM, e *ops.Engine, a device.Allocator, prefix string, B int, dt tensor.DType) (in *hrmInner, err error) {
	if B < 1 {
		return nil, fmt.Errorf("%w: batch %d", ErrHRMConfig, B)
	}
	if err := m.computeWeights(dt); err != nil {
		return nil, err
	}
	c := m.cfg
	T, C := c.Positions(), c.Hidden
	in = &hrmInner{m: m, e: e, dt: dt, B: B, owned: owned{a: a, prefix: prefix}}
	defer func() {
		if err != nil {
			in.free()
			in = nil
		}
	}()
	if in.tokens, err = in.owned.alloc("acts", "tokens", tensor.I32, B, T); err != nil {
		return in, err
	}
	if in.zH, err = in.owned.alloc("acts", "z_H", dt, B, T, C); err != nil {
		return in, err
	}
	if in.zL, err = in.owned.alloc("acts", "z_L", dt, B, T, C); err != nil {
		return in, err
	}
	for _, h := range []struct {
		dst  **tensor.Tensor
		name string
	}{{&in.qW, "inner.q_head.weight"}, {&in.qB, "inner.q_head.bias"}, {&in.lmW, "inner.lm_head.weight"}} {
		if *h.dst, err = m.weight(h.name, dt); err != nil {
			return in, err
		}
	}
	opts := ops.GraphOptions{Autocast: dt}
	table, _, err := m.table()
	if err != nil {
		return in, err
	}
	in.embed = ops.NewGraph(e, a, prefix+"/embed", opts)
	x := m.recordEmbed(in.embed, in.embed.Input("table", table), in.embed.Input("tokens", in.tokens))
	if err := in.embed.Build(false); err != nil {
		return in, err
	}
	in.x = x.Value
	level := func(name string) (*ops.Graph, *tensor.Tensor, error) {
		g := ops.NewGraph(e, a, prefix+"/"+name, opts)
		ws := map[string]*ops.Var{}
		w := func(n string) *ops.Var {
			if v, ok := ws[n]; ok {
				return v
			}
			t, err := m.weight(n, dt)
			if err != nil {
				g.Fail("weight", err)
				return nil
			}
			ws[n] = g.Input(n, t)
			return ws[n]
		}
		zH, zL := g.Input("z_H", in.zH), g.Input("z_L", in.zL)
		var h *ops.Var
		if name == "L" {
			h = g.Add(zL, g.Add(zH, g.Input("x", in.x)))
		} else {
			h = g.Add(zH, zL)
		}
		out := m.recordLevel(g, name, h, w)
		if err := g.Build(false); err != nil {
			g.Free()
			return nil, nil, err
		}
		return g, out.Value, nil
	}
	if in.lg, in.lOut, err = level("L"); err != nil {
		return in, err
	}
	if in.hg, in.hOut, err = level("H"); err != nil {
		return in, err
	}
	return in, nil
}

// stepL queues zL ← L(zL, zH + x); stepH zH ← H(zH, zL).
func (in *hrmInner) stepL() error {
	if err := in.lg.Forward(); err != nil {
		return err
	}
	return in.e.Copy(in.zL, in.lOut)
}

func (in *hrmInner) stepH() error {
	if err := in.hg.Forward(); err != nil {
		return err
	}
	return in.e.Copy(in.zH, in.hOut)
}

// cycles queues a segment's updates in hrm.py's order (for each of the
// HCycles: LCycles L updates, then an H update); without full, the last L
// update and the last H update are left out (the training step runs those
// two with gradients: the one-step gradient approximation).
func (in *hrmInner) cycles(full bool) error {
	c := in.m.cfg
	for i := 0; i < c.HCycles; i++ {
		for j := 0; j < c.LCycles; j++ {
			if !full && i == c.HCycles-1 && j == c.LCycles-1 {
				continue
			}
			if err := in.stepL(); err != nil {
				return err
			}
		}
		if full || i != c.HCycles-1 {
			if err := in.stepH(); err != nil {
				return err
			}
		}
	}
	return nil
}

// qHead queues q = z_H[:, 0]·Wqᵀ + bq ([B, 2] in the compute dtype:
// q_halt, q_continue).
func (in *hrmInner) qHead(q *tensor.Tensor) error {
	rows, err := in.zH.Select(1, 0)
	if err != nil {
		return err
	}
	return in.e.Matmul(ops.Matmul{A: rows, B: in.qW, D: q, TransB: true, Bias: in.qB})
}

// lmHead queues logits = z_H·Wlmᵀ ([B, T, Vocab] in the compute dtype).
func (in *hrmInner) lmHead(logits *tensor.Tensor) error {
	c := in.m.cfg
	x, err := in.zH.View(in.B*c.Positions(), c.Hidden)
	if err != nil {
		return err
	}
	y, err := logits.View(in.B*c.Positions(), c.Vocab)
	if err != nil {
		return err
	}
	return in.e.Matmul(ops.Matmul{A: x, B: in.lmW, D: y, TransB: true})
}

func (in *hrmInner) free() error {
	var errs []error
	for _, g := range []*ops.Graph{in.embed, in.lg, in.hg} {
		if g != nil {
			errs = append(errs, g.Free())
		}
	}
	return errors.Join(append(errs, in.owned.free())...)
}

// Stepper is an update queued on an engine: optim.Optimizer's Step
// (optim.AdamATan2, optim.SignSGD), which a training step runs after its
// backward.
type Stepper interface {
	Step(e *ops.Engine) error
}

// HRMTrainConfig configures an HRM training step.
type HRMTrainConfig struct {
	Batch    int          // sequences per segment step
	Autocast tensor.DType // activations: tensor.F32 (or 0) or tensor.BF16 (f32 masters either way)
	// PoolSlots is the number of batches staged on the device ahead of the
	// steps that read them (0: 8).
	PoolSlots int
	// Warmup, TotalSteps and LRMinRatio are the learning-rate schedule
	// (ops.ACTSchedule: linear warmup, then cosine to LRMinRatio of the
	// rate; HRM's Sudoku run: 2000, the run's steps, 1 (no decay)).
	Warmup, TotalSteps int
	LRMinRatio         float64
	// Graph captures the step as a CUDA graph after its first, eager, run
	// and replays it (Run); ignored on the host backend.
	Graph bool
}

// HRMMetrics is a training step's line of bench/reference/hrm.py parity
// (pretrain.py's metrics): the losses over the batch, the rest over the
// sequences that halted after the step.
type HRMMetrics struct {
	Step                                   int     // 1-based step
	Loss, LMLoss                           float64 // (lm + ½(q_halt + q_continue)) / B, lm / B
	QHaltLoss, QContinueLoss               float64 // Σ BCE / B each
	Count                                  int     // sequences halted after the step
	Accuracy, ExactAccuracy, QHaltAccuracy float64
	Steps                                  float64 // mean segments of the halted sequences
	LRScale                                float64 // the step's learning-rate scale (ops.ACTSchedule)
}

// HRMTrain is an HRM's training segment step at a static batch (hrm.py's
// Trainer.step, sapientinc/HRM's train_batch): one call of Step queues,
// with no host synchronisation,
//
//  1. the learning-rate scale of the step (ops.ACTSchedule, LRScale) and
//     the bf16 compute copy of the weights;
//  2. the ACT refill (ops.ACTLoad): the slots that halted after the last
//     step take row b of the pool batch staged for this step and restart
//     from H_init, L_init (ops.ACTResetCarry); every slot's tokens and
//     targets;
//  3. the segment without gradients but for its last L and H updates
//     (the one-step gradient), then those two with gradients, the heads,
//     the stablemax cross-entropy of the cells, the ACT targets — halt ←
//     the sequence is exactly right, continue ← σ of the next segment's
//     max Q from a second forward of the new carry without gradients —
//     and the binary cross-entropies of the Q head (weight ½), each loss
//     divided by B;
//  4. the backward, the optimizers (SetOptimizers: AdamATan2 on
//     AdamParams, sign-SGD on SignParams, both reading LRScale), and
//     the ACT bookkeeping (ops.ACTHalt): steps, halting with the
//     exploration draws staged with the batch, the step's metrics, the
//     cursor.
//
// The carry (z_H, z_L) is kept detached between steps. Batches come from
// Stage, which copies them to the device ahead of the steps that read
// them (pinned staging, in order with the steps). The step can be captured
// (Run with Graph).
type HRMTrain struct {
	m   *HRM
	e   *ops.Engine
	cfg HRMTrainConfig
	in  *hrmInner
	g   *ops.Graph

	batch            ops.ACTBatch
	pool             ops.ACTPool
	targets          *tensor.Tensor // i32 [B, T]
	carryH, carryL   *tensor.Tensor // dt [B, T, C]
	hInit, lInit     *tensor.Tensor
	q, logits        *ops.Var
	lmLoss, qLoss    *tensor.Tensor
	qNext, qt        *tensor.Tensor
	pred             *tensor.Tensor
	correct, exact   *tensor.Tensor
	lrScale, metrics *tensor.Tensor
	opts             []Stepper

	staging *exec.Staging
	events  []*exec.Event
	evUsed  []bool
	queued  int  // steps queued (the cursor after them)
	warm    bool // a step ran eagerly (kernels compiled, GEMM algorithms chosen)
	graph   *exec.CapturedGraph
	owned   owned
}

// NewTrain builds the training step of m (a model with gradients) over e,
// its buffers from a named <prefix>/acts/... and <prefix>/grads/.... The
// carry starts halted (every slot takes its first puzzle at step 0).
// Errors wrap ErrHRMConfig or the allocator's; nothing stays allocated on
// error.
func (m *HRM) NewTrain(e *ops.Engine, a device.Allocator, prefix string, cfg HRMTrainConfig) (t *HRMTrain, err error) {
	if m.grad == nil {
		return nil, fmt.Errorf("%w: a training step needs a model made with gradients", ErrHRMConfig)
	}
	c := m.cfg
	if c.HaltMaxSteps < 2 {
		return nil, fmt.Errorf("%w: training needs halt max steps ≥ 2 (the Q-continue target), have %d", ErrHRMConfig, c.HaltMaxSteps)
	}
	if cfg.Autocast == 0 {
		cfg.Autocast = tensor.F32
	}
	if cfg.PoolSlots == 0 {
		cfg.PoolSlots = 8
	}
	if cfg.PoolSlots < 1 || cfg.Warmup < 0 || cfg.TotalSteps < 0 || !(cfg.LRMinRatio >= 0 && cfg.LRMinRatio <= 1) {
		return nil, fmt.Errorf("%w: pool slots %d, warmup %d, total steps %d, min ratio %v", ErrHRMConfig,
			cfg.PoolSlots, cfg.Warmup, cfg.TotalSteps, cfg.LRMinRatio)
	}
	B, T, L, C, dt := cfg.Batch, c.Positions(), c.SeqLen, c.Hidden, cfg.Autocast
	t = &HRMTrain{m: m, e: e, cfg: cfg, owned: owned{a: a, prefix: prefix}}
	defer func() {
		if err != nil {
			t.Free()
			t = nil
		}
	}()
	if t.in, err = newHRMInner(m, e, a, prefix+"/inner", B, dt); err != nil {
		return t, err
	}
	alloc := func(name string, dt tensor.DType, shape ...int) *tensor.Tensor {
		if err != nil {
			return nil
		}
		var x *tensor.Tensor
		x, err = t.owned.alloc("acts", name, dt, shape...)
		return x
	}
	R := cfg.PoolSlots
	t.batch = ops.ACTBatch{Halted: alloc("act.halted", tensor.I32, B), Steps: alloc("act.steps", tensor.I32, B),
		Inputs: alloc("act.inputs", tensor.U8, B, L), Labels: alloc("act.labels", tensor.U8, B, L),
		Cursor: alloc("act.cursor", tensor.I32, 1)}
	t.pool = ops.ACTPool{Inputs: alloc("pool.inputs", tensor.U8, R, B, L), Labels: alloc("pool.labels", tensor.U8, R, B, L),
		MinHalt: alloc("pool.min_halt", tensor.I32, R, B)}
	t.targets = alloc("targets", tensor.I32, B, T)
	t.carryH, t.carryL = alloc("carry.z_H", dt, B, T, C), alloc("carry.z_L", dt, B, T, C)
	t.qNext, t.qt = alloc("q_next", dt, B, 2), alloc("q_targets", tensor.F32, B, 2)
	t.pred = alloc("pred", tensor.I32, B, T)
	t.correct, t.exact = alloc("correct", tensor.I32, B), alloc("exact", tensor.I32, B)
	t.lrScale, t.metrics = alloc("lr_scale", tensor.F32, 1), alloc("metrics", tensor.F32, ops.ACTMetrics)
	if err != nil {
		return t, err
	}
	for _, z := range []*tensor.Tensor{t.pool.Inputs, t.pool.Labels, t.pool.MinHalt, t.batch.Inputs, t.batch.Labels,
		t.carryH, t.carryL, t.batch.Steps} {
		if err = z.Write(make([]byte, z.Bytes())); err != nil {
			return t, err
		}
	}
	if err = t.Reset(0); err != nil {
		return t, err
	}
	hi, _ := m.Param("inner.H_init")
	li, _ := m.Param("inner.L_init")
	t.hInit, t.lInit = hi.Value, li.Value
	if err = t.record(a, prefix); err != nil {
		return t, err
	}
	stage := int64(2*B*L + 4*B)
	if t.staging, err = e.NewStaging(int64(R) * stage); err != nil {
		return t, err
	}
	for range R {
		ev, err := e.NewEvent(false)
		if err != nil {
			return t, err
		}
		t.events = append(t.events, ev)
	}
	t.evUsed = make([]bool, R)
	return t, nil
}

// record builds the gradient graph of a segment's last L and H updates,
// the heads and the losses, with the ACT hooks between them.
func (t *HRMTrain) record(a device.Allocator, prefix string) error {
	m, e, c, in := t.m, t.e, t.m.cfg, t.in
	B, T, dt := t.cfg.Batch, c.Positions(), t.cfg.Autocast
	g := ops.NewGraph(e, a, prefix+"/step", ops.GraphOptions{Autocast: dt, Train: true})
	t.g = g
	ws := map[string]*ops.Var{}
	w := func(name string) *ops.Var {
		if v, ok := ws[name]; ok {
			return v
		}
		val, err := m.weight(name, dt)
		if err != nil {
			g.Fail("weight", err)
			return nil
		}
		p, _ := m.Param(name)
		ws[name] = g.Param(name, val, p.Grad)
		return ws[name]
	}
	table, tgrad, err := m.table()
	if err != nil {
		return err
	}
	x := m.recordEmbed(g, g.Param("inner.embedding_table", table, tgrad), g.Input("tokens", in.tokens))
	zH, zL := g.Input("z_H", in.zH), g.Input("z_L", in.zL)
	newL := m.recordLevel(g.Scope("grad"), "L", g.Add(zL, g.Add(zH, x)), w)
	newH := m.recordLevel(g.Scope("grad"), "H", g.Add(zH, newL), w)
	// The Q head is recorded before lm_head so that, in the backward,
	// lm_head's GEMM writes z_H's gradient first and the Q head's adds
	// its position 0.
	t.q = g.LinearAt(newH, 0, w("inner.q_head.weight"), w("inner.q_head.bias"))
	t.logits = g.Linear(newH, w("inner.lm_head.weight"), nil, ops.ActNone)
	if g.Err() != nil {
		return g.Err()
	}
	// The hooks are nodes without a backward: they read values during the
	// forward, in record order, and write buffers no gradient flows from.
	g.Record("act.correct", []*ops.Var{t.logits}, nil, func(*ops.Grads) error {
		return e.ACTCorrect(t.pred, t.correct, t.exact, t.logits.Value, t.targets)
	}, nil)
	lm := g.StablemaxCrossEntropy(t.logits, g.Input("targets", t.targets), T, 1/float32(B))
	g.Record("act.next", []*ops.Var{newH, newL}, nil, func(*ops.Grads) error {
		// The new carry, detached; then the next segment's Q from it
		// (a second forward without gradients, on the inner's state:
		// nothing in this graph's backward reads z_H and z_L).
		for _, cp := range [][2]*tensor.Tensor{{t.carryH, newH.Value}, {t.carryL, newL.Value}, {in.zH, newH.Value}, {in.zL, newL.Value}} {
			if err := e.Copy(cp[0], cp[1]); err != nil {
				return err
			}
		}
		if err := in.cycles(true); err != nil {
			return err
		}
		if err := in.qHead(t.qNext); err != nil {
			return err
		}
		return e.ACTTargets(t.qt, t.exact, t.qNext, t.batch.Steps, c.HaltMaxSteps)
	}, nil)
	ql := g.ACTQLoss(t.q, g.Input("q_targets", t.qt), 0.5/float32(B))
	if err := g.Build(true); err != nil {
		return err
	}
	t.lmLoss, t.qLoss = lm.Value, ql.Value
	return nil
}

// SetOptimizers sets the updates the step runs after its backward, in
// order: AdamATan2 on AdamParams and sign-SGD on SignParams, both with
// LRScale as their LR scale (optim.NewAdamATan2, optim.NewSignSGD).
func (t *HRMTrain) SetOptimizers(s ...Stepper) { t.opts = s }

// LRScale is the device scalar (f32 [1]) each step sets to its learning-
// rate scale before the optimizers run.
func (t *HRMTrain) LRScale() *tensor.Tensor { return t.lrScale }

// Reset makes every slot halted (the next step takes a fresh batch) and
// sets the step counter to step (a resumed run's: the pool slot and the
// learning-rate schedule follow it). The next Stage must be for step.
func (t *HRMTrain) Reset(step int) error {
	if step < 0 {
		return fmt.Errorf("%w: step %d", ErrHRMConfig, step)
	}
	if err := t.e.Sync(); err != nil {
		return err
	}
	ones := make([]int32, t.cfg.Batch)
	for i := range ones {
		ones[i] = 1
	}
	if err := t.batch.Halted.Write(tensor.AsBytes(ones)); err != nil {
		return err
	}
	t.queued = step
	clear(t.evUsed)
	return t.batch.Cursor.Write(tensor.AsBytes([]int32{int32(step)}))
}

// Stage copies the batch of step `step` to the device: inputs and labels
// B·SeqLen tokens each (row-major [B, SeqLen]; Sudoku: digit + 1, HRMTokens),
// minHalt the B exploration draws of the step (nil: none). Steps read
// pool slot step mod PoolSlots, so step must lie in [q, q + PoolSlots)
// where q is the number of steps queued so far (Reset's step plus Step
// and Run calls): the copy is queued after them, so it cannot overwrite a
// batch a queued step has yet to read. It waits only for the copy that
// last used the same pinned slot (PoolSlots steps ago).
func (t *HRMTrain) Stage(step int, inputs, labels []uint8, minHalt []int32) error {
	B, L, R := t.cfg.Batch, t.m.cfg.SeqLen, t.cfg.PoolSlots
	if step < t.queued || step >= t.queued+R {
		return fmt.Errorf("%w: staging step %d with %d steps queued and %d pool slots", ErrHRMConfig, step, t.queued, R)
	}
	if len(inputs) != B*L || len(labels) != B*L || (minHalt != nil && len(minHalt) != B) {
		return fmt.Errorf("%w: a batch of %d inputs, %d labels, %d min-halt draws (want %d, %d, %d)", ErrHRMConfig,
			len(inputs), len(labels), len(minHalt), B*L, B*L, B)
	}
	for _, v := range [][]uint8{inputs, labels} {
		for _, x := range v {
			if int(x) >= t.m.cfg.Vocab {
				return fmt.Errorf("%w: token %d outside the vocabulary of %d", ErrHRMConfig, x, t.m.cfg.Vocab)
			}
		}
	}
	k := step % R
	if t.evUsed[k] {
		if err := t.events[k].Wait(); err != nil {
			return err
		}
	}
	stride := int64(2*B*L + 4*B)
	buf := t.staging.Bytes()[int64(k)*stride : int64(k+1)*stride]
	copy(buf, inputs)
	copy(buf[B*L:], labels)
	mh := buf[2*B*L:]
	if minHalt == nil {
		clear(mh)
	} else {
		copy(mh, tensor.AsBytes(minHalt))
	}
	for i, dst := range []*tensor.Tensor{t.pool.Inputs, t.pool.Labels, t.pool.MinHalt} {
		slot, err := dst.Select(0, k)
		if err != nil {
			return err
		}
		if err := t.e.CopyIn(slot, t.staging, int64(k)*stride+int64(i*B*L)); err != nil {
			return err
		}
	}
	t.evUsed[k] = true
	return t.events[k].Record()
}

// body queues one segment step (see HRMTrain).
func (t *HRMTrain) body() error {
	e, c, in := t.e, t.m.cfg, t.in
	if err := t.m.castWeights(e); err != nil {
		return err
	}
	if err := e.ACTSchedule(t.lrScale, t.batch.Cursor, t.cfg.Warmup, t.cfg.TotalSteps, t.cfg.LRMinRatio); err != nil {
		return err
	}
	pool := t.pool
	pool.MinHalt = nil
	if err := e.ACTLoad(in.tokens, t.targets, t.batch, pool, c.PuzzleToken()); err != nil {
		return err
	}
	if err := e.ACTResetCarry(in.zH, t.carryH, t.hInit, t.batch.Halted); err != nil {
		return err
	}
	if err := e.ACTResetCarry(in.zL, t.carryL, t.lInit, t.batch.Halted); err != nil {
		return err
	}
	if err := in.embed.Forward(); err != nil {
		return err
	}
	if err := in.cycles(false); err != nil {
		return err
	}
	if err := t.g.Forward(); err != nil {
		return err
	}
	if err := t.g.Backward(); err != nil {
		return err
	}
	for _, o := range t.opts {
		if err := o.Step(e); err != nil {
			return err
		}
	}
	return e.ACTHalt(ops.ACTHaltArgs{Batch: t.batch, MinHalt: t.pool.MinHalt, Q: t.q.Value, QT: t.qt, Correct: t.correct,
		Exact: t.exact, Cells: c.SeqLen, LMLoss: t.lmLoss, QLoss: t.qLoss, LRScale: t.lrScale, Metrics: t.metrics,
		MaxSteps: c.HaltMaxSteps, Explore: true})
}

// Step queues one segment step eagerly (op by op).
func (t *HRMTrain) Step() error {
	if len(t.opts) == 0 {
		return fmt.Errorf("%w: no optimizers (SetOptimizers)", ErrHRMConfig)
	}
	if err := t.e.Do(t.body); err != nil {
		return err
	}
	t.queued++
	t.warm = true
	return nil
}

// Run queues one segment step: with Graph on a GPU, the first run is
// eager (kernels compile, GEMM algorithms are chosen) and captures the
// step afterwards; later runs replay the captured graph. Otherwise Step.
// A step made after Reset to a later step (a resumed run) also runs its
// first step eagerly before capturing.
func (t *HRMTrain) Run() error {
	if !t.cfg.Graph || !t.e.IsGraphCapable() || (t.graph == nil && !t.warm) {
		return t.Step()
	}
	if t.graph == nil {
		g, err := t.e.Capture(t.body)
		if err != nil {
			return err
		}
		t.graph = g
	}
	if err := t.graph.Launch(); err != nil {
		return err
	}
	t.queued++
	return nil
}

// MetricsVector is the device vector ACTHalt writes each step's metrics
// into (f32 [ops.ACTMetrics], entries ops.ACTLoss ... ops.ACTLRScale):
// what Metrics reads after waiting for the step, for callers that read
// entries later (a view per entry) without waiting themselves.
func (t *HRMTrain) MetricsVector() *tensor.Tensor { return t.metrics }

// Carry is the state one segment step hands the next, which a checkpoint
// between segments must hold for the run to go on as it would have:
// carry.z_H and carry.z_L (the detached hidden states, [B, T, C] in the
// compute dtype), and per slot carry.halted (i32 [B]: takes a new puzzle
// at the next step), carry.steps (i32 [B]: segments run on its puzzle),
// carry.inputs and carry.labels (u8 [B, SeqLen]: its puzzle's tokens),
// and carry.cursor (i32 [1]: the steps taken). Read them after the step
// (tensor reads wait for the device); to restore, Reset(step) and then
// write every one (Reset's halted flags and cursor are overwritten).
func (t *HRMTrain) Carry() []ckpt.Named {
	return []ckpt.Named{{Name: "carry.z_H", T: t.carryH}, {Name: "carry.z_L", T: t.carryL},
		{Name: "carry.halted", T: t.batch.Halted}, {Name: "carry.steps", T: t.batch.Steps},
		{Name: "carry.inputs", T: t.batch.Inputs}, {Name: "carry.labels", T: t.batch.Labels},
		{Name: "carry.cursor", T: t.batch.Cursor}}
}

// Queued is the number of steps queued (the step counter after them).
func (t *HRMTrain) Queued() int { return t.queued }

// Metrics waits for the queued steps and reads the last one's metrics.
func (t *HRMTrain) Metrics() (HRMMetrics, error) {
	if err := t.e.Sync(); err != nil {
		return HRMMetrics{}, err
	}
	v, err := t.metrics.ReadF32()
	if err != nil {
		return HRMMetrics{}, err
	}
	return HRMMetrics{Step: t.queued, Loss: float64(v[ops.ACTLoss]), LMLoss: float64(v[ops.ACTLMLoss]),
		QHaltLoss: float64(v[ops.ACTQHaltLoss]), QContinueLoss: float64(v[ops.ACTQContinueLoss]), Count: int(v[ops.ACTCount]),
		Accuracy: float64(v[ops.ACTAccuracy]), ExactAccuracy: float64(v[ops.ACTExactAccuracy]),
		QHaltAccuracy: float64(v[ops.ACTQHaltAccuracy]), Steps: float64(v[ops.ACTSteps]), LRScale: float64(v[ops.ACTLRScale])}, nil
}

// Halted waits for the queued steps and reads which slots halted after
// the last one and the segments each slot has run on its puzzle.
func (t *HRMTrain) Halted() (halted, steps []int32, err error) {
	if err := t.e.Sync(); err != nil {
		return nil, nil, err
	}
	h, err := t.batch.Halted.Read()
	if err != nil {
		return nil, nil, err
	}
	s, err := t.batch.Steps.Read()
	if err != nil {
		return nil, nil, err
	}
	return append([]int32(nil), tensor.BytesAs[int32](h)...), append([]int32(nil), tensor.BytesAs[int32](s)...), nil
}

// Evaluator returns an evaluation at the training batch that shares the
// step's gradient-free core (its buffers and graphs: no second copy of
// the activations). Run it between steps: it overwrites the core's
// state, which every step rebuilds from its own carry.
func (t *HRMTrain) Evaluator(a device.Allocator, prefix string) (*HRMEval, error) {
	return t.m.newEval(t.e, a, prefix, t.in, false)
}

// Free releases the step's buffers (not the model's).
func (t *HRMTrain) Free() error {
	var errs []error
	if t.graph != nil {
		errs = append(errs, t.graph.Close())
	}
	for _, ev := range t.events {
		errs = append(errs, ev.Close())
	}
	if t.staging != nil {
		errs = append(errs, t.staging.Close())
	}
	if t.g != nil {
		errs = append(errs, t.g.Free())
	}
	if t.in != nil {
		errs = append(errs, t.in.free())
	}
	return errors.Join(append(errs, t.owned.free())...)
}

// HRMTokens turns Sudoku digits (0 blank, 1–9) into the model's tokens
// (digit + 1, build_sudoku_dataset.py's: 1 blank, 2–10 the digits).
func HRMTokens(digits []uint8) []uint8 {
	out := make([]uint8, len(digits))
	for i, d := range digits {
		out[i] = d + 1
	}
	return out
}
