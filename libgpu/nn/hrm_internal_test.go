package nn

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// tinyHRM is a configuration small enough for float64 references and
// finite differences on the CPU: every feature of the default (two
// cycles of each level, several L blocks, RoPE over heads of 8).
func tinyHRM() HRMConfig {
	return HRMConfig{Hidden: 16, Heads: 2, HLayers: 1, LLayers: 2, HCycles: 2, LCycles: 2, Expansion: 4,
		HaltMaxSteps: 4, HaltExplorationProb: 0.1, Vocab: 11, SeqLen: 6, NumPuzzleIDs: 1, RopeTheta: 10000, RMSEps: 1e-5}
}

type noopStep struct{}

func (noopStep) Step(*ops.Engine) error { return nil }

func hostEngine(t testing.TB) (*ops.Engine, device.Allocator) {
	t.Helper()
	d := device.NewHost()
	e, err := ops.NewEngine(d, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e, device.Local{Dev: d}
}

// randomHRM is a model of cfg whose every trained weight is drawn (the Q
// head and the puzzle embedding too, which start at constants), so every
// gradient is generic; it returns the float64 reference of the weights.
func randomHRM(t testing.TB, a device.Allocator, cfg HRMConfig, seed uint64) (*HRM, *refHRM) {
	t.Helper()
	m, err := NewHRM(a, "", cfg, true, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Free() })
	r := rand.New(rand.NewPCG(seed, 1))
	ref := &refHRM{c: cfg, w: map[string][]float64{}}
	for _, p := range m.Params() {
		v, err := p.Value.ReadF32()
		if err != nil {
			t.Fatal(err)
		}
		v = append([]float32(nil), v...)
		switch p.Name {
		case "inner.q_head.weight", "inner.puzzle_emb.weights":
			for i := range v {
				v[i] = float32(0.3 * r.NormFloat64())
			}
		case "inner.q_head.bias":
			v[0], v[1] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		if err := p.Value.WriteF32(v); err != nil {
			t.Fatal(err)
		}
		w := make([]float64, len(v))
		for i, x := range v {
			w[i] = float64(x)
		}
		ref.w[p.Name] = w
	}
	return m, ref
}

// sequenceData draws B puzzles of L cells: inputs in [1, V), labels in
// [2, V) (Sudoku's token ranges), and the model's tokens and targets.
func sequenceData(r *rand.Rand, cfg HRMConfig, B int) (inputs, labels []uint8, tokens, targets []int32) {
	L := cfg.SeqLen
	for b := 0; b < B; b++ {
		tokens, targets = append(tokens, int32(cfg.PuzzleToken())), append(targets, -1)
		for i := 0; i < L; i++ {
			in, lab := uint8(1+r.IntN(cfg.Vocab-1)), uint8(2+r.IntN(cfg.Vocab-2))
			inputs, labels = append(inputs, in), append(labels, lab)
			tokens, targets = append(tokens, int32(in)), append(targets, int32(lab))
		}
	}
	return inputs, labels, tokens, targets
}

func readF64(t testing.TB, x *tensor.Tensor) []float64 {
	t.Helper()
	v, err := x.ReadFloat32()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(v))
	for i, f := range v {
		out[i] = float64(f)
	}
	return out
}

func relDiff(a, b []float64) float64 {
	var num, den float64
	for i := range a {
		num += (a[i] - b[i]) * (a[i] - b[i])
		den += b[i] * b[i]
	}
	if math.IsNaN(num) {
		return math.Inf(1)
	}
	return math.Sqrt(num / math.Max(den, 1e-300))
}

