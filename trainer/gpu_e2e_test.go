package main

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/ops/opstest"
)

// gpuData is requireData on a machine that must have a GPU (skips on CI,
// fails on the GPU machine where GPUKIT_REQUIRE_GPU=1).
func gpuData(t *testing.T) string {
	t.Helper()
	cudatest.RequireGPU(t)
	return requireData(t)
}

// TestGPUResumeEqualsUninterrupted: on the GPU with the step captured as a
// CUDA graph, kill -TERM writes a checkpoint and --resume continues with
// bitwise the same loss lines and final state (the resumed run replays its
// first step eagerly, then captures again).
func TestGPUResumeEqualsUninterrupted(t *testing.T) {
	// The whole training set, so the run is still going when the signal
	// arrives (a GPU does 200 steps of a small subset in milliseconds).
	resumeEqualsUninterrupted(t, gpuData(t), "0", "--device", "cuda", "--graph", "on")
}

// stepLosses reads the loss of every step from trainer's JSON lines
// (--log-every 1), with the mfu values.
func stepLosses(t *testing.T, stdout string) (loss []float64, mfu []float64) {
	t.Helper()
	for _, text := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var l struct {
			Step int      `json:"step"`
			Loss *float64 `json:"loss"`
			MFU  *float64 `json:"mfu"`
		}
		if err := json.Unmarshal([]byte(text), &l); err != nil {
			t.Fatalf("not a JSON line: %q", text)
		}
		if l.Loss == nil {
			continue
		}
		if l.Step != len(loss)+1 {
			t.Fatalf("loss line of step %d after %d steps", l.Step, len(loss))
		}
		loss = append(loss, *l.Loss)
		if l.MFU != nil {
			mfu = append(mfu, *l.MFU)
		}
	}
	return loss, mfu
}

