package ops

// The act family: the device side of adaptive computation time (Graves
// 2016, "Adaptive Computation Time for Recurrent Neural Networks") as
// sapientinc/HRM trains and evaluates it (models/hrm/hrm_act_v1.py, the
// Q-learning halting head; models/losses.py, ACTLossHead's targets and
// metrics), so that a segment step decides halting, refills the slots that
// halted from puzzles already on the device and keeps its metrics with no
// host round trip, and an evaluation loop ends on a flag the device sets
// (libgpu/kernels/act.cu): ACTResetCarry, ACTLoad, ACTCorrect, ACTTargets,
// ACTHalt, ACTSchedule, ACTEval; the Q losses in PyTorch's f32 gradient
// arithmetic (ACTQLoss, Graph.ACTQLoss); and Graph.LinearAt, a linear
// layer at one position of every sequence (HRM's Q head on the puzzle
// token), with its scatter PutPos. Reference and checks: opstest/act.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// The entries of ACTHalt's metrics vector (f32 [ACTMetrics]), as
// bench/reference/hrm.py prints a training step: the losses divided by the
// batch, the rest over the sequences halted after the step (divided by
// max(count, 1), as pretrain.py does).
const (
	ACTLoss          = iota // (lm + ½(q_halt + q_continue)) / B: the value of the two loss inputs' sum
	ACTLMLoss               // the lm loss input
	ACTQHaltLoss            // Σ_b BCE(q_halt, target) / B
	ACTQContinueLoss        // Σ_b BCE(q_continue, target) / B
	ACTCount                // sequences halted after the step
	ACTAccuracy             // mean over halted sequences of correct cells / cells
	ACTExactAccuracy        // fraction of halted sequences entirely right
	ACTQHaltAccuracy        // fraction of halted sequences where (q_halt ≥ 0) = exact
	ACTSteps                // mean segments used by the halted sequences
	ACTLRScale              // the learning-rate scale of the step
	ACTMetrics              // the vector's length
)

// ACTBatch is the device state of a batch of B sequences under ACT.
type ACTBatch struct {
	Halted *tensor.Tensor // i32 [B]: 1 where the slot halted after the last segment (it takes a new puzzle)
	Steps  *tensor.Tensor // i32 [B]: segments run on the slot's current puzzle
	Inputs *tensor.Tensor // u8 [B, L]: the slot's current input tokens
	Labels *tensor.Tensor // u8 [B, L]: their label tokens
	Cursor *tensor.Tensor // i32 [1]: segment steps taken; the pool slot read is Cursor mod R
}

// ACTPool is R batches of puzzles staged on the device ahead of the steps
// that read them: step Cursor reads slot Cursor mod R.
type ACTPool struct {
	Inputs, Labels *tensor.Tensor // u8 [R, B, L] tokens
	MinHalt        *tensor.Tensor // i32 [R, B]: exploration's minimum segments, or nil (none)
}

// actHostI32 reads an i32 host tensor's elements (its own memory).
func actHostI32(t *tensor.Tensor) ([]int32, error) {
	if t == nil {
		return nil, nil
	}
	v, err := t.I32()
	if err != nil {
		return nil, fmt.Errorf("ops: host backend: %w", err)
	}
	return v, nil
}

func actHostU8(t *tensor.Tensor) ([]uint8, error) {
	v, err := t.U8()
	if err != nil {
		return nil, fmt.Errorf("ops: host backend: %w", err)
	}
	return v, nil
}

// actCheck checks a contiguous tensor of dtype dt and shape want.
func (e *Engine) actCheck(what string, t *tensor.Tensor, dts []tensor.DType, want ...int) error {
	return e.checkView("act "+what, t, true, dts, want...)
}

var (
	actI32 = []tensor.DType{tensor.I32}
	actU8  = []tensor.DType{tensor.U8}
	actF32 = []tensor.DType{tensor.F32}
)

// ACTResetCarry resets the recurrent state of the slots that halted, as
// hrm_act_v1.py's reset_carry does at the start of a segment:
//
//	w[b] = init (broadcast over T)   where halted[b] ≠ 0
//	w[b] = z[b]                      elsewhere
//
// w and z: [B, T, C] contiguous, one dtype (f32 or bf16); z may be w (in
// place). init: f32 [C] (HRM's H_init or L_init), rounded to the dtype.
// halted: i32 [B]. Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) ACTResetCarry(w, z, init, halted *tensor.Tensor) error {
	if err := e.actCheck("reset w", w, floatTypes); err != nil {
		return err
	}
	if w.Rank() != 3 {
		return fmt.Errorf("%w: act reset w is %v, want [B, T, C]", tensor.ErrShape, w.Shape)
	}
	B, T, C := w.Dim(0), w.Dim(1), w.Dim(2)
	if err := e.actCheck("reset z", z, []tensor.DType{w.DType}, w.Shape...); err != nil {
		return err
	}
	if err := e.actCheck("reset init", init, actF32, C); err != nil {
		return err
	}
	if err := e.actCheck("reset halted", halted, actI32, B); err != nil {
		return err
	}
	n := w.Numel()
	if n == 0 {
		return nil
	}
	if err := checkDims(B, T, C); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		zs, err := hostIn(z)
		if err != nil {
			return err
		}
		zs = append([]float32(nil), zs...) // w may be z
		ins, err := hostIns(init)
		if err != nil {
			return err
		}
		h, err := actHostI32(halted)
		if err != nil {
			return err
		}
		out, commit, err := hostOut(w, false)
		if err != nil {
			return err
		}
		for i := range out {
			b := i / (T * C)
			if h[b] != 0 {
				out[i] = ins[0][i%C]
			} else {
				out[i] = zs[i]
			}
		}
		return commit()
	}, func(c *cudaImpl) error {
		k := launch.ActArgs{W: devPtr(w), Z: devPtr(z), Init: devPtr(init), Halted: devPtr(halted), N: int64(n),
			B: int32(B), T: int32(T), C: int32(C)}
		return launch.ActReset(c, dtName(w.DType), gridFor(int64(n), 256), block1(256), 0, &k)
	})
}

