package opstest

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "act", Check: checkACT}) }

// The float64 references of the act family, written from
// sapientinc/HRM's hrm_act_v1.py and ACTLossHead (and
// bench/reference/hrm.py's evaluate), each on plain slices.

// RefACTReset is where(halted[b], init, z[b]) over z [B, T, C].
func RefACTReset(z, init []float64, halted []int32, T, C int) []float64 {
	out := make([]float64, len(z))
	for i := range z {
		if halted[i/(T*C)] != 0 {
			out[i] = init[i%C]
		} else {
			out[i] = z[i]
		}
	}
	return out
}

// ACTRefBatch is a batch's ACT state on the host (ops.ACTBatch).
type ACTRefBatch struct {
	Halted, Steps  []int32
	Inputs, Labels []uint8 // [B, L]
	Cursor         int32
}

// RefACTLoad applies ops.Engine.ACTLoad to st (halted slots take row b of
// pool slot Cursor mod R, their steps restart) and returns the tokens and
// targets [B, L+1].
func RefACTLoad(st *ACTRefBatch, poolIn, poolLab []uint8, R, B, L, puzzleToken int) (tokens, targets []int32) {
	slot := int(st.Cursor) % R
	for b := 0; b < B; b++ {
		if st.Halted[b] == 0 {
			continue
		}
		st.Steps[b] = 0
		for i := 0; i < L; i++ {
			st.Inputs[b*L+i] = poolIn[(slot*B+b)*L+i]
			st.Labels[b*L+i] = poolLab[(slot*B+b)*L+i]
		}
	}
	for b := 0; b < B; b++ {
		tokens = append(tokens, int32(puzzleToken))
		targets = append(targets, -1)
		for i := 0; i < L; i++ {
			tokens = append(tokens, int32(st.Inputs[b*L+i]))
			targets = append(targets, int32(st.Labels[b*L+i]))
		}
	}
	return tokens, targets
}

// RefACTCorrect is ACTLossHead's is_correct and seq_is_correct over logits
// [B, T, V] (row-major): the first maximal index per row, the right cells
// among those with a target ≥ 0, and whether all of them are right.
func RefACTCorrect(logits []float64, targets []int32, B, T, V int) (pred, correct, exact []int32) {
	for b := 0; b < B; b++ {
		ok, valid := 0, 0
		for t := 0; t < T; t++ {
			row := logits[(b*T+t)*V : (b*T+t+1)*V]
			arg := 0
			for v := range row {
				if row[v] > row[arg] {
					arg = v
				}
			}
			pred = append(pred, int32(arg))
			if g := targets[b*T+t]; g >= 0 {
				valid++
				if g == int32(arg) {
					ok++
				}
			}
		}
		correct = append(correct, int32(ok))
		e := int32(0)
		if ok == valid {
			e = 1
		}
		exact = append(exact, e)
	}
	return pred, correct, exact
}

func refSigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// RefACTTargets is hrm_act_v1.py's Q targets: halt ← the sequence is
// exactly right; continue ← sigmoid of the next segment's q_halt at the
// last step, else of its larger Q.
func RefACTTargets(exact, steps []int32, qNext []float64, maxSteps int) []float64 {
	out := make([]float64, 2*len(exact))
	for b := range exact {
		if exact[b] != 0 {
			out[2*b] = 1
		}
		x := qNext[2*b]
		if int(steps[b])+1 < maxSteps {
			x = math.Max(qNext[2*b], qNext[2*b+1])
		}
		out[2*b+1] = refSigmoid(x)
	}
	return out
}