// refScript runs a bundled PyTorch reference script (mlpScript, gptScript,
// moeScript) with args and returns its stdout; it fails t with the
// script's stderr when the script fails, and logs its stderr otherwise.
func refScript(t *testing.T, script string, args ...string) string {
	t.Helper()
	path := bundled(script)
	cmd := exec.Command("python3", append([]string{path}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 %s %v: %v\n%s", path, args, err, stderr.String())
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("%s: %s", filepath.Base(path), s)
	}
	return string(out)
}

func accuracy(t *testing.T, out string) float64 {
	t.Helper()
	var v struct {
		TestAccuracy *float64 `json:"test_accuracy"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &v); err != nil || v.TestAccuracy == nil {
		t.Fatalf("no test_accuracy in %q", out)
	}
	return *v.TestAccuracy
}

// TestGPUParityWithPyTorch: trainer init writes the initial weights;
// trainer run (default device: the GPU; f32; CUDA graph) trains 200 steps
// and writes its batch order; bench/reference/mlp.py trains the same MLP in
// PyTorch from the same weights on the same batches. The losses agree
// within 1e-4 relative at every step. PyTorch's accuracy of the trainer's
// model.safetensors equals the trainer's own within 0.1%, and the other
// way round for PyTorch's trained weights.
func TestGPUParityWithPyTorch(t *testing.T) {
	// With GELU (smooth) the two runs differ only by rounding: the losses
	// agree within 1e-4 at every one of the 200 steps.
	t.Run("gelu", func(t *testing.T) {
		cudatest.RequireGPU(t)
		parity(t, "gelu", 200, 1e-4, false)
	})
	// With ReLU, cuBLASLt and PyTorch's cuBLAS sum in different orders, so
	// a pre-activation within rounding of 0 can take the other side of the
	// kink in one of them; Adam's division by √v̂ turns that one gradient
	// element into an lr-sized step, and from there the runs part like any
	// chaotic system. Measured on an H200 (2026-11-22), three seeds: largest
	// difference over 200 steps 4.2e-7, 2.1e-4 and 1.8e-2, always within
	// 1e-4 for the first 50 steps, and the same test accuracy (±0.01%). So:
	// 1e-4 for the first 50 steps, the 200-step figure logged, and the
	// accuracies within 0.1% (checked by parity). That guess failed on an
	// H100 (2026-11-28): 3.6e-4 at step 41, 1.1e-3 at step 50. So the ReLU
	// run is held to opstest.DriftBound instead: a PyTorch twin whose initial
	// weights differ by one f32 rounding (mlp.py --perturb 6e-8) measures
	// how far PyTorch drifts from itself, and the trainer may drift at most
	// opstest.DriftFactor times that (1e-4 while the twin still agrees).
	t.Run("relu", func(t *testing.T) {
		cudatest.RequireGPU(t)
		parity(t, "relu", 200, 1e-4, true)
	})
}

// parity trains 200 f32 AdamW steps of the MLP with activation act in the trainer and in
// PyTorch (bench/reference/mlp.py) from the same initial weights on the same
// batches, requires the losses to agree within tol for the first strict
// steps (with twin, within opstest.DriftBound of a PyTorch twin run from weights
// perturbed by one f32 rounding), checks each side's test accuracy of the
// other's model (±0.1%), and returns the relative loss difference of every
// step.
func parity(t *testing.T, act string, strict int, tol float64, twin bool) []float64 {
	dir := gpuData(t)
	work := t.TempDir()
	seed := strconv.FormatUint(1+uint64(os.Getpid()%1000), 10)
	initFile, batches, out := filepath.Join(work, "init.safetensors"), filepath.Join(work, "batches.safetensors"), filepath.Join(work, "run")
	mustOK(t, trainer(t, "init", "--out", initFile, "--seed", seed))
	args := []string{"run", "--data", dir, "--out", out, "--seed", seed, "--limit", "25600", "--batch", "128",
		"--epochs", "1", "--log-every", "1", "--precision", "f32", "--batches-out", batches, "--act", act}
	r := trainer(t, args...)
	mustOK(t, r)
	if !strings.Contains(r.stderr, "training on cuda:") || !strings.Contains(r.stderr, "CUDA graph on") {
		t.Fatalf("the default device is not the GPU with graphs: %s", r.stderr)
	}
	got, mfu := stepLosses(t, r.stdout)
	if len(got) != 200 {
		t.Fatalf("%d loss lines, want 200", len(got))
	}
	for _, u := range mfu {
		if !(u > 0 && u < 1) {
			t.Fatalf("mfu %v", u)
		}
	}
	torchModel := filepath.Join(work, "torch.safetensors")
	want, _ := stepLosses(t, refScript(t, mlpScript, "train", "--init", initFile, "--batches", batches, "--data", dir, "--precision", "f32", "--out", torchModel))
	if len(want) != 200 {
		t.Fatalf("PyTorch wrote %d losses", len(want))
	}
	var twinLoss []float64
	if twin {
		if twinLoss, _ = stepLosses(t, refScript(t, mlpScript, "train", "--init", initFile, "--batches", batches, "--data", dir, "--precision", "f32", "--perturb", "6e-8")); len(twinLoss) != 200 {
			t.Fatalf("PyTorch's twin wrote %d losses", len(twinLoss))
		}
	}
	rel := make([]float64, len(got))
	worst := 0.0
	drift := opstest.DriftBound{Floor: tol}
	for i := range got {
		rel[i] = math.Abs(got[i]-want[i]) / math.Abs(want[i])
		worst = max(worst, rel[i])
		if twin {
			if bound, ok := drift.Step(rel[i], math.Abs(twinLoss[i]-want[i])/math.Abs(want[i])); i < strict && !ok {
				t.Errorf("%s step %d: trainer loss %.7g, PyTorch %.7g, its twin %.7g: %v > bound %.2g", act, i+1, got[i], want[i], twinLoss[i], &drift, bound)
				break
			}
			continue
		}
		if i < strict && !(rel[i] <= tol) {
			t.Errorf("%s step %d: trainer loss %.7g, PyTorch %.7g (relative %.2g > %.0e)", act, i+1, got[i], want[i], rel[i], tol)
		}
	}
	if twin {
		t.Logf("%s: %v", act, &drift)
	}
	t.Logf("%s, 200 steps: largest relative loss difference %.2g (first %d steps within %.0e); loss %.4f → %.4f", act, worst, strict, tol, got[0], got[199])

	model := filepath.Join(out, "model.safetensors")
	for _, m := range []string{model, torchModel} {
		ours := accuracy(t, trainer(t, "eval", "--ckpt", m, "--data", dir, "--precision", "f32", "--act", act).stdout)
		theirs := accuracy(t, refScript(t, mlpScript, "eval", "--ckpt", m, "--data", dir, "--act", act))
		if math.Abs(ours-theirs) > 0.001 {
			t.Errorf("%s: trainer eval %.4f, PyTorch %.4f", filepath.Base(m), ours, theirs)
		}
		t.Logf("%s: test accuracy trainer %.4f, PyTorch %.4f", filepath.Base(m), ours, theirs)
	}
	return rel
}

// TestGPUPipeline runs examples/pipelines/train-fashion.sh with its defaults
// on a GPU: the pool serves GPU memory, the trainer replays CUDA graphs, and
// the script itself fails unless the test accuracy reaches 89%.
func TestGPUPipeline(t *testing.T) {
	dir := gpuData(t)
	bin := os.Getenv("GPUKIT_BIN")
	script := filepath.Join("..", "examples", "pipelines", "train-fashion.sh")
	if bin == "" {
		bin = t.TempDir()
		build := exec.Command("go", "build", "-o", filepath.Join(bin, "gpupool"), ".")
		build.Dir = filepath.Join("..", "gpupool")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building gpupool: %v: %s", err, out)
		}
		if err := os.Symlink(filepath.Join(binDir, "trainer"), filepath.Join(bin, "trainer")); err != nil {
			t.Fatal(err)
		}
	} else {
		script = bundled(script)
	}
	out := t.TempDir()
	cmd := exec.Command("bash", script)
	cmd.Env = append(os.Environ(), "GPUKIT_BIN="+bin, "DATA="+dir, "OUT="+out, "TMPDIR="+t.TempDir())
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("pipeline: %v\nstderr:\n%s", err, se.String())
	}
	if !strings.Contains(se.String(), "cuda:") {
		t.Fatalf("the pipeline did not pick the GPU:\n%s", se.String())
	}
	ls := parseLines(t, so.String())
	if last := ls[len(ls)-1]; last.TestAccuracy == nil || *last.TestAccuracy < 0.89 {
		t.Fatalf("last line %v", last)
	}
	t.Logf("%s", strings.TrimSpace(se.String()[strings.LastIndex(strings.TrimSpace(se.String()), "\n")+1:]))
}