// checkBatch checks the parts of b that are not nil against B sequences of
// L cells.
func (e *Engine) checkBatch(b ACTBatch, B, L int, inputs bool) error {
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
		dts  []tensor.DType
		sh   []int
	}{{"halted", b.Halted, actI32, []int{B}}, {"steps", b.Steps, actI32, []int{B}}, {"cursor", b.Cursor, actI32, []int{1}}} {
		if err := e.actCheck(c.what, c.t, c.dts, c.sh...); err != nil {
			return err
		}
	}
	if !inputs {
		return nil
	}
	if err := e.actCheck("inputs", b.Inputs, actU8, B, L); err != nil {
		return err
	}
	return e.actCheck("labels", b.Labels, actU8, B, L)
}

// ACTLoad refills the slots that halted from pool slot Cursor mod R and
// writes every slot's model input and loss targets, as hrm_act_v1.py's
// forward replaces the carried puzzle (current_data) where halted: for
// each slot b with Halted[b] ≠ 0, Steps[b] = 0 and Inputs[b], Labels[b] =
// pool row b of that slot; then for every b
//
//	tokens[b]  = [puzzleToken, Inputs[b]...]   i32 [B, L+1]
//	targets[b] = [−1, Labels[b]...]            i32 [B, L+1] (−1: ignored)
//
// so position 0 carries the puzzle embedding (HRM's puzzle_emb_len = 1) and
// contributes no loss. Cursor is read, not changed (ACTHalt advances it).
// Tokens are u8 in the pool (a vocabulary of at most 256). Errors wrap
// tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) ACTLoad(tokens, targets *tensor.Tensor, b ACTBatch, p ACTPool, puzzleToken int) error {
	if err := e.actCheck("pool inputs", p.Inputs, actU8); err != nil {
		return err
	}
	if p.Inputs.Rank() != 3 || p.Inputs.Dim(0) < 1 {
		return fmt.Errorf("%w: act pool inputs are %v, want [R ≥ 1, B, L]", tensor.ErrShape, p.Inputs.Shape)
	}
	R, B, L := p.Inputs.Dim(0), p.Inputs.Dim(1), p.Inputs.Dim(2)
	if err := e.actCheck("pool labels", p.Labels, actU8, p.Inputs.Shape...); err != nil {
		return err
	}
	if err := e.checkBatch(b, B, L, true); err != nil {
		return err
	}
	if err := e.actCheck("tokens", tokens, actI32, B, L+1); err != nil {
		return err
	}
	if err := e.actCheck("targets", targets, actI32, B, L+1); err != nil {
		return err
	}
	if B == 0 {
		return nil
	}
	if err := checkDims(R*B*L, B*(L+1)); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		h, err := actHostI32(b.Halted)
		if err != nil {
			return err
		}
		st, err := actHostI32(b.Steps)
		if err != nil {
			return err
		}
		cur, err := actHostI32(b.Cursor)
		if err != nil {
			return err
		}
		pin, err := actHostU8(p.Inputs)
		if err != nil {
			return err
		}
		plab, err := actHostU8(p.Labels)
		if err != nil {
			return err
		}
		cin, err := actHostU8(b.Inputs)
		if err != nil {
			return err
		}
		clab, err := actHostU8(b.Labels)
		if err != nil {
			return err
		}
		tok, err := actHostI32(tokens)
		if err != nil {
			return err
		}
		tg, err := actHostI32(targets)
		if err != nil {
			return err
		}
		slot := int(cur[0]) % R
		for j := 0; j < B; j++ {
			if h[j] != 0 {
				st[j] = 0
				copy(cin[j*L:(j+1)*L], pin[(slot*B+j)*L:])
				copy(clab[j*L:(j+1)*L], plab[(slot*B+j)*L:])
			}
			tok[j*(L+1)], tg[j*(L+1)] = int32(puzzleToken), -1
			for i := 0; i < L; i++ {
				tok[j*(L+1)+1+i], tg[j*(L+1)+1+i] = int32(cin[j*L+i]), int32(clab[j*L+i])
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		k := launch.ActArgs{Halted: devPtr(b.Halted), Steps: devPtr(b.Steps), Cursor: devPtr(b.Cursor),
			PoolIn: devPtr(p.Inputs), PoolLab: devPtr(p.Labels), CurIn: devPtr(b.Inputs), CurLab: devPtr(b.Labels),
			Tokens: devPtr(tokens), Targets: devPtr(targets), B: int32(B), T: int32(L + 1), Slots: int32(R),
			PuzzleTok: int32(puzzleToken)}
		return launch.ActLoad(c, gridFor(int64(B*(L+1)), 256), block1(256), 0, &k)
	})
}