// TestHRMOneStepGradient: a tiny HRM's training step (f32, host) against
// the float64 reference: the loss, and the gradient of every trained
// tensor against central finite differences of the loss as a function of
// the weights through the segment's last L and H updates only, the state
// those start from (the earlier, gradient-free updates) held constant —
// along the gradient's own direction and at sampled coordinates. The
// same differences of the fully unrolled segment (no state held) must
// disagree, or the check could not tell the one-step gradient from
// backpropagation through every cycle.
func TestHRMOneStepGradient(t *testing.T) {
	cfg := tinyHRM()
	const B = 2
	seed := opstest.TestSeed(t)
	e, a := hostEngine(t)
	m, ref := randomHRM(t, a, cfg, seed)
	tr, err := m.NewTrain(e, a, "", HRMTrainConfig{Batch: B, PoolSlots: 1, LRMinRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Free()
	tr.SetOptimizers(noopStep{})
	r := rand.New(rand.NewPCG(seed, 2))
	inputs, labels, tokens, targets := sequenceData(r, cfg, B)
	if err := tr.Stage(0, inputs, labels, nil); err != nil {
		t.Fatal(err)
	}
	if err := tr.Step(); err != nil {
		t.Fatal(err)
	}
	met, err := tr.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	qt := readF64(t, tr.qt)
	T, V := cfg.Positions(), cfg.Vocab

	// The reference's state before the last updates, from the weights
	// at which the step ran; held fixed below.
	x0 := ref.embed(tokens, B, T)
	h0, l0 := ref.init(B, T)
	h0, l0 = ref.cycles(h0, l0, x0, B, T, false)
	oneStep := func() float64 {
		h, _ := ref.last(h0, l0, ref.embed(tokens, B, T), B, T)
		lg, q := ref.heads(h, B, T)
		lm, ql := refLoss(lg, q, qt, targets, B, T, V)
		return lm + ql
	}
	unrolled := func() float64 {
		x := ref.embed(tokens, B, T)
		h, l := ref.init(B, T)
		h, _ = ref.cycles(h, l, x, B, T, true)
		lg, q := ref.heads(h, B, T)
		lm, ql := refLoss(lg, q, qt, targets, B, T, V)
		return lm + ql
	}
	{
		h, _ := ref.last(h0, l0, x0, B, T)
		lg, q := ref.heads(h, B, T)
		lm, ql := refLoss(lg, q, qt, targets, B, T, V)
		if d := math.Abs(met.LMLoss - lm); d > 1e-5*math.Max(1, lm) {
			t.Errorf("lm loss %v, reference %v", met.LMLoss, lm)
		}
		if d := math.Abs(met.Loss - (lm + ql)); d > 1e-5*math.Max(1, lm+ql) {
			t.Errorf("loss %v, reference %v", met.Loss, lm+ql)
		}
	}
	grad := readF64(t, m.FlatGrad())
	fdAlong := func(f func() float64, w, dir []float64, h float64) float64 {
		old := append([]float64(nil), w...)
		for i := range w {
			w[i] = old[i] + h*dir[i]
		}
		up := f()
		for i := range w {
			w[i] = old[i] - h*dir[i]
		}
		dn := f()
		copy(w, old)
		return (up - dn) / (2 * h)
	}
	unrolledDiffers := 0
	for _, p := range append(m.AdamParams(), m.SignParams()...) {
		lt := m.layout[m.byName[p.Name]]
		g := grad[lt.Offset : lt.Offset+lt.Numel()]
		w := ref.w[p.Name]
		var gn, gmax float64
		for _, v := range g {
			gn += v * v
			gmax = math.Max(gmax, math.Abs(v))
		}
		gn = math.Sqrt(gn)
		if gn == 0 {
			t.Errorf("%s: zero gradient", p.Name)
			continue
		}
		dir := make([]float64, len(g))
		for i := range g {
			dir[i] = g[i] / gn
		}
		// h = 1e-4: the float64 reference's central difference errs by
		// O(h²): at 1e-3 by 1.2e-4 of the norm for seed
		// 4715248455193233099 (1 run in 150 failed), at 1e-4 by 4e-8.
		if fd := fdAlong(oneStep, w, dir, 1e-4); math.Abs(fd-gn) > 1e-4*gn {
			t.Errorf("%s: the derivative along the gradient is %.6g, the gradient's norm %.6g", p.Name, fd, gn)
		}
		if fd := fdAlong(unrolled, w, dir, 1e-3); math.Abs(fd-gn) > 2e-2*gn {
			unrolledDiffers++
		}
		for k := 0; k < 4; k++ {
			i := r.IntN(len(g))
			e := make([]float64, len(g))
			e[i] = 1
			if fd := fdAlong(oneStep, w, e, 1e-4); math.Abs(fd-g[i]) > 2e-4*gmax {
				t.Errorf("%s[%d]: gradient %.6g, finite difference %.6g (largest |gradient| %.3g)", p.Name, i, g[i], fd, gmax)
			}
		}
	}
	if unrolledDiffers < 5 {
		t.Errorf("the unrolled segment's derivatives differ from the one-step gradient in only %d tensors", unrolledDiffers)
	}
}

// TestHRMTargetsAndEvalForward: the step's Q-continue targets are σ of
// the larger Q of a full, gradient-free segment from the new carry (the
// reference's second forward), the halt targets whether each sequence is
// exactly right; and an evaluation's first segment gives the reference's
// logits and Q logits.
func TestHRMTargetsAndEvalForward(t *testing.T) {
	cfg := tinyHRM()
	const B = 3
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	e, a := hostEngine(t)
	m, ref := randomHRM(t, a, cfg, seed)
	T, V := cfg.Positions(), cfg.Vocab
	r := rand.New(rand.NewPCG(seed, 3))
	inputs, labels, tokens, targets := sequenceData(r, cfg, B)

	// A third of the labels are what the reference predicts at the first
	// segment, sequence 0's all of them: one exact sequence.
	x := ref.embed(tokens, B, T)
	h, l := ref.init(B, T)
	h, l = ref.cycles(h, l, x, B, T, false)
	h, l = ref.last(h, l, x, B, T)
	lg, _ := ref.heads(h, B, T)
	argmax := func(row []float64) int32 {
		best := 0
		for v := range row {
			if row[v] > row[best] {
				best = v
			}
		}
		return int32(best)
	}
	for b := 0; b < B; b++ {
		for i := 1; i < T; i++ {
			if b == 0 || r.IntN(3) == 0 {
				p := argmax(lg[(b*T+i)*V : (b*T+i+1)*V])
				if p < 2 { // keep labels in the label range; sequence 0 then cannot be exact
					p = 2
				}
				labels[b*cfg.SeqLen+i-1], targets[b*T+i] = uint8(p), p
			}
		}
	}
	tr, err := m.NewTrain(e, a, "", HRMTrainConfig{Batch: B, PoolSlots: 1, LRMinRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Free()
	tr.SetOptimizers(noopStep{})
	if err := tr.Stage(0, inputs, labels, nil); err != nil {
		t.Fatal(err)
	}
	if err := tr.Step(); err != nil {
		t.Fatal(err)
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	h2, l2 := ref.cycles(h, l, x, B, T, true)
	_, qn := ref.heads(h2, B, T)
	want := make([]float64, 2*B)
	for b := 0; b < B; b++ {
		ok := 1.0
		for i := 1; i < T; i++ {
			if argmax(lg[(b*T+i)*V:(b*T+i+1)*V]) != targets[b*T+i] {
				ok = 0
			}
		}
		want[2*b] = ok
		want[2*b+1] = 1 / (1 + math.Exp(-math.Max(qn[2*b], qn[2*b+1])))
	}
	_ = l2
	got := readF64(t, tr.qt)
	if d := relDiff(got, want); d > 1e-5 {
		t.Errorf("Q targets %v, reference %v (relative difference %.3g)", got, want, d)
	}
	if got[0] != 1 && want[0] == 1 {
		t.Error("sequence 0 is exactly right but its halt target is not 1")
	}

	ev, err := m.NewEval(e, a, "eval", B, tensor.F32)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Free()
	if err := ev.load(inputs, labels, B); err != nil {
		t.Fatal(err)
	}
	if err := e.Do(func() error {
		if err := ev.start(); err != nil {
			return err
		}
		return ev.forward()
	}); err != nil {
		t.Fatal(err)
	}
	// The model trained nothing (no optimizer), so the first evaluation
	// segment is the training step's.
	wl, wq := ref.heads(h, B, T)
	if d := relDiff(readF64(t, ev.logits), wl); d > 1e-5 {
		t.Errorf("evaluation logits differ from the reference by %.3g", d)
	}
	if d := relDiff(readF64(t, ev.q), wq); d > 1e-5 {
		t.Errorf("evaluation Q logits differ from the reference by %.3g", d)
	}
}

// TestHRMHaltingRefillsSlots: the step halts a slot at halt_max_steps, or
// where q_halt > q_continue once the exploration draw's minimum is met,
// and a halted slot takes row b of the next step's batch while the others
// keep their puzzle — all decided on the device.
func TestHRMHaltingRefillsSlots(t *testing.T) {
	cfg := tinyHRM()
	cfg.HaltMaxSteps = 3
	const B = 4
	e, a := hostEngine(t)
	m, err := NewHRM(a, "", cfg, true, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	tr, err := m.NewTrain(e, a, "", HRMTrainConfig{Batch: B, PoolSlots: 2, LRMinRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Free()
	tr.SetOptimizers(noopStep{})
	r := rand.New(rand.NewPCG(5, 5))
	var batches [][]int32
	step := func(minHalt []int32) (halted, steps []int32) {
		t.Helper()
		inputs, labels, tokens, _ := sequenceData(r, cfg, B)
		batches = append(batches, tokens)
		if err := tr.Stage(tr.Queued(), inputs, labels, minHalt); err != nil {
			t.Fatal(err)
		}
		if err := tr.Step(); err != nil {
			t.Fatal(err)
		}
		h, s, err := tr.Halted()
		if err != nil {
			t.Fatal(err)
		}
		return h, s
	}
	tokensNow := func() []int32 {
		v, err := tr.in.tokens.I32()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	T := cfg.Positions()
	row := func(v []int32, b int) []int32 { return v[b*T : (b+1)*T] }
	// The initial Q head (weight 0, bias −5, −5) never asks to halt:
	// every slot runs halt_max_steps = 3 segments on its first puzzle.
	for s := 1; s <= 3; s++ {
		h, st := step(nil)
		wantH := []int32{0, 0, 0, 0}
		if s == 3 {
			wantH = []int32{1, 1, 1, 1}
		}
		if !slices.Equal(h, wantH) || !slices.Equal(st, []int32{int32(s), int32(s), int32(s), int32(s)}) {
			t.Fatalf("after step %d: halted %v, steps %v", s, h, st)
		}
		for b := 0; b < B; b++ {
			if !slices.Equal(row(tokensNow(), b), row(batches[0], b)) {
				t.Fatalf("step %d: slot %d does not hold its first puzzle", s, b)
			}
		}
	}
	// Now q_halt > q_continue everywhere: slots halt after one segment,
	// except slot 1, whose exploration draw asks for 2.
	q, _ := m.Param("inner.q_head.bias")
	if err := q.Value.WriteF32([]float32{1, -1}); err != nil {
		t.Fatal(err)
	}
	h, st := step([]int32{0, 2, 0, 0})
	if !slices.Equal(h, []int32{1, 0, 1, 1}) || !slices.Equal(st, []int32{1, 1, 1, 1}) {
		t.Fatalf("step 4: halted %v, steps %v", h, st)
	}
	for b := 0; b < B; b++ {
		if !slices.Equal(row(tokensNow(), b), row(batches[3], b)) {
			t.Fatalf("step 4: slot %d did not take its new puzzle", b)
		}
	}
	h, st = step([]int32{0, 2, 0, 0})
	if !slices.Equal(h, []int32{1, 1, 1, 1}) || !slices.Equal(st, []int32{1, 2, 1, 1}) {
		t.Fatalf("step 5: halted %v, steps %v", h, st)
	}
	got := tokensNow()
	for b := 0; b < B; b++ {
		want := batches[4]
		if b == 1 { // slot 1 ran on: it keeps step 4's puzzle
			want = batches[3]
		}
		if !slices.Equal(row(got, b), row(want, b)) {
			t.Fatalf("step 5: slot %d holds the wrong puzzle", b)
		}
	}
	met, err := tr.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if met.Count != B || met.Steps != 1.25 || met.Step != 5 {
		t.Errorf("step 5 metrics %+v: want count %d, mean steps 1.25", met, B)
	}
}

// TestHRMEvalLoops: the evaluation's device loop (Segment under
// ops.Engine.While, halting decided by ops.ACTEval), eager and captured
// (Evaluate with Graph), gives the answers and segment counts of the
// reference's host loop, with halting (sequences stopping
// at different segments) and without (every one running HaltMaxSteps);
// the last batch is padded and its padding not counted.
func TestHRMEvalLoops(t *testing.T) {
	cfg := tinyHRM()
	cfg.SeqLen = 9
	e, a := hostEngine(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	m, err := NewHRM(a, "", cfg, false, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	r := rand.New(rand.NewPCG(seed, 1))
	qw, _ := m.Param("inner.q_head.weight")
	w := make([]float32, qw.Value.Numel())
	for i := range w {
		w[i] = float32(0.5 * r.NormFloat64())
	}
	if err := qw.Value.WriteF32(w); err != nil {
		t.Fatal(err)
	}
	ev, err := m.NewEval(e, a, "eval", 4, tensor.F32)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Free()
	const N = 11
	var in, lab []uint8
	for i := 0; i < N*cfg.SeqLen; i++ {
		in, lab = append(in, uint8(1+r.IntN(cfg.Vocab-1))), append(lab, uint8(2+r.IntN(cfg.Vocab-2)))
	}
	// A q_halt bias at which about half the sequences of the first batch
	// halt after the first segment and the others run on.
	if err := ev.load(in[:4*cfg.SeqLen], lab[:4*cfg.SeqLen], 4); err != nil {
		t.Fatal(err)
	}
	if err := e.Do(func() error {
		if err := ev.start(); err != nil {
			return err
		}
		return ev.forward()
	}); err != nil {
		t.Fatal(err)
	}
	q := readF64(t, ev.q)
	var d []float64
	for b := 0; b < 4; b++ {
		d = append(d, q[2*b]-q[2*b+1])
	}
	slices.Sort(d)
	qb, _ := m.Param("inner.q_head.bias")
	if err := qb.Value.WriteF32([]float32{float32(-(d[1] + d[2]) / 2), 0}); err != nil {
		t.Fatal(err)
	}
	for _, halting := range []bool{true, false} {
		dev, err := ev.Evaluate(in, lab, HRMEvalOptions{Halting: halting})
		if err != nil {
			t.Fatal(err)
		}
		host, err := ev.Evaluate(in, lab, HRMEvalOptions{Halting: halting, Host: true})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(dev.Answers, host.Answers) || !slices.Equal(dev.Segments, host.Segments) ||
			dev.CellAccuracy != host.CellAccuracy || dev.MeanSegments != host.MeanSegments {
			t.Errorf("halting %v: device loop segments %v, accuracy %v; host loop %v, %v", halting, dev.Segments,
				dev.CellAccuracy, host.Segments, host.CellAccuracy)
		}
		// Evaluate with Graph: every batch one launch of the captured
		// evaluation (on the host backend, the functions replayed).
		gr, err := ev.Evaluate(in, lab, HRMEvalOptions{Halting: halting, Graph: true})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(gr.Answers, host.Answers) || !slices.Equal(gr.Segments, host.Segments) {
			t.Errorf("halting %v: captured evaluation segments %v, host loop %v", halting, gr.Segments, host.Segments)
		}
		if ev.graphs[map[bool]int{false: 0, true: 1}[halting]] == nil {
			t.Errorf("halting %v: Evaluate with Graph captured nothing", halting)
		}
		if dev.Puzzles != N || len(dev.Answers) != N*cfg.SeqLen {
			t.Errorf("%d puzzles, %d answer cells", dev.Puzzles, len(dev.Answers))
		}
		distinct := map[int32]bool{}
		for _, s := range dev.Segments {
			distinct[s] = true
		}
		if halting && len(distinct) < 2 {
			t.Errorf("with halting every sequence used %v segments: the case does not test halting", dev.Segments)
		}
		if !halting && (len(distinct) != 1 || !distinct[int32(cfg.HaltMaxSteps)]) {
			t.Errorf("without halting the segments are %v, want %d each", dev.Segments, cfg.HaltMaxSteps)
		}
		// The captured form of a batch's evaluation (on the host backend,
		// the function replayed) gives the first batch's results again.
		g, err := ev.Capture(halting)
		if err != nil {
			t.Fatal(err)
		}
		if err := ev.load(in[:4*cfg.SeqLen], lab[:4*cfg.SeqLen], 4); err != nil {
			t.Fatal(err)
		}
		if err := g.Launch(); err != nil {
			t.Fatal(err)
		}
		answer, used, err := ev.results()
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
		T := cfg.Positions()
		for b := 0; b < 4; b++ {
			if used[b] != dev.Segments[b] || !slices.Equal(toU8(answer[b*T+1:(b+1)*T]), dev.Answers[b*cfg.SeqLen:(b+1)*cfg.SeqLen]) {
				t.Errorf("halting %v: the captured evaluation differs on sequence %d", halting, b)
			}
		}
	}
}

func toU8(v []int32) []uint8 {
	out := make([]uint8, len(v))
	for i, x := range v {
		out[i] = uint8(x)
	}
	return out
}