// RefACTHalt applies a training segment's halting to st (hrm_act_v1.py:
// steps + 1, halted at the limit or where q_halt > q_continue once
// min-halt steps are reached) and returns the metrics vector
// (ops.ACTLoss ... ops.ACTLRScale) as pretrain.py would print them.
func RefACTHalt(st *ACTRefBatch, q, qt []float64, correct, exact, minHalt []int32, R, cells, maxSteps int, explore bool, lm, ql, lr float64) []float64 {
	B := len(st.Halted)
	var count, acc, ex, qacc, steps, lh, lc float64
	bce := func(x, y float64) float64 { // −y log σ(x) − (1 − y) log(1 − σ(x))
		return -y*math.Log(refSigmoid(x)) - (1-y)*math.Log(1-refSigmoid(x))
	}
	for b := 0; b < B; b++ {
		st.Steps[b]++
		h := int(st.Steps[b]) >= maxSteps
		if explore {
			mh := int32(0)
			if R > 0 {
				mh = minHalt[(int(st.Cursor)%R)*B+b]
			}
			h = (h || q[2*b] > q[2*b+1]) && st.Steps[b] >= mh
		}
		st.Halted[b] = 0
		if h {
			st.Halted[b] = 1
			count++
			acc += float64(correct[b]) / float64(cells)
			ok := exact[b] != 0
			if ok {
				ex++
			}
			if (q[2*b] >= 0) == ok {
				qacc++
			}
			steps += float64(st.Steps[b])
		}
		lh += bce(q[2*b], qt[2*b])
		lc += bce(q[2*b+1], qt[2*b+1])
	}
	st.Cursor++
	n := math.Max(count, 1)
	return []float64{lm + ql, lm, lh / float64(B), lc / float64(B), count, acc / n, ex / n, qacc / n, steps / n, lr}
}

// RefACTSchedule is pretrain.py's cosine_schedule_with_warmup_lr_lambda
// divided by the base rate, at 1-based step s.
func RefACTSchedule(s, warmup, total int, minRatio float64) float64 {
	if s < warmup {
		return float64(s) / float64(max(1, warmup))
	}
	progress := float64(s-warmup) / float64(max(1, total-warmup))
	return minRatio + math.Max(0, (1-minRatio)*0.5*(1+math.Cos(math.Pi*progress)))
}

// ACTRefEval is an evaluation's state (hrm.py evaluate: done, used, pred).
type ACTRefEval struct {
	Done, Used, Answer []int32
	Seg                int32
}

// RefACTEval ends one evaluation segment with Q logits q and predictions
// pred [B, T], as hrm.py's evaluate does with halting decided per
// sequence, and returns the loop's flag.
func RefACTEval(ev *ACTRefEval, q []float64, pred []int32, T, maxSteps int, halting bool) int32 {
	s := ev.Seg + 1
	running := int32(0)
	for b := range ev.Done {
		stop := int(s) >= maxSteps || (halting && q[2*b] > q[2*b+1])
		if stop && ev.Done[b] == 0 {
			ev.Done[b], ev.Used[b] = 1, s
			copy(ev.Answer[b*T:(b+1)*T], pred[b*T:(b+1)*T])
		}
		if ev.Done[b] == 0 {
			running++
		}
	}
	ev.Seg = s
	if int(s) >= maxSteps {
		return 0
	}
	return running
}

// RefLinearAt is y[b] = x[b, pos]·wᵀ + bias for x [B, T, C], w [N, C].
func RefLinearAt(x, w, bias []float64, B, T, C, N, pos int) []float64 {
	y := make([]float64, B*N)
	for b := 0; b < B; b++ {
		for n := 0; n < N; n++ {
			var s float64
			for c := 0; c < C; c++ {
				s += x[(b*T+pos)*C+c] * w[n*C+c]
			}
			if bias != nil {
				s += bias[n]
			}
			y[b*N+n] = s
		}
	}
	return y
}

func checkACT(s *Suite) {
	for _, dt := range s.DTypes() {
		s.Run(fmt.Sprintf("%v/reset", dt), func(s *Suite) { actResetCase(s, dt) })
		s.Run(fmt.Sprintf("%v/correct", dt), func(s *Suite) { actCorrectCase(s, dt) })
		s.Run(fmt.Sprintf("%v/targets", dt), func(s *Suite) { actTargetsCase(s, dt) })
		for _, explore := range []bool{false, true} {
			for _, pool := range []bool{false, true} {
				s.Run(fmt.Sprintf("%v/halt/explore=%v,minhalt=%v", dt, explore, pool), func(s *Suite) { actHaltCase(s, dt, explore, pool) })
			}
		}
		for _, halting := range []bool{false, true} {
			s.Run(fmt.Sprintf("%v/eval/halting=%v", dt, halting), func(s *Suite) { actEvalCase(s, dt, halting) })
		}
		s.Run(fmt.Sprintf("%v/put", dt), func(s *Suite) { actPutCase(s, dt) })
		s.Run(fmt.Sprintf("%v/qloss", dt), func(s *Suite) { actQLossCase(s, dt) })
		for _, c := range []struct {
			pos   int
			bias  bool
			twice bool
		}{{0, true, false}, {0, true, true}, {3, false, false}, {4, true, true}} {
			s.Run(fmt.Sprintf("%v/linear_at/pos=%d,bias=%v,twice=%v", dt, c.pos, c.bias, c.twice), func(s *Suite) {
				actLinearAtCase(s, dt, c.pos, c.bias, c.twice)
			})
		}
	}
	s.Run("load", actLoadCase)
	s.Run("schedule", actScheduleCase)
	s.Run("validation", actValidation)
}