// ACTCorrect scores a segment's logits against its targets, for ACT's
// halting target and metrics (ACTLossHead: is_correct, seq_is_correct):
//
//	pred[b, t]  = argmax_v logits[b, t, v]       (the first index greater than every one before it)
//	correct[b]  = #{t : targets[b, t] ≥ 0, pred[b, t] = targets[b, t]}
//	exact[b]    = 1 when every t with targets[b, t] ≥ 0 is right, else 0
//
// logits [B, T, V] f32 or bf16 with the last dimension contiguous (row
// strides free: the [B, T, V] output of an lm head), targets i32 [B, T]
// (negative: ignored), pred i32 [B, T], correct and exact i32 [B]. Errors
// wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) ACTCorrect(pred, correct, exact, logits, targets *tensor.Tensor) error {
	if err := e.checkView("act logits", logits, false, floatTypes); err != nil {
		return err
	}
	if logits.Rank() != 3 || logits.Dim(2) < 1 {
		return fmt.Errorf("%w: act logits are %v, want [B, T, V ≥ 1]", tensor.ErrShape, logits.Shape)
	}
	B, T, V := logits.Dim(0), logits.Dim(1), logits.Dim(2)
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
		sh   []int
	}{{"targets", targets, []int{B, T}}, {"pred", pred, []int{B, T}}, {"correct", correct, []int{B}}, {"exact", exact, []int{B}}} {
		if err := e.actCheck(c.what, c.t, actI32, c.sh...); err != nil {
			return err
		}
	}
	if B*T == 0 {
		return nil
	}
	if err := checkDims(B, T, V, logits.Strides[0], logits.Strides[1]); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		x, err := hostIn(logits)
		if err != nil {
			return err
		}
		tg, err := actHostI32(targets)
		if err != nil {
			return err
		}
		out := make([][]int32, 3)
		for i, t := range []*tensor.Tensor{pred, correct, exact} {
			if out[i], err = actHostI32(t); err != nil {
				return err
			}
		}
		for b := 0; b < B; b++ {
			ok, valid := 0, 0
			for t := 0; t < T; t++ {
				row := x[(b*T+t)*V : (b*T+t+1)*V]
				best := 0
				for v := 1; v < V; v++ {
					if row[v] > row[best] {
						best = v
					}
				}
				out[0][b*T+t] = int32(best)
				if g := tg[b*T+t]; g >= 0 {
					valid++
					if int32(best) == g {
						ok++
					}
				}
			}
			out[1][b] = int32(ok)
			out[2][b] = 0
			if ok == valid {
				out[2][b] = 1
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		k := launch.ActArgs{Logits: devPtr(logits), Targets: devPtr(targets), Pred: devPtr(pred), Correct: devPtr(correct),
			Exact: devPtr(exact), S0: int64(logits.Strides[0]), S1: int64(logits.Strides[1]), B: int32(B), T: int32(T), V: int32(V)}
		return launch.ActCorrect(c, dtName(logits.DType), grid1(min(B, 65535)), block1(128), 0, &k)
	})
}

// ACTTargets writes the Q-learning targets of a training segment
// (hrm_act_v1.py and ACTLossHead): with steps the segments run before this
// one (so this segment is number steps[b] + 1) and qNext the Q logits of
// the next segment from the new carry (a second forward without gradients),
//
//	qt[b, 0] = exact[b]                                              (halt: the answer is right)
//	qt[b, 1] = σ(steps[b] + 1 ≥ maxSteps ? qNext[b, 0] : max(qNext[b, 0], qNext[b, 1]))   (continue)
//
// qt f32 [B, 2]; exact and steps i32 [B]; qNext [B, 2] f32 or bf16,
// contiguous. σ in f32. Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout, exec.ErrDevice or ErrConfig (maxSteps < 1).
func (e *Engine) ACTTargets(qt, exact, qNext, steps *tensor.Tensor, maxSteps int) error {
	if err := e.actCheck("q next", qNext, floatTypes); err != nil {
		return err
	}
	if qNext.Rank() != 2 || qNext.Dim(1) != 2 {
		return fmt.Errorf("%w: act q next is %v, want [B, 2]", tensor.ErrShape, qNext.Shape)
	}
	B := qNext.Dim(0)
	if err := e.actCheck("q targets", qt, actF32, B, 2); err != nil {
		return err
	}
	if err := e.actCheck("exact", exact, actI32, B); err != nil {
		return err
	}
	if err := e.actCheck("steps", steps, actI32, B); err != nil {
		return err
	}
	if maxSteps < 1 {
		return fmt.Errorf("%w: act halt max steps %d", ErrConfig, maxSteps)
	}
	if B == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		qn, err := hostIn(qNext)
		if err != nil {
			return err
		}
		ex, err := actHostI32(exact)
		if err != nil {
			return err
		}
		st, err := actHostI32(steps)
		if err != nil {
			return err
		}
		out, err := qt.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		for b := 0; b < B; b++ {
			out[2*b] = 0
			if ex[b] != 0 {
				out[2*b] = 1
			}
			h, c := qn[2*b], qn[2*b+1]
			x := h
			if int(st[b])+1 < maxSteps && c > h {
				x = c
			}
			out[2*b+1] = actSigmoid32(x)
		}
		return nil
	}, func(c *cudaImpl) error {
		k := launch.ActArgs{Qt: devPtr(qt), Exact: devPtr(exact), Q: devPtr(qNext), Steps: devPtr(steps), B: int32(B),
			MaxSteps: int32(maxSteps)}
		return launch.ActTargets(c, dtName(qNext.DType), gridFor(int64(B), 256), block1(256), 0, &k)
	})
}

