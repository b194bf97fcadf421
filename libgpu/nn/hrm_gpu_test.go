package nn_test

// GPU-machine tests of the HRM: the captured training step equals the
// eager one, the device evaluation loop equals the host loop on CUDA, and
// step-by-step parity with bench/reference/hrm.py (PyTorch) from the same
// initial weights on the same replayed batches — on the GPU at the
// default architecture (f32 and bf16) and, needing only torch, on the CPU
// at a tiny one.

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/data/sudoku"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// hrmScript is the PyTorch reference; the GPU bundle, which has no source
// tree, carries it in testdata/ (scripts/gpu-files.txt).
const hrmScript = "../../bench/reference/hrm.py"

func hrmScriptPath() string {
	if _, err := os.Stat(hrmScript); err == nil {
		return hrmScript
	}
	return filepath.Join("testdata", filepath.Base(hrmScript))
}

// requireTorch skips without python3, torch and safetensors, unless the
// machine must have them (GPUKIT_REQUIRE_GPU=1: the GPU machine), where
// it fails.
func requireTorch(t *testing.T) {
	t.Helper()
	if err := exec.Command("python3", "-c", "import torch, safetensors").Run(); err != nil {
		if os.Getenv(cudatest.EnvRequireGPU) == "1" {
			t.Fatalf("python3 with torch and safetensors is required here: %v", err)
		}
		t.Skipf("no python3 with torch and safetensors: %v", err)
	}
}

func hrmGPU(t testing.TB, prec ops.Precision) (*ops.Engine, device.Allocator) {
	t.Helper()
	cudatest.RequireGPU(t)
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	e, err := ops.NewEngine(d, ops.Options{Precision: prec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
	})
	return e, device.Local{Dev: d}
}

// hrmTrainer is an HRM training step with the reference's optimizers
// (AdamATan2 β (0.9, 0.95), sign-SGD on the puzzle embedding, weight decay
// 1 on both) at rate lr.
type hrmTrainer struct {
	m    *nn.HRM
	tr   *nn.HRMTrain
	adam *optim.AdamATan2
}

func newHRMTrainer(t testing.TB, e *ops.Engine, a device.Allocator, m *nn.HRM, cfg nn.HRMTrainConfig, lr float32) *hrmTrainer {
	t.Helper()
	tr, err := m.NewTrain(e, a, "train", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Free() })
	adam, err := optim.NewAdamATan2(a, "train", m.AdamParams(), ops.AdamATan2Config{LR: lr, Beta1: 0.9, Beta2: 0.95,
		WeightDecay: 1, LRScale: tr.LRScale()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adam.Free() })
	sign, err := optim.NewSignSGD(m.SignParams(), ops.SignSGDConfig{LR: lr, WeightDecay: 1, LRScale: tr.LRScale()})
	if err != nil {
		t.Fatal(err)
	}
	tr.SetOptimizers(adam, sign)
	return &hrmTrainer{m: m, tr: tr, adam: adam}
}