// actInts draws n integers in [lo, hi].
func actInts(s *Suite, n, lo, hi int) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(lo + s.R.IntN(hi-lo+1))
	}
	return v
}

func actBytes(s *Suite, n, lo, hi int) []uint8 {
	v := make([]uint8, n)
	for i := range v {
		v[i] = uint8(lo + s.R.IntN(hi-lo+1))
	}
	return v
}

func actEqual[T comparable](s *Suite, what string, got, want []T) {
	s.T.Helper()
	if !slices.Equal(got, want) {
		s.T.Errorf("%s: got %v, want %v", what, got, want)
	}
}

func actResetCase(s *Suite, dt tensor.DType) {
	const B, T, C = 5, 7, 12
	halted := actInts(s, B, 0, 1)
	halted[0], halted[1] = 1, 0
	z, zv := s.Rand(dt, 1, B, T, C)
	init, iv := s.Rand(tensor.F32, 1, C)
	h := UploadI32(s.T, s.A, halted, B)
	w := s.Empty(dt, B, T, C)
	s.NoErr("reset", s.E.ACTResetCarry(w, z, init, h))
	want := RefACTReset(zv, F64(tensor.RoundBF16(F32(iv))), halted, T, C)
	if dt == tensor.F32 {
		want = RefACTReset(zv, iv, halted, T, C)
	}
	s.Close("reset", s.Read(w), want, nil, 0)
	s.NoErr("reset in place", s.E.ACTResetCarry(z, z, init, h))
	s.Close("reset in place", s.Read(z), want, nil, 0)
}

func actLoadCase(s *Suite) {
	const R, B, L, V = 3, 6, 9, 11
	poolIn, poolLab := actBytes(s, R*B*L, 1, V-1), actBytes(s, R*B*L, 2, V-1)
	st := &ACTRefBatch{Halted: actInts(s, B, 0, 1), Steps: actInts(s, B, 0, 15), Inputs: actBytes(s, B*L, 1, V-1),
		Labels: actBytes(s, B*L, 2, V-1), Cursor: int32(7 + s.R.IntN(5))}
	st.Halted[0], st.Halted[1] = 1, 0
	b := ops.ACTBatch{Halted: UploadI32(s.T, s.A, st.Halted, B), Steps: UploadI32(s.T, s.A, st.Steps, B),
		Inputs: UploadU8(s.T, s.A, st.Inputs, B, L), Labels: UploadU8(s.T, s.A, st.Labels, B, L),
		Cursor: UploadI32(s.T, s.A, []int32{st.Cursor}, 1)}
	p := ops.ACTPool{Inputs: UploadU8(s.T, s.A, poolIn, R, B, L), Labels: UploadU8(s.T, s.A, poolLab, R, B, L)}
	tok, tg := s.Empty(tensor.I32, B, L+1), s.Empty(tensor.I32, B, L+1)
	s.NoErr("load", s.E.ACTLoad(tok, tg, b, p, V))
	wt, wg := RefACTLoad(st, poolIn, poolLab, R, B, L, V)
	actEqual(s, "tokens", DownloadI32(s.T, tok), wt)
	actEqual(s, "targets", DownloadI32(s.T, tg), wg)
	actEqual(s, "steps", DownloadI32(s.T, b.Steps), st.Steps)
	actEqual(s, "inputs", DownloadU8(s.T, b.Inputs), st.Inputs)
	actEqual(s, "labels", DownloadU8(s.T, b.Labels), st.Labels)
	actEqual(s, "cursor (unchanged)", DownloadI32(s.T, b.Cursor), []int32{st.Cursor})
}