// actSigmoid32 is the logistic function rounded to f32, the host's form
// of act.cu's act_sigmoid: ACTTargets and ACTQLoss use the same one.
func actSigmoid32(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// ACTQLoss computes HRM's Q losses (models/losses.py ACTLossHead:
// F.binary_cross_entropy_with_logits(q, target, reduction="sum") on the
// halt and continue logits) and their gradient as PyTorch computes them in
// f32:
//
//	loss[0] = scale · Σ_i max(q_i, 0) − q_i·y_i + log(1 + e^(−|q_i|))   (double, fixed order)
//	dq_i    = (σ(q_i) − y_i)·scale                                      (f32; σ as ACTTargets')
//
// The f32 gradient matters: where a Q-continue target is σ of the very
// value it trains (the first step, when the Q head is still zero and both
// logits equal its bias) PyTorch's gradient is exactly 0, and so is this
// one, since σ is computed as ACTTargets computes the target; a gradient
// of rounding noise there (ops.Engine.BCEWithLogits computes σ in double)
// would become a full-size step of Adam-atan2, which is scale invariant.
// q: f32 or bf16, contiguous, any shape; target f32 of q's shape; loss
// f32 [1] or nil; dq nil or of q's shape and dtype, added to with acc. One
// block on CUDA. Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout, exec.ErrDevice or ErrConfig (scale not finite).
func (e *Engine) ACTQLoss(loss, dq, q, target *tensor.Tensor, scale float32, acc bool) error {
	if err := e.checkACTQLoss(loss, dq, q, target, scale); err != nil {
		return err
	}
	n := q.Numel()
	return e.dispatch(func(*hostImpl) error {
		x, err := hostIn(q)
		if err != nil {
			return err
		}
		y, err := target.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		d, commit, err := hostOut(dq, acc)
		if err != nil {
			return err
		}
		var s float64
		for i := 0; i < n; i++ {
			s += actBCE(float64(x[i]), float64(y[i]))
			if d != nil {
				d[i] = float32((actSigmoid32(x[i]) - y[i]) * scale)
			}
		}
		if err := commit(); err != nil {
			return err
		}
		if loss == nil {
			return nil
		}
		return loss.WriteFloat32([]float32{float32(float64(scale) * s)})
	}, func(c *cudaImpl) error {
		k := launch.ActArgs{W: devPtr(dq), Q: devPtr(q), Qt: devPtr(target), Metrics: devPtr(loss), N: int64(n), Scale: scale, Acc: lnBool(acc)}
		return launch.ActQloss(c, dtName(q.DType), grid1(1), block1(1024), 0, &k)
	})
}

func (e *Engine) checkACTQLoss(loss, dq, q, target *tensor.Tensor, scale float32) error {
	if err := e.actCheck("q", q, floatTypes); err != nil {
		return err
	}
	if err := e.actCheck("q target", target, actF32, q.Shape...); err != nil {
		return err
	}
	if dq != nil {
		if err := e.actCheck("dq", dq, []tensor.DType{q.DType}, q.Shape...); err != nil {
			return err
		}
	}
	if loss != nil {
		if err := e.actCheck("q loss", loss, actF32, 1); err != nil {
			return err
		}
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return fmt.Errorf("%w: act q loss scale %v", ErrConfig, scale)
	}
	return nil
}

// ACTQLoss records ACTQLoss as a loss node ([1] f32): HRM's ½·(q_halt_loss
// + q_continue_loss) divided by the batch is ACTQLoss(q, targets,
// 0.5/B) with q [B, 2] and the targets ACTTargets writes (an Input, no
// gradient). It must be a root of the backward.
func (g *Graph) ACTQLoss(q, target *Var, scale float32) *Var {
	if !g.ok(q, target) {
		return nil
	}
	if err := g.e.checkACTQLoss(nil, nil, q.Value, target.Value, scale); err != nil {
		g.Fail("act_q_loss", err)
		return nil
	}
	loss := g.NewOut("act_q_loss", tensor.F32, 1)
	e := g.e
	g.RecordLoss("act_q_loss", []*Var{q, target}, loss, func(gr *Grads) error {
		return e.ACTQLoss(loss.Value, gr.In(0), q.Value, target.Value, scale, gr.Acc(0))
	})
	return loss
}

// ACTHaltArgs are ACTHalt's tensors and settings.
type ACTHaltArgs struct {
	Batch ACTBatch // Halted, Steps and Cursor (Inputs and Labels unused)
	// MinHalt is the pool's exploration draws (i32 [R, B]; row Cursor mod
	// R is this step's), or nil (none).
	MinHalt *tensor.Tensor
	Q       *tensor.Tensor // [B, 2] f32 or bf16: this segment's (q_halt, q_continue) logits
	QT      *tensor.Tensor // f32 [B, 2]: the targets ACTTargets wrote (for the loss metrics)
	Correct *tensor.Tensor // i32 [B] (ACTCorrect)
	Exact   *tensor.Tensor // i32 [B] (ACTCorrect)
	Cells   int            // the denominator of the cell accuracy (HRM: the 81 labelled cells)
	// LMLoss and QLoss are the step's loss values (f32 [1] each, already
	// divided by the batch), or nil (0); LRScale the step's learning-rate
	// scale (f32 [1]), or nil (1).
	LMLoss, QLoss, LRScale *tensor.Tensor
	Metrics                *tensor.Tensor // f32 [ACTMetrics]
	MaxSteps               int            // halt_max_steps
	Explore                bool           // training: halt on q_halt > q_continue, after MinHalt
}

// ACTHalt ends a training segment as hrm_act_v1.py does: for every slot
//
//	steps[b] += 1
//	halted[b] = steps[b] ≥ MaxSteps                                        (evaluation)
//	halted[b] = (steps[b] ≥ MaxSteps or q_halt > q_continue) and steps[b] ≥ minHalt[b]   (Explore)
//
// with minHalt the row of MinHalt at slot Cursor mod R (0 without), then
// writes the step's metrics (the ACTLoss ... ACTLRScale entries: the
// reference's printed line) and advances Cursor by one. One block on CUDA,
// sums in double in a fixed order. Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or ErrConfig (MaxSteps or
// Cells < 1).
func (e *Engine) ACTHalt(a ACTHaltArgs) error {
	if err := e.actCheck("q", a.Q, floatTypes); err != nil {
		return err
	}
	if a.Q.Rank() != 2 || a.Q.Dim(1) != 2 {
		return fmt.Errorf("%w: act q is %v, want [B, 2]", tensor.ErrShape, a.Q.Shape)
	}
	B := a.Q.Dim(0)
	if err := e.checkBatch(a.Batch, B, 0, false); err != nil {
		return err
	}
	checks := []struct {
		what string
		t    *tensor.Tensor
		dts  []tensor.DType
		sh   []int
		opt  bool
	}{
		{"q targets", a.QT, actF32, []int{B, 2}, false}, {"correct", a.Correct, actI32, []int{B}, false},
		{"exact", a.Exact, actI32, []int{B}, false}, {"metrics", a.Metrics, actF32, []int{ACTMetrics}, false},
		{"lm loss", a.LMLoss, actF32, []int{1}, true}, {"q loss", a.QLoss, actF32, []int{1}, true},
		{"lr scale", a.LRScale, actF32, []int{1}, true},
	}
	for _, c := range checks {
		if c.t == nil && c.opt {
			continue
		}
		if err := e.actCheck(c.what, c.t, c.dts, c.sh...); err != nil {
			return err
		}
	}
	R := 0
	if a.MinHalt != nil {
		if err := e.actCheck("min halt", a.MinHalt, actI32); err != nil {
			return err
		}
		if a.MinHalt.Rank() != 2 || a.MinHalt.Dim(1) != B || a.MinHalt.Dim(0) < 1 {
			return fmt.Errorf("%w: act min halt is %v, want [R ≥ 1, %d]", tensor.ErrShape, a.MinHalt.Shape, B)
		}
		R = a.MinHalt.Dim(0)
	}
	if a.MaxSteps < 1 || a.Cells < 1 {
		return fmt.Errorf("%w: act halt max steps %d, cells %d", ErrConfig, a.MaxSteps, a.Cells)
	}
	return e.dispatch(func(*hostImpl) error { return hostACTHalt(a, B, R) }, func(c *cudaImpl) error {
		k := launch.ActArgs{Halted: devPtr(a.Batch.Halted), Steps: devPtr(a.Batch.Steps), Cursor: devPtr(a.Batch.Cursor),
			PoolMh: devPtr(a.MinHalt), Q: devPtr(a.Q), Qt: devPtr(a.QT), Correct: devPtr(a.Correct), Exact: devPtr(a.Exact),
			Metrics: devPtr(a.Metrics), LmLoss: devPtr(a.LMLoss), QLoss: devPtr(a.QLoss), LrScale: devPtr(a.LRScale),
			B: int32(B), L: int32(a.Cells), Slots: int32(R), MaxSteps: int32(a.MaxSteps), Explore: lnBool(a.Explore)}
		return launch.ActHalt(c, dtName(a.Q.DType), grid1(1), block1(1024), 0, &k)
	})
}

func actBCE(x, y float64) float64 { return math.Max(x, 0) - x*y + math.Log1p(math.Exp(-math.Abs(x))) }

func hostACTHalt(a ACTHaltArgs, B, R int) error {
	q, err := hostIn(a.Q)
	if err != nil {
		return err
	}
	ts := map[string]*tensor.Tensor{"halted": a.Batch.Halted, "steps": a.Batch.Steps, "cursor": a.Batch.Cursor,
		"correct": a.Correct, "exact": a.Exact, "mh": a.MinHalt}
	v := map[string][]int32{}
	for k, t := range ts {
		if v[k], err = actHostI32(t); err != nil {
			return err
		}
	}
	f := map[string][]float32{}
	for k, t := range map[string]*tensor.Tensor{"qt": a.QT, "lm": a.LMLoss, "ql": a.QLoss, "lr": a.LRScale, "m": a.Metrics} {
		if t == nil {
			continue
		}
		if f[k], err = t.F32(); err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
	}
	cur := int(v["cursor"][0])
	var s [7]float64
	for b := 0; b < B; b++ {
		st := v["steps"][b] + 1
		v["steps"][b] = st
		qh, qc := q[2*b], q[2*b+1]
		h := int(st) >= a.MaxSteps
		if a.Explore {
			var mh int32
			if R > 0 {
				mh = v["mh"][(cur%R)*B+b]
			}
			h = (h || qh > qc) && st >= mh
		}
		v["halted"][b] = 0
		ex := v["exact"][b] != 0
		if h {
			v["halted"][b] = 1
			s[0]++
			s[1] += float64(v["correct"][b]) / float64(a.Cells)
			if ex {
				s[2]++
			}
			if (qh >= 0) == ex {
				s[3]++
			}
			s[4] += float64(st)
		}
		s[5] += actBCE(float64(qh), float64(f["qt"][2*b]))
		s[6] += actBCE(float64(qc), float64(f["qt"][2*b+1]))
	}
	scalar := func(k string, def float64) float64 {
		if f[k] == nil {
			return def
		}
		return float64(f[k][0])
	}
	lm, ql := scalar("lm", 0), scalar("ql", 0)
	cnt := math.Max(s[0], 1)
	m := f["m"]
	m[ACTLoss], m[ACTLMLoss] = float32(lm+ql), float32(lm)
	m[ACTQHaltLoss], m[ACTQContinueLoss] = float32(s[5]/float64(B)), float32(s[6]/float64(B))
	m[ACTCount], m[ACTAccuracy], m[ACTExactAccuracy] = float32(s[0]), float32(s[1]/cnt), float32(s[2]/cnt)
	m[ACTQHaltAccuracy], m[ACTSteps], m[ACTLRScale] = float32(s[3]/cnt), float32(s[4]/cnt), float32(scalar("lr", 1))
	v["cursor"][0] = int32(cur + 1)
	return nil
}

// ACTSchedule is a learning-rate schedule on the device: the scale of the
// rate of step s = Cursor + 1 (1-based, the step about to run), as
// pretrain.py's cosine_schedule_with_warmup_lr_lambda computes it:
//
//	scale = s / max(1, warmup)                                         (s < warmup)
//	scale = minRatio + max(0, (1 − minRatio)·½(1 + cos(π·p))),  p = (s − warmup)/max(1, total − warmup)
//
// in double, stored as f32 in scale ([1]), which optimizers read as their
// LRScale. HRM's Sudoku run: warmup 2000, minRatio 1 (no decay). cursor:
// i32 [1]. Errors wrap tensor.ErrShape, tensor.ErrDType, exec.ErrDevice or
// ErrConfig (negative warmup or total, minRatio outside [0, 1]).
func (e *Engine) ACTSchedule(scale, cursor *tensor.Tensor, warmup, total int, minRatio float64) error {
	if err := e.actCheck("lr scale", scale, actF32, 1); err != nil {
		return err
	}
	if err := e.actCheck("cursor", cursor, actI32, 1); err != nil {
		return err
	}
	if warmup < 0 || total < 0 || !(minRatio >= 0 && minRatio <= 1) {
		return fmt.Errorf("%w: act schedule warmup %d, total %d, min ratio %v", ErrConfig, warmup, total, minRatio)
	}
	return e.dispatch(func(*hostImpl) error {
		c, err := actHostI32(cursor)
		if err != nil {
			return err
		}
		out, err := scale.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		out[0] = float32(ACTScheduleScale(int(c[0])+1, warmup, total, minRatio))
		return nil
	}, func(c *cudaImpl) error {
		k := launch.ActArgs{LrScale: devPtr(scale), Cursor: devPtr(cursor), Warmup: float64(warmup), Total: float64(total), MinRatio: minRatio}
		return launch.ActSchedule(c, grid1(1), block1(32), 0, &k)
	})
}

// ACTScheduleScale is ACTSchedule's scale of 1-based step s, on the host.
func ACTScheduleScale(s, warmup, total int, minRatio float64) float64 {
	if float64(s) < float64(warmup) {
		return float64(s) / math.Max(1, float64(warmup))
	}
	p := float64(s-warmup) / math.Max(1, float64(total-warmup))
	return minRatio + math.Max(0, (1-minRatio)*0.5*(1+math.Cos(math.Pi*p)))
}

// ACTEvalArgs are ACTEval's tensors and settings.
type ACTEvalArgs struct {
	Q      *tensor.Tensor // [B, 2] f32 or bf16: the segment's (q_halt, q_continue)
	Pred   *tensor.Tensor // i32 [B, T]: the segment's predictions (ACTCorrect)
	Answer *tensor.Tensor // i32 [B, T]: each sequence's answer, frozen when it stops
	Done   *tensor.Tensor // i32 [B]: 1 once the sequence stopped (0 before the first segment)
	Used   *tensor.Tensor // i32 [B]: segments the sequence used (0 before it stops)
	Seg    *tensor.Tensor // i32 [1]: segments run before this one (0 before the first)
	// Cond (i32 [1]) receives the loop's flag: the number of sequences
	// still running, or 0 when none is or MaxSteps segments have run.
	Cond     *tensor.Tensor
	MaxSteps int
	// Halting stops a sequence at the first segment where q_halt >
	// q_continue (HRM's evaluation with halting); without it every
	// sequence runs MaxSteps segments.
	Halting bool
}

// ACTEval ends an evaluation segment (bench/reference/hrm.py evaluate, the
// reference's loop with halting decided on the device): with s = Seg + 1,
// every sequence not yet done stops where s ≥ MaxSteps or (Halting and
// q_halt > q_continue); those get Done = 1, Used = s and Answer = Pred.
// Then Seg = s and Cond = the number of sequences still running (0 once
// none is or s ≥ MaxSteps): the flag of a loop that runs segments while it
// is non-zero (ops.Engine.While). Sequences that stopped keep being
// computed by the caller (static shapes); their answers stay frozen. One
// block on CUDA. Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout, exec.ErrDevice or ErrConfig (MaxSteps < 1).
func (e *Engine) ACTEval(a ACTEvalArgs) error {
	if err := e.actCheck("q", a.Q, floatTypes); err != nil {
		return err
	}
	if a.Q.Rank() != 2 || a.Q.Dim(1) != 2 {
		return fmt.Errorf("%w: act q is %v, want [B, 2]", tensor.ErrShape, a.Q.Shape)
	}
	B := a.Q.Dim(0)
	if err := e.actCheck("pred", a.Pred, actI32); err != nil {
		return err
	}
	if a.Pred.Rank() != 2 || a.Pred.Dim(0) != B {
		return fmt.Errorf("%w: act pred is %v, want [%d, T]", tensor.ErrShape, a.Pred.Shape, B)
	}
	T := a.Pred.Dim(1)
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
		sh   []int
	}{{"answer", a.Answer, []int{B, T}}, {"done", a.Done, []int{B}}, {"used", a.Used, []int{B}},
		{"seg", a.Seg, []int{1}}, {"cond", a.Cond, []int{1}}} {
		if err := e.actCheck(c.what, c.t, actI32, c.sh...); err != nil {
			return err
		}
	}
	if a.MaxSteps < 1 {
		return fmt.Errorf("%w: act eval max steps %d", ErrConfig, a.MaxSteps)
	}
	if err := checkDims(B * T); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		q, err := hostIn(a.Q)
		if err != nil {
			return err
		}
		v := make([][]int32, 6)
		for i, t := range []*tensor.Tensor{a.Pred, a.Answer, a.Done, a.Used, a.Seg, a.Cond} {
			if v[i], err = actHostI32(t); err != nil {
				return err
			}
		}
		pred, answer, done, used, seg, cond := v[0], v[1], v[2], v[3], v[4], v[5]
		s := seg[0] + 1
		running := 0
		for b := 0; b < B; b++ {
			stop := int(s) >= a.MaxSteps || (a.Halting && q[2*b] > q[2*b+1])
			if stop && done[b] == 0 {
				done[b], used[b] = 1, s
				copy(answer[b*T:(b+1)*T], pred[b*T:(b+1)*T])
			}
			if done[b] == 0 {
				running++
			}
		}
		seg[0] = s
		cond[0] = 0
		if running > 0 && int(s) < a.MaxSteps {
			cond[0] = int32(running)
		}
		return nil
	}, func(c *cudaImpl) error {
		k := launch.ActArgs{Q: devPtr(a.Q), Pred: devPtr(a.Pred), Answer: devPtr(a.Answer), Done: devPtr(a.Done),
			Used: devPtr(a.Used), Seg: devPtr(a.Seg), Cond: devPtr(a.Cond), B: int32(B), T: int32(T),
			MaxSteps: int32(a.MaxSteps), Halting: lnBool(a.Halting)}
		return launch.ActEval(c, dtName(a.Q.DType), grid1(1), block1(1024), 0, &k)
	})
}