// replay draws a replay of steps batches of B from a set of 64 test
// puzzles with 10 augmentations each (the exploration draws of the
// reference's probability 0.1).
func replay(t testing.TB, seed uint64, B, steps, maxSteps int) *sudoku.Replay {
	t.Helper()
	set := sudokuSet(rand.New(rand.NewPCG(seed, 11)), 64, 0.5)
	r, err := sudoku.NewReplay(set, sudoku.ReplayConfig{Sampler: sudoku.Sampler{N: 64, Batch: B, Seed: seed,
		Aug: sudoku.Augmenter{Seed: seed + 1, NumAug: 10}}, Steps: steps, Prob: 0.1, MaxSteps: maxSteps})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// stage stages step s of the replay.
func stage(t testing.TB, tr *nn.HRMTrain, r *sudoku.Replay, s int) {
	t.Helper()
	lo, hi := s*r.Batch, (s+1)*r.Batch
	if err := tr.Stage(s, gridTokens(r.Inputs[lo:hi]), gridTokens(r.Labels[lo:hi]), r.MinHaltSteps[lo:hi]); err != nil {
		t.Fatal(err)
	}
}

func metricVector(m nn.HRMMetrics) []float64 {
	return []float64{m.Loss, m.LMLoss, m.QHaltLoss, m.QContinueLoss, float64(m.Count), m.Accuracy, m.ExactAccuracy,
		m.QHaltAccuracy, m.Steps, m.LRScale}
}

func relErr32(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if math.IsNaN(num) {
		return math.Inf(1)
	}
	return math.Sqrt(num / math.Max(den, 1e-300))
}

// TestHRMGPUGraphEqualsEager: the default HRM in bf16 at batch 32 trains
// 6 steps on one engine twice from the same weights and batches: op by op,
// and with steps 2–6 replays of the step captured as one CUDA graph. Every
// step's metrics and the final weights and optimizer moments agree.
func TestHRMGPUGraphEqualsEager(t *testing.T) {
	e, a := hrmGPU(t, ops.PrecBF16)
	cfg := nn.DefaultHRM()
	const B, steps = 32, 6
	r := replay(t, 3, B, steps, cfg.HaltMaxSteps)
	run := func(graph bool) ([][]float64, []float32, []float32) {
		m, err := nn.NewHRM(a, "", cfg, true, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Free()
		h := newHRMTrainer(t, e, a, m, nn.HRMTrainConfig{Batch: B, Autocast: tensor.BF16, PoolSlots: 2, Warmup: 2,
			LRMinRatio: 1, Graph: graph}, 1e-4)
		var mets [][]float64
		for s := 0; s < steps; s++ {
			stage(t, h.tr, r, s)
			if err := h.tr.Run(); err != nil {
				t.Fatal(err)
			}
			met, err := h.tr.Metrics()
			if err != nil {
				t.Fatal(err)
			}
			mets = append(mets, metricVector(met))
		}
		w, err := m.Flat().ReadF32()
		if err != nil {
			t.Fatal(err)
		}
		st := h.adam.State()[1] // the first weight's exp_avg_sq
		v, err := st.Value.ReadF32()
		if err != nil {
			t.Fatal(err)
		}
		return mets, slices.Clone(w), slices.Clone(v)
	}
	em, ew, ev := run(false)
	gm, gw, gv := run(true)
	for s := range em {
		if !slices.Equal(gm[s], em[s]) {
			t.Errorf("step %d: graph metrics %v, eager %v", s+1, gm[s], em[s])
		}
	}
	if d := relErr32(gw, ew); d > 0 {
		t.Errorf("final weights: graph vs eager relative difference %.3g", d)
	}
	if d := relErr32(gv, ev); d > 0 {
		t.Errorf("final exp_avg_sq: graph vs eager relative difference %.3g", d)
	}
	if slices.Equal(em[0], em[steps-1]) {
		t.Error("the metrics did not change over the run")
	}
}

// TestHRMGPUEvalLoops: on CUDA at the default architecture in bf16, the
// device loop's answers and segment counts equal the reference's host
// loop's, with and without halting.
func TestHRMGPUEvalLoops(t *testing.T) {
	e, a := hrmGPU(t, ops.PrecBF16)
	cfg := nn.DefaultHRM()
	m, err := nn.NewHRM(a, "", cfg, false, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	ev, err := m.NewEval(e, a, "eval", 64, tensor.BF16)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Free()
	set := sudokuSet(rand.New(rand.NewPCG(4, 4)), 100, 0.5)
	in, lab := gridTokens(set.Inputs), gridTokens(set.Labels)
	haltingQHead(t, m, ev, in, lab, 2)
	for _, halting := range []bool{true, false} {
		dev, err := ev.Evaluate(in, lab, nn.HRMEvalOptions{Halting: halting})
		if err != nil {
			t.Fatal(err)
		}
		host, err := ev.Evaluate(in, lab, nn.HRMEvalOptions{Halting: halting, Host: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("halting %v: mean segments %.3f, cell accuracy %.4f", halting, dev.MeanSegments, dev.CellAccuracy)
		if !slices.Equal(dev.Answers, host.Answers) || !slices.Equal(dev.Segments, host.Segments) {
			t.Errorf("halting %v: device loop segments %v, host loop %v", halting, dev.Segments, host.Segments)
		}
	}
}

// haltingQHead gives m a Q head (weights N(0, 0.05²), drawn from seed)
// under which the reference's host loop (halting) stops the puzzles at
// more than one segment count, so a test of the device loop tests
// halting: the first segment's carry is H_init for every sequence, so its
// Q logits nearly agree across sequences and about half the draws halt
// them all there (a GPU machine, 2026-11-28, and the host engine alike).
// Draws are tried in turn, at most 16.
func haltingQHead(t *testing.T, m *nn.HRM, ev *nn.HRMEval, in, lab []uint8, seed uint64) {
	t.Helper()
	qw, _ := m.Param("inner.q_head.weight")
	w := make([]float32, qw.Value.Numel())
	for k := uint64(0); k < 16; k++ {
		rq := rand.New(rand.NewPCG(seed, 2+k))
		for i := range w {
			w[i] = float32(0.05 * rq.NormFloat64())
		}
		if err := qw.Value.WriteF32(w); err != nil {
			t.Fatal(err)
		}
		r, err := ev.Evaluate(in, lab, nn.HRMEvalOptions{Halting: true, Host: true})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Min(r.Segments) < slices.Max(r.Segments) {
			t.Logf("Q head draw %d: segments %d to %d", k, slices.Min(r.Segments), slices.Max(r.Segments))
			return
		}
	}
	t.Fatal("no Q head of 16 draws halts the puzzles at different segments")
}

// TestHRMGPUEvalCaptured: on CUDA at the default architecture in bf16,
// the evaluation captured as one graph per batch (Evaluate with Graph:
// the segment loop a conditional WHILE node whose flag ops.ACTEval sets
// on the device; the first batch eager, the later ones replays) gives the
// answers and segment counts of the reference's host loop, with halting
// (sequences stopping at different segments) and without (16 each), over
// 150 puzzles in batches of 64 (the last one padded).
func TestHRMGPUEvalCaptured(t *testing.T) {
	e, a := hrmGPU(t, ops.PrecBF16)
	cfg := nn.DefaultHRM()
	m, err := nn.NewHRM(a, "", cfg, false, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	ev, err := m.NewEval(e, a, "eval", 64, tensor.BF16)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Free()
	set := sudokuSet(rand.New(rand.NewPCG(seed, 4)), 150, 0.5)
	in, lab := gridTokens(set.Inputs), gridTokens(set.Labels)
	haltingQHead(t, m, ev, in, lab, seed)
	for _, halting := range []bool{true, false} {
		host, err := ev.Evaluate(in, lab, nn.HRMEvalOptions{Halting: halting, Host: true})
		if err != nil {
			t.Fatal(err)
		}
		graph, err := ev.Evaluate(in, lab, nn.HRMEvalOptions{Halting: halting, Graph: true})
		if err != nil {
			t.Fatal(err)
		}
		distinct := map[int32]bool{}
		for _, s := range graph.Segments {
			distinct[s] = true
		}
		t.Logf("halting %v: mean segments %.3f (%d distinct counts), cell accuracy %.4f", halting, graph.MeanSegments,
			len(distinct), graph.CellAccuracy)
		if !slices.Equal(graph.Answers, host.Answers) || !slices.Equal(graph.Segments, host.Segments) {
			t.Errorf("halting %v: captured evaluation segments %v, host loop %v", halting, graph.Segments, host.Segments)
		}
		if halting && len(distinct) < 2 {
			t.Errorf("with halting every sequence used %v segments: the case does not test halting", graph.Segments)
		}
		if !halting && (len(distinct) != 1 || !distinct[int32(cfg.HaltMaxSteps)]) {
			t.Errorf("without halting the segments are %v, want %d each", graph.Segments, cfg.HaltMaxSteps)
		}
	}
}

// hrmPyLine is one line of hrm.py parity.
type hrmPyLine struct {
	Step          int     `json:"step"`
	LR            float64 `json:"lr"`
	Loss          float64 `json:"loss"`
	LMLoss        float64 `json:"lm_loss"`
	QHaltLoss     float64 `json:"q_halt_loss"`
	QContinueLoss float64 `json:"q_continue_loss"`
	Count         int     `json:"count"`
	Accuracy      float64 `json:"accuracy"`
	Halted        int     `json:"halted"`
}

// hrmParity trains cfg's HRM on a replay of `steps` batches of B in Go
// (engine e, activations dt, the step captured when graph) and with
// `hrm.py parity` on pyDevice from the same initial weights — written by
// hrm.py init when torchInit, else by Go — and compares every step's
// losses (relative error tol) and halted counts (exact).
func hrmParity(t *testing.T, e *ops.Engine, a device.Allocator, cfg nn.HRMConfig, dt tensor.DType, B, steps int, tol float64, torchInit, graph, twin bool, pyDevice string) {
	t.Helper()
	dir := t.TempDir()
	seed := rand.Uint64() % (1 << 31)
	t.Logf("seed %d", seed)
	initPath, replayPath := filepath.Join(dir, "init.safetensors"), filepath.Join(dir, "replay.safetensors")
	r := replay(t, seed, B, steps, cfg.HaltMaxSteps)
	if err := r.Save(replayPath); err != nil {
		t.Fatal(err)
	}
	py := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command("python3", append([]string{hrmScriptPath()}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("hrm.py %s: %v\n%s%s", args[0], err, out, stderr)
		}
		return out
	}
	arch := []string{"--hidden", strconv.Itoa(cfg.Hidden), "--heads", strconv.Itoa(cfg.Heads), "--h-layers", strconv.Itoa(cfg.HLayers),
		"--l-layers", strconv.Itoa(cfg.LLayers), "--h-cycles", strconv.Itoa(cfg.HCycles), "--l-cycles", strconv.Itoa(cfg.LCycles),
		"--expansion", strconv.FormatFloat(cfg.Expansion, 'g', -1, 64), "--halt-max-steps", strconv.Itoa(cfg.HaltMaxSteps)}
	var m *nn.HRM
	var err error
	if torchInit {
		py(append([]string{"init", "--out", initPath, "--seed", strconv.FormatUint(seed, 10)}, arch...)...)
		f, err := ckpt.ReadFile(initPath)
		if err != nil {
			t.Fatal(err)
		}
		if m, err = nn.LoadHRM(a, "", f, true); err != nil {
			t.Fatal(err)
		}
		if m.Config() != cfg {
			t.Fatalf("hrm.py init wrote %+v, want %+v", m.Config(), cfg)
		}
	} else {
		if m, err = nn.NewHRM(a, "", cfg, true, seed); err != nil {
			t.Fatal(err)
		}
		if err := m.SaveWeights(initPath, nil); err != nil {
			t.Fatal(err)
		}
	}
	defer m.Free()
	const lr, warmup = 1e-4, 10
	pyDT := "f32"
	if dt == tensor.BF16 {
		pyDT = "bf16"
	}
	parity := func(extra ...string) []hrmPyLine {
		out := py(append([]string{"parity", "--init", initPath, "--replay", replayPath, "--dtype", pyDT, "--device", pyDevice,
			"--lr", fmt.Sprint(lr), "--puzzle-emb-lr", fmt.Sprint(lr), "--warmup", strconv.Itoa(warmup)}, extra...)...)
		var lines []hrmPyLine
		for _, ln := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var l hrmPyLine
			if err := json.Unmarshal([]byte(ln), &l); err != nil {
				t.Fatalf("hrm.py line %q: %v", ln, err)
			}
			lines = append(lines, l)
		}
		if len(lines) != steps {
			t.Fatalf("hrm.py %v printed %d steps, want %d", extra, len(lines), steps)
		}
		return lines
	}
	want := parity()
	// With twin, hrm.py runs again with its attention on SDPA's math
	// backend (one rounding changed), and the run is held to
	// opstest.DriftBound: tol while the twin agrees with hrm.py, then
	// DriftFactor × the twin's drift; halted counts are compared while the
	// twin halts as hrm.py does.
	var other []hrmPyLine
	if twin {
		other = parity("--sdpa", "math")
	}
	drift := opstest.DriftBound{Floor: tol}
	halting := true
	h := newHRMTrainer(t, e, a, m, nn.HRMTrainConfig{Batch: B, Autocast: dt, PoolSlots: 4, Warmup: warmup, LRMinRatio: 1, Graph: graph}, lr)
	worst := 0.0
	for s := 0; s < steps; s++ {
		stage(t, h.tr, r, s)
		if err := h.tr.Run(); err != nil {
			t.Fatal(err)
		}
		got, err := h.tr.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		w := want[s]
		rel := func(g, x float64) float64 { return math.Abs(g-x) / math.Max(math.Abs(x), 1e-3) }
		e := max(rel(got.Loss, w.Loss), rel(got.LMLoss, w.LMLoss), rel(got.QHaltLoss, w.QHaltLoss), rel(got.QContinueLoss, w.QContinueLoss))
		worst = max(worst, e)
		if twin {
			o := other[s]
			eo := max(rel(o.Loss, w.Loss), rel(o.LMLoss, w.LMLoss), rel(o.QHaltLoss, w.QHaltLoss), rel(o.QContinueLoss, w.QContinueLoss))
			halting = halting && o.Count == w.Count
			if halting && got.Count != w.Count {
				t.Fatalf("step %d: %d sequences halted, %d in hrm.py and its twin", s+1, got.Count, w.Count)
			}
			if bound, ok := drift.Step(e, eo); !ok {
				t.Fatalf("step %d: loss %.6f, hrm.py %.6f, its twin %.6f: %v > %.3g", s+1, got.Loss, w.Loss, o.Loss, &drift, bound)
			}
			if lrw := float64(lr) * got.LRScale; math.Abs(lrw-w.LR) > 1e-6*w.LR {
				t.Errorf("step %d: learning rate %v, hrm.py %v", s+1, lrw, w.LR)
			}
			continue
		}
		if s%10 == 0 || s == steps-1 || e > tol || got.Count != w.Count {
			t.Logf("step %d: loss %.6f (torch %.6f) lm %.6f (%.6f) q_halt %.6f (%.6f) q_continue %.6f (%.6f) halted %d (%d) accuracy %.4f (%.4f)",
				s+1, got.Loss, w.Loss, got.LMLoss, w.LMLoss, got.QHaltLoss, w.QHaltLoss, got.QContinueLoss, w.QContinueLoss,
				got.Count, w.Count, got.Accuracy, w.Accuracy)
		}
		if got.Count != w.Count {
			t.Fatalf("step %d: %d sequences halted, %d in hrm.py (the halting decisions diverged)", s+1, got.Count, w.Count)
		}
		if e > tol {
			t.Fatalf("step %d: losses differ from hrm.py's by %.3g (tolerance %.3g)", s+1, e, tol)
		}
		if lrw := float64(lr) * got.LRScale; math.Abs(lrw-w.LR) > 1e-6*w.LR {
			t.Errorf("step %d: learning rate %v, hrm.py %v", s+1, lrw, w.LR)
		}
	}
	if twin {
		t.Logf("%d steps: relative loss differences: %v (halted counts compared throughout: %v)", steps, &drift, halting)
		return
	}
	t.Logf("%d steps: largest relative loss difference %.3g", steps, worst)
}

// TestHRMTorchParity: the default HRM at batch 32 on the GPU against
// hrm.py on the GPU over 50 segment steps of a replay: f32 (TF32 off on
// both sides) from Go's initial weights within 1e-4, bf16 from hrm.py's
// within 2e-2, while hrm.py agrees with its twin, then within
// opstest.DriftFactor × the twin's drift (opstest.DriftBound: hrm.py
// against itself breaks the fixed f32 bound by step 8, measured on an
// H100, trainer/hrm_gpu_test.go; this test with fixed bounds failed on an
// H100 on 2026-11-28 with a halting flip at step 9 in f32 and 0.0298 at
// step 19 in bf16), the step captured as a graph.
func TestHRMTorchParity(t *testing.T) {
	requireTorch(t)
	for _, c := range []struct {
		name      string
		prec      ops.Precision
		dt        tensor.DType
		tol       float64
		torchInit bool
	}{{"f32", ops.PrecF32, tensor.F32, 1e-4, false}, {"bf16", ops.PrecBF16, tensor.BF16, 2e-2, true}} {
		t.Run(c.name, func(t *testing.T) {
			e, a := hrmGPU(t, c.prec)
			hrmParity(t, e, a, nn.DefaultHRM(), c.dt, 32, 50, c.tol, c.torchInit, true, true, "cuda")
		})
	}
}

// TestHRMTorchParityCPU: a tiny HRM on the host backend against hrm.py on
// the CPU (f32) over 20 steps from hrm.py's initial weights: the contract
// (names, init file, replay, losses, halting, optimizers) without a GPU.
func TestHRMTorchParityCPU(t *testing.T) {
	requireTorch(t)
	e, a := hostEngine(t)
	cfg := tinySudokuHRM()
	hrmParity(t, e, a, cfg, tensor.F32, 8, 20, 1e-4, true, false, false, "cpu")
}

// BenchmarkHRMGPUStep times one training segment step of the default HRM
// (bf16, the reference's batch 768, the step replayed as a CUDA graph):
// the Go side of the step-time comparison with `hrm.py bench`.
func BenchmarkHRMGPUStep(b *testing.B) {
	e, a := hrmGPU(b, ops.PrecBF16)
	cfg := nn.DefaultHRM()
	const B = 768
	m, err := nn.NewHRM(a, "", cfg, true, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Free()
	h := newHRMTrainer(b, e, a, m, nn.HRMTrainConfig{Batch: B, Autocast: tensor.BF16, PoolSlots: 2, Warmup: 2000,
		LRMinRatio: 1, Graph: true}, 1e-4)
	r := replay(b, 1, B, 2, cfg.HaltMaxSteps)
	batch := func(s int) {
		k := s % 2
		lo, hi := k*B, (k+1)*B
		if err := h.tr.Stage(h.tr.Queued(), gridTokens(r.Inputs[lo:hi]), gridTokens(r.Labels[lo:hi]), r.MinHaltSteps[lo:hi]); err != nil {
			b.Fatal(err)
		}
		if err := h.tr.Run(); err != nil {
			b.Fatal(err)
		}
	}
	for s := 0; s < 3; s++ { // eager, capture, a replay
		batch(s)
	}
	if err := e.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch(i)
	}
	if err := e.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/step")
}

// BenchmarkHRMGPUEval times the evaluation of 768 puzzles (one batch) with
// halting, the batch one launch of the captured evaluation (its segment
// loop a conditional WHILE node; the first run eager, the second
// capturing, neither timed), and reports the mean segments.
func BenchmarkHRMGPUEval(b *testing.B) {
	e, a := hrmGPU(b, ops.PrecBF16)
	m, err := nn.NewHRM(a, "", nn.DefaultHRM(), false, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Free()
	ev, err := m.NewEval(e, a, "eval", 768, tensor.BF16)
	if err != nil {
		b.Fatal(err)
	}
	defer ev.Free()
	set := sudokuSet(rand.New(rand.NewPCG(1, 1)), 768, 0.5)
	in, lab := gridTokens(set.Inputs), gridTokens(set.Labels)
	var res nn.HRMEvalResult
	for i := 0; i < b.N+2; i++ {
		if i == 2 {
			b.ResetTimer()
		}
		if res, err = ev.Evaluate(in, lab, nn.HRMEvalOptions{Halting: true, Graph: true}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(res.MeanSegments, "segments")
}