func actCorrectCase(s *Suite, dt tensor.DType) {
	const B, T, V = 6, 10, 11
	// The logits are a [B, T, V] view of a wider [B, T, V+3] output (row
	// strides V+3), few distinct values so ties happen (the first wins).
	wide := s.Empty(dt, B, T, V+3)
	vals := make([]float32, B*T*(V+3))
	for i := range vals {
		vals[i] = float32(s.R.IntN(5)) - 2
	}
	s.NoErr("write", wide.WriteFloat32(vals))
	logits, err := wide.Narrow(2, 0, V)
	s.NoErr("narrow", err)
	lv := s.Read(logits)
	targets := actInts(s, B*T, -1, V-1)
	// Make sequences 0 and 1 exactly right (ignored cells included), and
	// sequence 2 right but for one cell.
	p0, _, _ := RefACTCorrect(lv, targets, B, T, V)
	for t := 0; t < T; t++ {
		for b := 0; b < 3; b++ {
			if targets[b*T+t] >= 0 {
				targets[b*T+t] = p0[b*T+t]
			}
		}
	}
	targets[2*T+1] = (p0[2*T+1] + 1) % V
	tg := UploadI32(s.T, s.A, targets, B, T)
	pred, correct, exact := s.Empty(tensor.I32, B, T), s.Empty(tensor.I32, B), s.Empty(tensor.I32, B)
	s.NoErr("correct", s.E.ACTCorrect(pred, correct, exact, logits, tg))
	wp, wc, we := RefACTCorrect(lv, targets, B, T, V)
	actEqual(s, "pred", DownloadI32(s.T, pred), wp)
	actEqual(s, "correct", DownloadI32(s.T, correct), wc)
	actEqual(s, "exact", DownloadI32(s.T, exact), we)
	if we[0] != 1 || we[2] != 0 {
		s.T.Errorf("the reference's exact flags %v: the case does not test what it means to", we)
	}
}

func actTargetsCase(s *Suite, dt tensor.DType) {
	const B, max = 9, 5
	qn, qv := s.Rand(dt, 3, B, 2)
	exact, steps := actInts(s, B, 0, 1), actInts(s, B, 0, max)
	steps[0], steps[1] = max-1, 0
	qt := s.Empty(tensor.F32, B, 2)
	s.NoErr("targets", s.E.ACTTargets(qt, UploadI32(s.T, s.A, exact, B), qn, UploadI32(s.T, s.A, steps, B), max))
	s.Close("targets", s.Read(qt), RefACTTargets(exact, steps, qv, max), nil, 1e-6)
}

func actHaltCase(s *Suite, dt tensor.DType, explore, withPool bool) {
	const R, B, cells, max = 3, 1100, 81, 6 // more sequences than the block's threads
	st := &ACTRefBatch{Halted: actInts(s, B, 0, 1), Steps: actInts(s, B, 0, max-1), Cursor: int32(s.R.IntN(10))}
	q, qv := s.Rand(dt, 2, B, 2)
	qtv := make([]float64, 2*B)
	for b := 0; b < B; b++ {
		qtv[2*b], qtv[2*b+1] = float64(s.R.IntN(2)), s.R.Float64()
	}
	correct, exact := actInts(s, B, 0, cells), actInts(s, B, 0, 1)
	var mh []int32
	args := ops.ACTHaltArgs{
		Batch: ops.ACTBatch{Halted: UploadI32(s.T, s.A, st.Halted, B), Steps: UploadI32(s.T, s.A, st.Steps, B),
			Cursor: UploadI32(s.T, s.A, []int32{st.Cursor}, 1)},
		Q: q, QT: Upload(s.T, s.A, F32(qtv), B, 2), Correct: UploadI32(s.T, s.A, correct, B),
		Exact: UploadI32(s.T, s.A, exact, B), Cells: cells, LMLoss: Upload(s.T, s.A, []float32{1.25}, 1),
		QLoss: Upload(s.T, s.A, []float32{0.5}, 1), LRScale: Upload(s.T, s.A, []float32{0.375}, 1),
		Metrics: s.Empty(tensor.F32, ops.ACTMetrics), MaxSteps: max, Explore: explore,
	}
	r := 0
	if withPool {
		r = R
		mh = actInts(s, R*B, 0, max)
		args.MinHalt = UploadI32(s.T, s.A, mh, R, B)
	}
	s.NoErr("halt", s.E.ACTHalt(args))
	want := RefACTHalt(st, qv, qtv, correct, exact, mh, r, cells, max, explore, 1.25, 0.5, 0.375)
	actEqual(s, "halted", DownloadI32(s.T, args.Batch.Halted), st.Halted)
	actEqual(s, "steps", DownloadI32(s.T, args.Batch.Steps), st.Steps)
	actEqual(s, "cursor", DownloadI32(s.T, args.Batch.Cursor), []int32{st.Cursor})
	s.Close("metrics", s.Read(args.Metrics), want, nil, 1e-6)
	if want[ops.ACTCount] == 0 || want[ops.ACTCount] == B {
		s.T.Errorf("count %v: the case does not test partial halting", want[ops.ACTCount])
	}
}