// PutPos writes src into position pos of every sequence of dx and zeros
// elsewhere, or adds src at pos leaving the rest with acc: the gradient of
// selecting x[:, pos, :] (Graph.LinearAt's backward):
//
//	dx[b, pos, :] (+)= src[b, :];   dx[b, t, :] = 0 for t ≠ pos (without acc)
//
// dx [B, T, C] f32 or bf16, last dimension contiguous (row strides free);
// src [B, C] of dx's dtype, contiguous. Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or ErrConfig (pos outside
// [0, T)).
func (e *Engine) PutPos(dx, src *tensor.Tensor, pos int, acc bool) error {
	if err := e.checkView("put pos dx", dx, false, floatTypes); err != nil {
		return err
	}
	if dx.Rank() != 3 {
		return fmt.Errorf("%w: put pos dx is %v, want [B, T, C]", tensor.ErrShape, dx.Shape)
	}
	B, T, C := dx.Dim(0), dx.Dim(1), dx.Dim(2)
	if err := e.checkView("put pos src", src, true, []tensor.DType{dx.DType}, B, C); err != nil {
		return err
	}
	if pos < 0 || pos >= T {
		return fmt.Errorf("%w: put pos %d of %d positions", ErrConfig, pos, T)
	}
	n := B * C
	if !acc {
		n *= T
	}
	if n == 0 {
		return nil
	}
	if err := checkDims(n, dx.Strides[0], dx.Strides[1]); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		s, err := hostIn(src)
		if err != nil {
			return err
		}
		out, commit, err := hostOut(dx, acc)
		if err != nil {
			return err
		}
		for b := 0; b < B; b++ {
			for t := 0; t < T; t++ {
				// Zeros elsewhere: the result without acc, and what
				// hostOut's commit adds the old values to with it.
				row := out[(b*T+t)*C : (b*T+t+1)*C]
				if t == pos {
					copy(row, s[b*C:(b+1)*C])
				} else {
					clear(row)
				}
			}
		}
		return commit()
	}, func(c *cudaImpl) error {
		k := launch.ActArgs{W: devPtr(dx), Z: devPtr(src), S0: int64(dx.Strides[0]), S1: int64(dx.Strides[1]),
			B: int32(B), T: int32(T), C: int32(C), Pos: int32(pos), Acc: lnBool(acc)}
		return launch.ActPut(c, dtName(dx.DType), gridFor(int64(n), 256), block1(256), 0, &k)
	})
}

