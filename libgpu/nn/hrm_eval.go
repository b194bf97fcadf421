package nn

import (
	"errors"
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// HRMEval evaluates an HRM on batches of puzzles at a static batch B, as
// bench/reference/hrm.py's evaluate does: every sequence starts from
// H_init, L_init and runs segments (full cycles, no gradients) until it
// halts — at the first segment whose q_halt > q_continue (with halting),
// or at HaltMaxSteps — and keeps that segment's answer; the loop ends when
// every sequence has halted. Sequences that halted keep being computed
// (static shapes) with their answers frozen.
//
// Two forms of the loop: Segment is the loop body, one function whose
// work is all on the device (a segment, its heads, ops.ACTCorrect and
// ops.ACTEval, which sets the loop's flag), run by ops.Engine.While — a
// conditional WHILE node of one CUDA graph when captured (Capture,
// HRMEvalOptions.Graph); hostRun is the reference's host loop, which
// reads the Q logits after every segment and decides halting on the host.
type HRMEval struct {
	m   *HRM
	e   *ops.Engine
	in  *hrmInner
	own bool // in is this evaluation's own

	batch              ops.ACTBatch
	pool               ops.ACTPool
	targets            *tensor.Tensor // i32 [B, T]
	logits, q          *tensor.Tensor // [B, T, V], [B, 2] in the compute dtype
	pred, answer       *tensor.Tensor // i32 [B, T]
	correct, exact     *tensor.Tensor // i32 [B]
	done, used         *tensor.Tensor // i32 [B]
	seg, cond          *tensor.Tensor // i32 [1]
	halting            bool
	warm               bool                   // a batch ran eagerly (kernels compiled)
	graphs             [2]*exec.CapturedGraph // Capture's, by halting (Graph)
	hInit, lInit, ones *tensor.Tensor
	owned              owned
}

// NewEval builds an evaluation of m at batch B with activations in dt
// (tensor.F32 or BF16) and a gradient-free core of its own (HRMTrain's
// Evaluator shares the training step's instead).
func (m *HRM) NewEval(e *ops.Engine, a device.Allocator, prefix string, batch int, dt tensor.DType) (*HRMEval, error) {
	if dt == 0 {
		dt = tensor.F32
	}
	in, err := newHRMInner(m, e, a, prefix+"/inner", batch, dt)
	if err != nil {
		return nil, err
	}
	ev, err := m.newEval(e, a, prefix, in, true)
	if err != nil {
		in.free()
		return nil, err
	}
	return ev, nil
}

func (m *HRM) newEval(e *ops.Engine, a device.Allocator, prefix string, in *hrmInner, own bool) (ev *HRMEval, err error) {
	c := m.cfg
	B, T, L, V, dt := in.B, c.Positions(), c.SeqLen, c.Vocab, in.dt
	ev = &HRMEval{m: m, e: e, in: in, owned: owned{a: a, prefix: prefix}}
	defer func() {
		if err != nil {
			ev.owned.free()
			ev = nil
		}
	}()
	alloc := func(name string, dt tensor.DType, shape ...int) *tensor.Tensor {
		if err != nil {
			return nil
		}
		var x *tensor.Tensor
		x, err = ev.owned.alloc("acts", name, dt, shape...)
		return x
	}
	ev.batch = ops.ACTBatch{Halted: alloc("eval.ones", tensor.I32, B), Steps: alloc("eval.steps", tensor.I32, B),
		Inputs: alloc("eval.inputs", tensor.U8, B, L), Labels: alloc("eval.labels", tensor.U8, B, L),
		Cursor: alloc("eval.cursor", tensor.I32, 1)}
	ev.pool = ops.ACTPool{Inputs: alloc("eval.pool.inputs", tensor.U8, 1, B, L), Labels: alloc("eval.pool.labels", tensor.U8, 1, B, L)}
	ev.targets = alloc("eval.targets", tensor.I32, B, T)
	ev.logits, ev.q = alloc("eval.logits", dt, B, T, V), alloc("eval.q", dt, B, 2)
	ev.pred, ev.answer = alloc("eval.pred", tensor.I32, B, T), alloc("eval.answer", tensor.I32, B, T)
	ev.correct, ev.exact = alloc("eval.correct", tensor.I32, B), alloc("eval.exact", tensor.I32, B)
	ev.done, ev.used = alloc("eval.done", tensor.I32, B), alloc("eval.used", tensor.I32, B)
	ev.seg, ev.cond = alloc("eval.seg", tensor.I32, 1), alloc("eval.cond", tensor.I32, 1)
	if err != nil {
		return ev, err
	}
	ones := make([]int32, B)
	for i := range ones {
		ones[i] = 1
	}
	if err = ev.batch.Halted.Write(tensor.AsBytes(ones)); err != nil {
		return ev, err
	}
	if err = ev.batch.Cursor.Write(make([]byte, 4)); err != nil {
		return ev, err
	}
	ev.ones = ev.batch.Halted
	hi, _ := m.Param("inner.H_init")
	li, _ := m.Param("inner.L_init")
	ev.hInit, ev.lInit = hi.Value, li.Value
	ev.own = own
	return ev, nil
}

// Batch is the evaluation's static batch.
func (ev *HRMEval) Batch() int { return ev.in.B }

// load writes n puzzles' tokens (inputs and labels n·SeqLen each; labels
// may be nil) into the batch, rows from n on repeating row 0.
func (ev *HRMEval) load(inputs, labels []uint8, n int) error {
	c := ev.m.cfg
	B, L := ev.in.B, c.SeqLen
	if n < 1 || n > B || len(inputs) != n*L || (labels != nil && len(labels) != n*L) {
		return fmt.Errorf("%w: %d puzzles of %d inputs and %d labels for a batch of %d", ErrHRMConfig, n, len(inputs), len(labels), B)
	}
	pad := func(v []uint8) []uint8 {
		out := make([]uint8, B*L)
		copy(out, v)
		for r := n; r < B; r++ {
			copy(out[r*L:(r+1)*L], v[:L])
		}
		return out
	}
	if labels == nil {
		labels = make([]uint8, n*L)
	}
	for _, v := range [][]uint8{inputs, labels} {
		for _, x := range v {
			if int(x) >= c.Vocab {
				return fmt.Errorf("%w: token %d outside the vocabulary of %d", ErrHRMConfig, x, c.Vocab)
			}
		}
	}
	if err := ev.e.Sync(); err != nil {
		return err
	}
	if err := ev.pool.Inputs.Write(pad(inputs)); err != nil {
		return err
	}
	return ev.pool.Labels.Write(pad(labels))
}

// start queues the beginning of a batch's evaluation: the compute
// weights, the tokens and targets, the carry at H_init, L_init, the
// embedding, and the loop state (nothing done, the flag at B).
func (ev *HRMEval) start() error {
	e, in := ev.e, ev.in
	if err := ev.m.castWeights(e); err != nil {
		return err
	}
	if err := e.ACTLoad(in.tokens, ev.targets, ev.batch, ev.pool, ev.m.cfg.PuzzleToken()); err != nil {
		return err
	}
	if err := e.ACTResetCarry(in.zH, in.zH, ev.hInit, ev.ones); err != nil {
		return err
	}
	if err := e.ACTResetCarry(in.zL, in.zL, ev.lInit, ev.ones); err != nil {
		return err
	}
	if err := in.embed.Forward(); err != nil {
		return err
	}
	for _, z := range []*tensor.Tensor{ev.done, ev.used, ev.seg} {
		if err := e.Fill(z, 0); err != nil {
			return err
		}
	}
	return e.Fill(ev.cond, float64(in.B))
}

// forward queues one segment and its heads: the logits, the Q logits and
// the per-cell predictions.
func (ev *HRMEval) forward() error {
	in := ev.in
	if err := in.cycles(true); err != nil {
		return err
	}
	if err := in.lmHead(ev.logits); err != nil {
		return err
	}
	if err := in.qHead(ev.q); err != nil {
		return err
	}
	return ev.e.ACTCorrect(ev.pred, ev.correct, ev.exact, ev.logits, ev.targets)
}

// Segment is the evaluation loop's body: one segment, then
// ops.Engine.ACTEval (sequences that halt freeze their answers; the flag
// becomes the number still running, 0 once none is or HaltMaxSteps
// segments have run). All of it is queued on the device with no host
// work, so a conditional WHILE node can hold it (Capture).
func (ev *HRMEval) Segment() error {
	if err := ev.forward(); err != nil {
		return err
	}
	return ev.e.ACTEval(ops.ACTEvalArgs{Q: ev.q, Pred: ev.pred, Answer: ev.answer, Done: ev.done, Used: ev.used,
		Seg: ev.seg, Cond: ev.cond, MaxSteps: ev.m.cfg.HaltMaxSteps, Halting: ev.halting})
}

// batchLoop queues the evaluation of the loaded batch: start, then the
// segment loop as ops.Engine.While over the flag ACTEval sets (it clears
// the flag once every sequence has stopped or HaltMaxSteps segments have
// run, so the loop needs no count). Outside a capture While runs the loop
// from the host, reading the flag after each segment; inside
// ops.Engine.Capture it is one conditional WHILE node whose body is
// Segment, so a replay evaluates the batch with no host round trip.
func (ev *HRMEval) batchLoop() error {
	if err := ev.start(); err != nil {
		return err
	}
	return ev.e.While(ev.cond, nil, 0, ev.Segment)
}

// run queues (and, eagerly, runs) the evaluation of the loaded batch.
func (ev *HRMEval) run() error { return ev.e.Do(ev.batchLoop) }

// Capture captures the evaluation of one loaded batch (start and the
// whole segment loop, a conditional WHILE node on a GPU) as one graph, for
// exec.CapturedGraph.Launch after each load: a launch evaluates the batch
// with halting decided on the device and no host synchronisation until
// its results are read. On the host backend the "graph" replays the
// function. Run the evaluation once eagerly first (Evaluate), so kernels
// are compiled, GEMM algorithms chosen and While's condition kernel
// loaded before the capture. The caller closes the graph.
func (ev *HRMEval) Capture(halting bool) (*exec.CapturedGraph, error) {
	ev.halting = halting
	return ev.e.Capture(ev.batchLoop)
}

// hostRun is the reference's loop (hrm.py evaluate): after every segment
// the host reads the Q logits and predictions and decides which sequences
// stop (halting: q_halt > q_continue; always at HaltMaxSteps), keeps their
// answers, and ends when all have stopped. Answers [B, T] and segments
// used [B] are returned.
func (ev *HRMEval) hostRun() (answer, used []int32, err error) {
	e, c := ev.e, ev.m.cfg
	B, T := ev.in.B, c.Positions()
	answer, used = make([]int32, B*T), make([]int32, B)
	err = e.Do(func() error {
		if err := ev.start(); err != nil {
			return err
		}
		done := make([]bool, B)
		left := B
		for s := 1; s <= c.HaltMaxSteps && left > 0; s++ {
			if err := ev.forward(); err != nil {
				return err
			}
			if err := e.Sync(); err != nil {
				return err
			}
			q, err := ev.q.ReadFloat32()
			if err != nil {
				return err
			}
			pb, err := ev.pred.Read()
			if err != nil {
				return err
			}
			pred := tensor.BytesAs[int32](pb)
			for b := 0; b < B; b++ {
				if done[b] || !(s >= c.HaltMaxSteps || (ev.halting && q[2*b] > q[2*b+1])) {
					continue
				}
				done[b], used[b] = true, int32(s)
				copy(answer[b*T:(b+1)*T], pred[b*T:(b+1)*T])
				left--
			}
		}
		return nil
	})
	return answer, used, err
}

// HRMEvalOptions choose an evaluation's loop.
type HRMEvalOptions struct {
	// Halting stops each sequence at its first segment with q_halt >
	// q_continue; without it every sequence runs HaltMaxSteps segments.
	Halting bool
	// Host runs the reference's host loop (hostRun: the host reads the Q
	// logits after every segment) instead of the device loop (Segment
	// under ops.Engine.While).
	Host bool
	// Graph, on a GPU, evaluates each batch as one replay of a captured
	// graph (Capture: the segment loop a conditional WHILE node): the
	// first batch of the evaluation's life runs eagerly, the loop driven
	// from the host, and the graph of each halting mode is captured once
	// and replayed for every later batch. Ignored with Host; on the host
	// backend the "graph" replays the same functions (the same results).
	Graph bool
}

// HRMEvalResult is an evaluation's outcome over N puzzles.
type HRMEvalResult struct {
	Puzzles       int
	ExactAccuracy float64 // puzzles with every cell right (0 without labels)
	CellAccuracy  float64 // cells right (0 without labels)
	MeanSegments  float64
	Answers       []uint8 // [N, SeqLen] predicted tokens
	Segments      []int32 // [N] segments each used
}

// Evaluate runs puzzles through the model in batches of B: inputs (and
// labels, or nil to only solve) are N·SeqLen tokens row-major. The last
// batch is padded with copies of its first puzzle, which are not counted.
func (ev *HRMEval) Evaluate(inputs, labels []uint8, o HRMEvalOptions) (HRMEvalResult, error) {
	c := ev.m.cfg
	B, L, T := ev.in.B, c.SeqLen, c.Positions()
	if len(inputs) == 0 || len(inputs)%L != 0 || (labels != nil && len(labels) != len(inputs)) {
		return HRMEvalResult{}, fmt.Errorf("%w: %d input and %d label tokens (want a positive multiple of %d each)",
			ErrHRMConfig, len(inputs), len(labels), L)
	}
	N := len(inputs) / L
	r := HRMEvalResult{Puzzles: N, Answers: make([]uint8, N*L), Segments: make([]int32, N)}
	ev.halting = o.Halting
	var exact, cells, segs int
	for lo := 0; lo < N; lo += B {
		n := min(B, N-lo)
		var lab []uint8
		if labels != nil {
			lab = labels[lo*L : (lo+n)*L]
		}
		if err := ev.load(inputs[lo*L:(lo+n)*L], lab, n); err != nil {
			return r, err
		}
		var answer, used []int32
		var err error
		switch {
		case o.Host:
			answer, used, err = ev.hostRun()
		case o.Graph && ev.warm:
			if err = ev.launch(o.Halting); err == nil {
				answer, used, err = ev.results()
			}
		default:
			if err = ev.run(); err == nil {
				ev.warm = true
				answer, used, err = ev.results()
			}
		}
		if err != nil {
			return r, err
		}
		for b := 0; b < n; b++ {
			ok := true
			for i := 0; i < L; i++ {
				p := answer[b*T+1+i]
				r.Answers[(lo+b)*L+i] = uint8(p)
				if lab != nil {
					if p == int32(lab[b*L+i]) {
						cells++
					} else {
						ok = false
					}
				}
			}
			if lab != nil && ok {
				exact++
			}
			r.Segments[lo+b] = used[b]
			segs += int(used[b])
		}
	}
	if labels != nil {
		r.ExactAccuracy, r.CellAccuracy = float64(exact)/float64(N), float64(cells)/float64(N*L)
	}
	r.MeanSegments = float64(segs) / float64(N)
	return r, nil
}

// launch replays the captured evaluation of the loaded batch, capturing
// it first for this halting mode.
func (ev *HRMEval) launch(halting bool) error {
	k := 0
	if halting {
		k = 1
	}
	if ev.graphs[k] == nil {
		g, err := ev.Capture(halting)
		if err != nil {
			return err
		}
		ev.graphs[k] = g
	}
	return ev.graphs[k].Launch()
}

// results waits for the device and reads the answers and segments used.
func (ev *HRMEval) results() (answer, used []int32, err error) {
	if err := ev.e.Sync(); err != nil {
		return nil, nil, err
	}
	a, err := ev.answer.Read()
	if err != nil {
		return nil, nil, err
	}
	u, err := ev.used.Read()
	if err != nil {
		return nil, nil, err
	}
	return append([]int32(nil), tensor.BytesAs[int32](a)...), append([]int32(nil), tensor.BytesAs[int32](u)...), nil
}

// Solve answers puzzles (N·SeqLen input tokens) with halting: the
// predicted tokens and the segments each used.
func (ev *HRMEval) Solve(inputs []uint8) (answers []uint8, segments []int32, err error) {
	r, err := ev.Evaluate(inputs, nil, HRMEvalOptions{Halting: true})
	return r.Answers, r.Segments, err
}

// Free releases the evaluation's buffers (and its core when it has its
// own).
func (ev *HRMEval) Free() error {
	var errs []error
	for i, g := range ev.graphs {
		if g != nil {
			errs = append(errs, g.Close())
			ev.graphs[i] = nil
		}
	}
	errs = append(errs, ev.owned.free())
	if ev.own {
		errs = append(errs, ev.in.free())
	}
	return errors.Join(errs...)
}