func actEvalCase(s *Suite, dt tensor.DType, halting bool) {
	const B, T, max = 1030, 4, 5
	ev := &ACTRefEval{Done: make([]int32, B), Used: make([]int32, B), Answer: make([]int32, B*T)}
	for i := range ev.Answer {
		ev.Answer[i] = -7
	}
	a := ops.ACTEvalArgs{Answer: UploadI32(s.T, s.A, ev.Answer, B, T), Done: UploadI32(s.T, s.A, ev.Done, B),
		Used: UploadI32(s.T, s.A, ev.Used, B), Seg: UploadI32(s.T, s.A, []int32{0}, 1), Cond: s.Empty(tensor.I32, 1),
		MaxSteps: max, Halting: halting}
	for seg := 0; seg < max; seg++ {
		q, qv := s.Rand(dt, 1, B, 2)
		// Bias q_continue up so that some sequences run several segments.
		for b := 0; b < B; b++ {
			qv[2*b+1] += 0.8
		}
		s.NoErr("write q", q.WriteFloat32(F32(qv)))
		qv = s.Read(q)
		pred := actInts(s, B*T, 0, 10)
		a.Q, a.Pred = q, UploadI32(s.T, s.A, pred, B, T)
		s.NoErr("eval", s.E.ACTEval(a))
		wc := RefACTEval(ev, qv, pred, T, max, halting)
		actEqual(s, fmt.Sprintf("segment %d cond", seg), DownloadI32(s.T, a.Cond), []int32{wc})
		actEqual(s, fmt.Sprintf("segment %d done", seg), DownloadI32(s.T, a.Done), ev.Done)
		actEqual(s, fmt.Sprintf("segment %d used", seg), DownloadI32(s.T, a.Used), ev.Used)
		actEqual(s, fmt.Sprintf("segment %d answer", seg), DownloadI32(s.T, a.Answer), ev.Answer)
		actEqual(s, fmt.Sprintf("segment %d seg", seg), DownloadI32(s.T, a.Seg), []int32{ev.Seg})
		if halting && seg == 0 && (wc == 0 || wc == B) {
			s.T.Errorf("segment 0 leaves %d of %d running: the case does not test partial halting", wc, B)
		}
	}
}

func actQLossCase(s *Suite, dt tensor.DType) {
	const B = 700
	const scale = 0.5 / B
	q, qv := s.Rand(dt, 3, B, 2)
	yv := make([]float64, 2*B)
	for i := range yv {
		if i%2 == 0 {
			yv[i] = float64(s.R.IntN(2))
		} else {
			yv[i] = s.R.Float64()
		}
	}
	y := Upload(s.T, s.A, F32(yv), B, 2)
	yv = s.Read(y)
	wantLoss, _ := RefBCE(qv, yv, scale)
	tl, tg := RefBCETerms(qv, yv, scale)
	grad := make([]float64, 2*B)
	for i := range grad {
		grad[i] = scale * (refSigmoid(qv[i]) - yv[i])
	}
	loss, dq := s.Empty(tensor.F32, 1), s.Empty(dt, B, 2)
	s.NoErr("qloss", s.E.ACTQLoss(loss, dq, q, y, scale, false))
	s.Close("loss", s.Read(loss), []float64{wantLoss}, []float64{tl}, 1e-6)
	s.Close("dq", s.Read(dq), grad, tg, s.Tol(dt))
	old := s.Read(dq)
	s.NoErr("qloss (acc)", s.E.ACTQLoss(nil, dq, q, y, scale, true))
	s.Close("dq (acc)", s.Read(dq), lnSum(grad, old), Sum(tg, old), s.Tol(dt))
	// Where the continue target is σ of the very logit it trains (ACTTargets
	// from the same Q, q_continue ≥ q_halt, not the last segment), the
	// gradient is exactly 0, as PyTorch's f32 arithmetic makes it.
	qv[0], qv[1] = -5, -5
	qv[2], qv[3] = -1, 0.5
	s.NoErr("write q", q.WriteFloat32(F32(qv)))
	steps := make([]int32, B)
	s.NoErr("targets", s.E.ACTTargets(y, UploadI32(s.T, s.A, make([]int32, B), B), q, UploadI32(s.T, s.A, steps, B), 4))
	s.NoErr("qloss", s.E.ACTQLoss(nil, dq, q, y, scale, false))
	g := s.Read(dq)
	if g[1] != 0 || g[3] != 0 {
		s.T.Errorf("q_continue gradients %v, %v where the target is σ of the logit itself: want exactly 0", g[1], g[3])
	}
	if g[0] == 0 || g[2] == 0 {
		s.T.Error("a q_halt gradient is 0")
	}
	s.Run("grad", func(s *Suite) {
		const B = 5
		yc := Upload(s.T, s.A, F32(yv[:2*B]), B, 2)
		s.LossGradCheck(LossCase{
			Name: "act_q_loss", DType: dt, Params: [][]int{{B, 2}}, Scale: 3, Consts: []*tensor.Tensor{yc},
			Record: func(g *ops.Graph, p, c []*ops.Var) []*ops.Var {
				return []*ops.Var{g.ACTQLoss(p[0], c[0], 0.5)}
			},
			Ref: func(p [][]float64) float64 { l, _ := RefBCE(p[0], yv[:2*B], 0.5); return l },
		})
	})
}