// LinearAt records y = x[:, pos, :]·wᵀ + b, a linear layer applied at one
// position of every sequence (HRM's q_head on z_H[:, 0], the puzzle
// token's position; BERT's pooler reads its CLS token the same way): x
// [B, T, in] in the graph's activation dtype with the last dimension
// contiguous, w [out, in], b [out] or nil (cast under autocast as Linear's
// are), y [B, out] in the activation dtype, contiguous. The product reads
// the strided rows x[:, pos, :] directly (Matmul takes row strides); the
// backward writes x's gradient at pos and zeros elsewhere (PutPos, adding
// on fan-out), and w's and b's gradients (Linear's rules).
func (g *Graph) LinearAt(x *Var, pos int, w, b *Var) *Var {
	if !g.ok(x, w) {
		return nil
	}
	xv := x.Value
	if xv.Rank() != 3 || w.Value.Rank() != 2 || xv.Dim(2) != w.Value.Dim(1) || pos < 0 || pos >= xv.Dim(1) {
		g.Fail("linear_at", fmt.Errorf("%w: x %v at position %d, w %v", tensor.ErrShape, xv.Shape, pos, w.Value.Shape))
		return nil
	}
	dt := g.ActDType()
	if xv.DType != dt {
		g.Fail("linear_at", fmt.Errorf("%w: x is %v, the graph computes in %v", tensor.ErrDType, xv.DType, dt))
		return nil
	}
	w = g.Cast(w, dt)
	if b != nil {
		b = g.Cast(b, dt)
	}
	in := []*Var{x, w}
	if b != nil {
		in = append(in, b)
	}
	B, n := xv.Dim(0), w.Value.Dim(0)
	y := g.NewOut("linear_at", dt, B, n)
	dxp := g.NewOut("linear_at.dx", dt, B, xv.Dim(2)) // the gradient of x[:, pos, :] (a work buffer)
	if !g.ok(y, dxp) {
		return nil
	}
	rows, err := xv.Select(1, pos)
	if err != nil {
		g.Fail("linear_at", err)
		return nil
	}
	e := g.e
	g.Record("linear_at", in, []*Var{y}, func(*Grads) error {
		mm := Matmul{A: rows, B: w.Value, D: y.Value, TransB: true}
		if b != nil {
			mm.Bias = b.Value
		}
		return e.Matmul(mm)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil {
			return nil
		}
		if dx := gr.In(0); dx != nil {
			if err := e.Matmul(Matmul{A: dy, B: w.Value, D: dxp.Value}); err != nil {
				return err
			}
			if err := e.PutPos(dx, dxp.Value, pos, gr.Acc(0)); err != nil {
				return err
			}
		}
		mm := Matmul{A: dy, B: rows, D: gr.In(1), TransA: true, Accumulate: gr.Acc(1)}
		if b != nil && gr.In(2) != nil {
			if mm.D != nil && gr.Acc(2) == gr.Acc(1) {
				mm.BiasGrad = gr.In(2)
			} else if err := e.ColumnSum(gr.In(2), dy, gr.Acc(2)); err != nil {
				return err
			}
		}
		if mm.D == nil {
			return nil
		}
		return e.Matmul(mm)
	})
	return y
}
