package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/ops/opstest"
)

// moeScript is the PyTorch reference of the MoE GPT (bundled with gpt.py,
// which it imports).
const moeScript = "../bench/reference/moe.py"

// moeSteps are the {loss, aux_loss, z_loss} of each step's line, in order.
func moeSteps(t *testing.T, stdout string) [][3]float64 {
	t.Helper()
	var out [][3]float64
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var v struct {
			Step int      `json:"step"`
			Loss *float64 `json:"loss"`
			Aux  *float64 `json:"aux_loss"`
			Z    *float64 `json:"z_loss"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		if v.Loss == nil {
			continue
		}
		if v.Aux == nil || v.Z == nil || v.Step != len(out)+1 {
			t.Fatalf("line %q after %d steps: want step %d with aux_loss and z_loss", l, len(out), len(out)+1)
		}
		out = append(out, [3]float64{*v.Loss, *v.Aux, *v.Z})
	}
	return out
}

// moeParity trains steps steps of a small MoE GPT (4 blocks, d 128, 8
// experts of width 512, top-2, MoE MLPs in blocks 1 and 3) in the trainer
// (GPU, CUDA graph) and in PyTorch (bench/reference/moe.py parity) from
// the same initial weights (trainer init) on the same batches and
// learning rates (--batches-out), dropout 0, clipping and weight decay
// on, and requires the cross-entropy within tol and the load-balancing
// and z-losses within tolAux (relative) while PyTorch agrees with its twin. moe.py
// runs a second time, the twin, one rounding apart: in bf16 its router reads the
// bf16 activations instead of autocast's f32 LayerNorm output
// (--router-input compute), in f32 every initial weight is moved by one
// rounding (--perturb 6e-8); the bounds are opstest.DriftBound's floors: the trainer
// may drift from PyTorch as far as opstest.DriftFactor × PyTorch's drift from its
// twin; a failure logs the three runs around the step. It returns the
// trainer's run directory.
func moeParity(t *testing.T, precision string, steps int, tol, tolAux float64, extra ...string) string {
	text := gptText(t)
	work := t.TempDir()
	seed := strconv.FormatUint(1+uint64(os.Getpid()%1000), 10)
	if v := os.Getenv("GPUKIT_PARITY_SEED"); v != "" {
		seed = v // repeats a logged seed
	}
	t.Logf("seed %s (GPUKIT_PARITY_SEED repeats it)", seed)
	initFile, batches, out := filepath.Join(work, "init.safetensors"), filepath.Join(work, "batches.safetensors"), filepath.Join(work, "run")
	model := append([]string{"--model", "moe", "--data", text, "--seed", seed, "--layers", "4", "--heads", "4", "--d-model", "128",
		"--block", "64", "--batch", "16", "--experts", "8", "--top-k", "2", "--moe-every", "2"}, extra...)
	mustOK(t, trainer(t, append([]string{"init", "--out", initFile}, model...)...))
	r := trainer(t, append([]string{"run", "--out", out, "--steps", strconv.Itoa(steps), "--warmup", "10", "--lr", "1e-3",
		"--log-every", "1", "--eval-every", strconv.Itoa(steps), "--precision", precision, "--batches-out", batches}, model...)...)
	mustOK(t, r)
	if !strings.Contains(r.stderr, "cuda:") || !strings.Contains(r.stderr, "CUDA graph on") {
		t.Fatalf("not on the GPU with graphs: %s", r.stderr)
	}
	got := moeSteps(t, r.stdout)
	if len(got) != steps {
		t.Fatalf("%d loss lines, want %d", len(got), steps)
	}
	if _, mfu := stepLosses(t, r.stdout); len(mfu) != steps || !(mfu[steps-1] > 0 && mfu[steps-1] < 1) {
		t.Fatalf("mfu %v", mfu)
	}
	dtype := "f32"
	if precision == "bf16" {
		dtype = "bf16"
	}
	py := []string{"parity", "--init", initFile, "--batches", batches, "--dtype", dtype}
	want := moeSteps(t, refScript(t, moeScript, py...))
	if len(want) != steps {
		t.Fatalf("PyTorch wrote %d steps", len(want))
	}
	names := []string{"cross-entropy", "load-balancing loss", "z-loss"}
	rel := func(a, b [][3]float64, i, j int) float64 { return math.Abs(a[i][j]-b[i][j]) / math.Abs(b[i][j]) }
	// The twin: one rounding changed (bf16: the router reads the
	// compute-dtype activations; f32: every initial weight moved by
	// one rounding).
	twinArgs := []string{"--router-input", "compute"}
	if precision == "f32" {
		twinArgs = []string{"--perturb", "6e-8"}
	}
	other := moeSteps(t, refScript(t, moeScript, append(py, twinArgs...)...))
	if len(other) != steps {
		t.Fatalf("PyTorch's twin wrote %d steps", len(other))
	}
	ds := []opstest.DriftBound{{Floor: tol}, {Floor: tolAux}, {Floor: tolAux}}
	for i := range got {
		for j := range ds {
			if bound, ok := ds[j].Step(rel(got, want, i, j), rel(other, want, i, j)); !ok {
				for k := max(i-10, 0); k < min(i+11, steps); k++ {
					t.Logf("step %d: here %.5f %.4f %.4f, PyTorch %.5f %.4f %.4f, its twin %.5f %.4f %.4f", k+1,
						got[k][0], got[k][1], got[k][2], want[k][0], want[k][1], want[k][2], other[k][0], other[k][1], other[k][2])
				}
				t.Fatalf("%s step %d: %s %.7g here, %.7g in PyTorch (%.7g in its twin): %s > %.2g", precision, i+1, names[j],
					got[i][j], want[i][j], other[i][j], &ds[j], bound)
			}
		}
	}
	t.Logf("%s, %d steps: %s %s; %s %s; %s %s; loss %.4f → %.4f", precision, steps, names[0], &ds[0], names[1], &ds[1],
		names[2], &ds[2], got[0][0], got[steps-1][0])
	return out
}

// TestGPUMoEParityF32: 100 steps in f32 (no TF32 on either side), biases
// on (the experts' [E, W] biases: no weight decay on either side): the
// cross-entropy agrees within 1e-4 relative, the auxiliary losses within
// 1e-3 (libgpu/nn's parity bound: a token whose k-th and (k+1)-th router
// logits differ by rounding can be routed differently, which moves the
// load-balancing count by 1/T), and within opstest.DriftFactor × PyTorch's
// drift from its f32 twin after (a GPU machine, 2026-11-28, seed 213: the
// cross-entropy 1.9e-4 from PyTorch at step 98 of 100, past a fixed 1e-4,
// once routing choices had flipped); moe.py loads
// the trained model.safetensors with load_state_dict(strict=True) and
// reproduces the trainer's validation loss within 1e-3.
func TestGPUMoEParityF32(t *testing.T) {
	cudatest.RequireGPU(t)
	out := moeParity(t, "f32", 100, 1e-4, 1e-3, "--bias")
	ck := filepath.Join(out, "model.safetensors")
	text := gptText(t)
	vb := filepath.Join(t.TempDir(), "val.safetensors")
	var ours, theirs struct {
		ValLoss float64 `json:"val_loss"`
	}
	r := trainer(t, "eval", "--ckpt", ck, "--data", text, "--precision", "f32", "--batches-out", vb)
	mustOK(t, r)
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &ours); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(refScript(t, moeScript, "eval", "--ckpt", ck, "--batches", vb))), &theirs); err != nil {
		t.Fatal(err)
	}
	if d := math.Abs(ours.ValLoss-theirs.ValLoss) / theirs.ValLoss; !(d <= 1e-3) {
		t.Errorf("validation loss: trainer %.6f, PyTorch %.6f (relative %.2g > 1e-3)", ours.ValLoss, theirs.ValLoss, d)
	}
	t.Logf("validation loss: trainer %.6f, PyTorch (load_state_dict strict) %.6f", ours.ValLoss, theirs.ValLoss)
}

// TestGPUMoEParityBF16: 200 steps under bf16 autocast (PyTorch's expert
// products through torch._grouped_mm where it runs; both routers in f32):
// the cross-entropy within 2e-2 and the auxiliary losses within 5e-2
// while PyTorch agrees with its twin (its router's input rounded to bf16),
// and within opstest.DriftFactor × PyTorch's own drift after. A fixed bound cannot
// hold over 200 steps: on an H100 (2026-11-28, seed 7) moe.py against its
// twin drifted to 3.0e-2 in cross-entropy and 8.6e-2 in z-loss, moe.py
// bf16 against moe.py f32 to 1.1e-2 and 9.0e-2 (the twin 3.0e-2, 0.13),
// the trainer against moe.py to 9.5e-3 and 8.6e-2: a few top-2 choices
// flip by rounding in the first steps, and the routers' logit scale, a
// slow variable, keeps an offset (moe.py bf16's z-loss 3.9% below f32's
// on average from step 50; the mean z-loss over steps 101–200 was 4.11
// here, 4.05 in moe.py, 3.93 in its twin, 4.24 in f32). Seed 899
// (2026-11-28, H100) still fails: the trainer's cross-entropy 6.9% above
// moe.py's at step 84 while the twins agree within 1.4% — not explained
// yet.
func TestGPUMoEParityBF16(t *testing.T) {
	cudatest.RequireGPU(t)
	moeParity(t, "bf16", 200, 2e-2, 5e-2)
}

// TestGPUMoEGraphEqualsEager: a --model moe run with its step replayed
// as one CUDA graph (routing included: the expert counts and offsets
// stay on the device) and launched op by op gives bitwise the same
// cross-entropy, load-balancing and z-losses at every step, dropout on;
// generate from its checkpoint gives the same text with the decode step
// as a graph and eager, and again for the same seed.
func TestGPUMoEGraphEqualsEager(t *testing.T) {
	cudatest.RequireGPU(t)
	text := gptText(t)
	var runs [2][][3]float64
	out := t.TempDir()
	for i, g := range []string{"on", "off"} {
		dir := out
		if i == 1 {
			dir = t.TempDir()
		}
		r := trainer(t, "run", "--model", "moe", "--data", text, "--out", dir, "--steps", "30", "--log-every", "1",
			"--layers", "2", "--heads", "4", "--d-model", "128", "--block", "64", "--batch", "8", "--moe-every", "1",
			"--dropout", "0.1", "--precision", "bf16", "--graph", g)
		mustOK(t, r)
		runs[i] = moeSteps(t, r.stdout)
	}
	if len(runs[0]) != 30 || len(runs[1]) != 30 {
		t.Fatalf("%d and %d loss lines", len(runs[0]), len(runs[1]))
	}
	for i := range runs[0] {
		if runs[0][i] != runs[1][i] {
			t.Fatalf("step %d: graph %v, eager %v (loss, aux_loss, z_loss)", i+1, runs[0][i], runs[1][i])
		}
	}
	ck := filepath.Join(out, "model.safetensors")
	gen := func(graph string) string {
		r := trainer(t, "generate", "--ckpt", ck, "--prompt", "The ", "--tokens", "100", "--seed", "3", "--graph", graph)
		mustOK(t, r)
		return r.stdout
	}
	a, b, c := gen("on"), gen("on"), gen("off")
	if !strings.HasPrefix(a, "The ") || len([]rune(strings.TrimSuffix(a, "\n"))) != 104 {
		t.Fatalf("generated %d characters, want 100: %q", len([]rune(a)), a)
	}
	if a != b || a != c {
		t.Fatalf("generation differs: graph %q, again %q, eager %q", a, b, c)
	}
}