func actPutCase(s *Suite, dt tensor.DType) {
	const B, T, C, pos = 3, 5, 6, 2
	src, sv := s.Rand(dt, 1, B, C)
	// dx is a [B, T, C] view of a [B, T, C+2] buffer (row strides C+2).
	wide, _ := s.Rand(dt, 1, B, T, C+2)
	dx, err := wide.Narrow(2, 0, C)
	s.NoErr("narrow", err)
	old := s.Read(dx)
	pad, err := wide.Narrow(2, C, 2)
	s.NoErr("narrow", err)
	padv := s.Read(pad)
	for _, acc := range []bool{true, false} {
		want := make([]float64, B*T*C)
		for b := 0; b < B; b++ {
			for t := 0; t < T; t++ {
				for c := 0; c < C; c++ {
					i := (b*T+t)*C + c
					if acc {
						want[i] = old[i]
					}
					if t == pos {
						want[i] += sv[b*C+c]
					}
				}
			}
		}
		s.NoErr("put", s.E.PutPos(dx, src, pos, acc))
		// want = old (with acc) + src at pos: the terms are the two.
		terms := Abs(want)
		if acc {
			terms = Sum(lnSum(want, Scaled(-1, old)), old)
		}
		s.Close(fmt.Sprintf("put (acc %v)", acc), s.Read(dx), want, terms, s.Tol(dt))
		old = s.Read(dx)
	}
	s.Close("the columns beside dx (untouched)", s.Read(pad), padv, nil, 0)
}

func actLinearAtCase(s *Suite, dt tensor.DType, pos int, bias, twice bool) {
	const B, T, C, N = 3, 5, 8, 2
	params := [][]int{{B, T, C}, {N, C}}
	if bias {
		params = append(params, []int{N})
	}
	s.GradCheck(GradCase{
		Name: "linear_at", DType: dt, Params: params, Twice: twice, TolF: s.GemmTol(dt),
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var {
			var b *ops.Var
			if bias {
				b = p[2]
			}
			return g.LinearAt(p[0], pos, p[1], b)
		},
		Ref: func(p [][]float64) []float64 {
			var b []float64
			if bias {
				b = p[2]
			}
			return RefLinearAt(p[0], p[1], b, B, T, C, N, pos)
		},
	})
}

func actScheduleCase(s *Suite) {
	scale, cursor := s.Empty(tensor.F32, 1), s.Empty(tensor.I32, 1)
	for _, c := range []struct {
		cur, warmup, total int
		min                float64
	}{{0, 2000, 100000, 1}, {1998, 2000, 100000, 1}, {1999, 2000, 100000, 1}, {5000, 2000, 100000, 1},
		{0, 0, 10, 1}, {7, 4, 20, 0.1}, {19, 4, 20, 0.1}, {40, 4, 20, 0}, {3, 10, 20, 0.5}} {
		s.NoErr("write", cursor.Write(tensor.AsBytes([]int32{int32(c.cur)})))
		s.NoErr("schedule", s.E.ACTSchedule(scale, cursor, c.warmup, c.total, c.min))
		want := RefACTSchedule(c.cur+1, c.warmup, c.total, c.min)
		s.Close(fmt.Sprintf("scale at cursor %d of %+v", c.cur, c), s.Read(scale), []float64{want}, nil, 1e-7)
		if got := ops.ACTScheduleScale(c.cur+1, c.warmup, c.total, c.min); math.Abs(got-want) > 1e-12 {
			s.T.Errorf("ACTScheduleScale(%d, %+v) = %v, want %v", c.cur+1, c, got, want)
		}
	}
}

