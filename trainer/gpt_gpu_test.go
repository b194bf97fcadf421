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
	"gpukit/libgpu/data"
)

// gptScript is the PyTorch reference of the GPT (bundled like mlpScript).
const gptScript = "../bench/reference/gpt.py"

// gptText is the corpus of the GPU GPT tests: $GPUKIT_TEXT when set (the
// GPU machine, which has no Go, is given tinyshakespeare.txt), else
// Newton's Opticks (on every machine with Go), else a generated text.
func gptText(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("GPUKIT_TEXT"); p != "" {
		return p
	}
	if p := data.DefaultTextPath(); fileExists(p) {
		return p
	}
	p := filepath.Join(t.TempDir(), "text.txt")
	var b strings.Builder
	words := []string{"light", "colour", "prism", "ray", "refraction", "of", "the", "and", "is", "glass", "\n"}
	for i := 0; b.Len() < 400000; i++ {
		b.WriteString(words[(i*7+i/13)%len(words)])
		b.WriteByte(' ')
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// gptParity trains steps steps of a small GPT in the trainer (GPU, CUDA
// graph) and in PyTorch (bench/reference/gpt.py parity) from the same
// initial weights on the same batches and learning rates, with dropout 0,
// and requires the losses to agree within tol (relative) at every step.
// It returns the trainer's run directory and batches file.
func gptParity(t *testing.T, precision string, steps int, tol float64) (string, string) {
	text := gptText(t)
	work := t.TempDir()
	seed := strconv.FormatUint(1+uint64(os.Getpid()%1000), 10)
	t.Logf("seed %s", seed)
	initFile, batches, out := filepath.Join(work, "init.safetensors"), filepath.Join(work, "batches.safetensors"), filepath.Join(work, "run")
	model := []string{"--model", "gpt", "--data", text, "--seed", seed, "--layers", "2", "--heads", "4", "--d-model", "128",
		"--block", "64", "--batch", "16"}
	mustOK(t, trainer(t, append([]string{"init", "--out", initFile}, model...)...))
	args := append([]string{"run", "--out", out, "--steps", strconv.Itoa(steps), "--warmup", "10", "--lr", "1e-3",
		"--log-every", "1", "--eval-every", strconv.Itoa(steps), "--precision", precision, "--batches-out", batches}, model...)
	r := trainer(t, args...)
	mustOK(t, r)
	if !strings.Contains(r.stderr, "cuda:") || !strings.Contains(r.stderr, "CUDA graph on") {
		t.Fatalf("not on the GPU with graphs: %s", r.stderr)
	}
	got, mfu := stepLosses(t, r.stdout)
	if len(got) != steps {
		t.Fatalf("%d loss lines, want %d", len(got), steps)
	}
	for _, u := range mfu {
		if !(u > 0 && u < 1) {
			t.Fatalf("mfu %v", u)
		}
	}
	dtype := "f32"
	if precision == "bf16" {
		dtype = "bf16"
	}
	want, _ := stepLosses(t, refScript(t, gptScript, "parity", "--init", initFile, "--batches", batches, "--dtype", dtype))
	if len(want) != steps {
		t.Fatalf("PyTorch wrote %d losses", len(want))
	}
	worst := 0.0
	for i := range got {
		rel := math.Abs(got[i]-want[i]) / math.Abs(want[i])
		worst = max(worst, rel)
		if !(rel <= tol) {
			t.Errorf("%s step %d: trainer loss %.7g, PyTorch %.7g (relative %.2g > %.0e)", precision, i+1, got[i], want[i], rel, tol)
		}
	}
	t.Logf("%s, %d steps: largest relative loss difference %.2g; loss %.4f → %.4f", precision, steps, worst, got[0], got[steps-1])
	return out, batches
}

// TestGPUGPTParityF32: 100 steps in f32 (no TF32 on either side) agree
// within 1e-4 relative at every step; PyTorch loads the trained checkpoint
// into nanoGPT's module with load_state_dict(strict=True) and reproduces
// the trainer's validation loss within 1e-3.
func TestGPUGPTParityF32(t *testing.T) {
	cudatest.RequireGPU(t)
	out, _ := gptParity(t, "f32", 100, 1e-4)
	ck := filepath.Join(out, "model.safetensors")
	text := gptText(t)
	var ours struct {
		ValLoss float64 `json:"val_loss"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(trainer(t, "eval", "--ckpt", ck, "--data", text, "--precision", "f32").stdout)), &ours); err != nil {
		t.Fatal(err)
	}
	vb := filepath.Join(t.TempDir(), "val.safetensors")
	mustOK(t, trainer(t, "eval", "--ckpt", ck, "--data", text, "--precision", "f32", "--batches-out", vb))
	var theirs struct {
		ValLoss float64 `json:"val_loss"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(refScript(t, gptScript, "eval", "--ckpt", ck, "--batches", vb))), &theirs); err != nil {
		t.Fatal(err)
	}
	if d := math.Abs(ours.ValLoss-theirs.ValLoss) / theirs.ValLoss; !(d <= 1e-3) {
		t.Errorf("validation loss: trainer %.6f, PyTorch %.6f (relative %.2g > 1e-3)", ours.ValLoss, theirs.ValLoss, d)
	}
	t.Logf("validation loss: trainer %.6f, PyTorch (load_state_dict) %.6f", ours.ValLoss, theirs.ValLoss)
}

// TestGPUGPTParityBF16: 200 steps under bf16 autocast agree within 2e-2.
func TestGPUGPTParityBF16(t *testing.T) {
	cudatest.RequireGPU(t)
	gptParity(t, "bf16", 200, 2e-2)
}

// TestGPUGPTGraphEqualsEager: the same run with the step replayed as a CUDA
// graph and launched op by op gives bitwise the same loss lines.
func TestGPUGPTGraphEqualsEager(t *testing.T) {
	cudatest.RequireGPU(t)
	text := gptText(t)
	var runs [2][]float64
	for i, g := range []string{"on", "off"} {
		r := trainer(t, "run", "--model", "gpt", "--data", text, "--out", t.TempDir(), "--steps", "30", "--log-every", "1",
			"--layers", "2", "--d-model", "128", "--block", "64", "--batch", "8", "--dropout", "0.1", "--precision", "bf16",
			"--graph", g)
		mustOK(t, r)
		runs[i], _ = stepLosses(t, r.stdout)
	}
	for i := range runs[0] {
		if runs[0][i] != runs[1][i] {
			t.Fatalf("step %d: graph %v, eager %v", i+1, runs[0][i], runs[1][i])
		}
	}
}

// TestGPUGPTGenerate: generate streams the requested number of characters
// from a trained checkpoint with the decode step as a CUDA graph, the same
// text as eager decoding, and the same text again for the same seed.
func TestGPUGPTGenerate(t *testing.T) {
	cudatest.RequireGPU(t)
	text := gptText(t)
	out := t.TempDir()
	mustOK(t, trainer(t, "run", "--model", "gpt", "--data", text, "--out", out, "--steps", "50", "--layers", "2",
		"--d-model", "64", "--block", "32", "--batch", "8"))
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

// TestGPUNanoGPTLoadsCheckpoint: nanoGPT's own GPT module (model.py,
// vendored in testdata/nanogpt with its MIT licence) loads the trainer's
// model.safetensors and best.safetensors with load_state_dict(strict=True)
// (testdata/nanogpt/load.py: every tensor a key, every key a tensor) and
// reproduces the trainer's validation loss of each within 1e-3 in f32.
func TestGPUNanoGPTLoadsCheckpoint(t *testing.T) {
	cudatest.RequireGPU(t)
	text := gptText(t)
	out := t.TempDir()
	mustOK(t, trainer(t, "run", "--model", "gpt", "--data", text, "--out", out, "--steps", "60", "--layers", "2", "--heads", "4",
		"--d-model", "128", "--block", "64", "--batch", "16", "--eval-every", "20", "--precision", "f32", "--log-every", "20"))
	for _, file := range []string{"model.safetensors", "best.safetensors"} {
		ck := filepath.Join(out, file)
		vb := filepath.Join(t.TempDir(), "val.safetensors")
		var ours, theirs struct {
			ValLoss float64 `json:"val_loss"`
			Tensors int     `json:"tensors"`
		}
		r := trainer(t, "eval", "--ckpt", ck, "--data", text, "--precision", "f32", "--batches-out", vb)
		mustOK(t, r)
		if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &ours); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("python3", filepath.Join("testdata", "nanogpt", "load.py"), "--ckpt", ck, "--batches", vb)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("nanoGPT's model.py on %s: %v\n%s", file, err, stderr.String())
		}
		if err := json.Unmarshal([]byte(strings.TrimSpace(string(b))), &theirs); err != nil {
			t.Fatalf("load.py printed %q: %v", b, err)
		}
		if d := math.Abs(ours.ValLoss-theirs.ValLoss) / theirs.ValLoss; !(d <= 1e-3) {
			t.Errorf("%s: validation loss trainer %.6f, nanoGPT %.6f (relative %.2g > 1e-3)", file, ours.ValLoss, theirs.ValLoss, d)
		}
		t.Logf("%s: %d tensors loaded strictly by nanoGPT's GPT; validation loss trainer %.6f, nanoGPT %.6f", file, theirs.Tensors, ours.ValLoss, theirs.ValLoss)
	}
}