func actValidation(s *Suite) {
	const B, T, C = 2, 3, 4
	w, z := s.Empty(tensor.F32, B, T, C), s.Empty(tensor.BF16, B, T, C)
	init, h := s.Empty(tensor.F32, C), s.Empty(tensor.I32, B)
	q := s.Empty(tensor.F32, B, 2)
	i32 := func(shape ...int) *tensor.Tensor { return s.Empty(tensor.I32, shape...) }
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"reset of two dtypes", s.E.ACTResetCarry(w, z, init, h), tensor.ErrDType},
		{"reset init of another width", s.E.ACTResetCarry(w, w, s.Empty(tensor.F32, C+1), h), tensor.ErrShape},
		{"reset halted f32", s.E.ACTResetCarry(w, w, init, s.Empty(tensor.F32, B)), tensor.ErrDType},
		{"targets with max 0", s.E.ACTTargets(s.Empty(tensor.F32, B, 2), i32(B), q, i32(B), 0), ops.ErrConfig},
		{"targets q of 3 columns", s.E.ACTTargets(s.Empty(tensor.F32, B, 2), i32(B), s.Empty(tensor.F32, B, 3), i32(B), 4), tensor.ErrShape},
		{"correct with targets of another shape", s.E.ACTCorrect(i32(B, T), i32(B), i32(B), w, i32(B, T+1)), tensor.ErrShape},
		{"schedule with min ratio 2", s.E.ACTSchedule(s.Empty(tensor.F32, 1), i32(1), 10, 100, 2), ops.ErrConfig},
		{"halt without metrics", s.E.ACTHalt(ops.ACTHaltArgs{Batch: ops.ACTBatch{Halted: i32(B), Steps: i32(B), Cursor: i32(1)},
			Q: q, QT: s.Empty(tensor.F32, B, 2), Correct: i32(B), Exact: i32(B), Cells: 81, MaxSteps: 16}), tensor.ErrShape},
		{"halt with 0 cells", s.E.ACTHalt(ops.ACTHaltArgs{Batch: ops.ACTBatch{Halted: i32(B), Steps: i32(B), Cursor: i32(1)},
			Q: q, QT: s.Empty(tensor.F32, B, 2), Correct: i32(B), Exact: i32(B), Metrics: s.Empty(tensor.F32, ops.ACTMetrics),
			MaxSteps: 16}), ops.ErrConfig},
		{"eval pred of another batch", s.E.ACTEval(ops.ACTEvalArgs{Q: q, Pred: i32(B+1, T), Answer: i32(B, T), Done: i32(B),
			Used: i32(B), Seg: i32(1), Cond: i32(1), MaxSteps: 16}), tensor.ErrShape},
		{"put at position T", s.E.PutPos(w, s.Empty(tensor.F32, B, C), T, false), ops.ErrConfig},
		{"put src of another dtype", s.E.PutPos(w, s.Empty(tensor.BF16, B, C), 0, false), tensor.ErrDType},
		{"q loss target bf16", s.E.ACTQLoss(nil, nil, q, s.Empty(tensor.BF16, B, 2), 1, false), tensor.ErrDType},
		{"q loss infinite scale", s.E.ACTQLoss(nil, nil, q, s.Empty(tensor.F32, B, 2), float32(math.Inf(1)), false), ops.ErrConfig},
		{"load pool of rank 2", s.E.ACTLoad(i32(B, T), i32(B, T), ops.ACTBatch{}, ops.ACTPool{Inputs: s.Empty(tensor.U8, B, T-1),
			Labels: s.Empty(tensor.U8, B, T-1)}, 11), tensor.ErrShape},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			s.T.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	for _, v := range s.Read(w) {
		if !math.IsNaN(v) {
			s.T.Fatal("a rejected call wrote w")
		}
	}
}
