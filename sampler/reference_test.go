package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
)

// bundled is rel in the source tree, or its copy in testdata/ in the GPU
// bundle (scripts/gpu-files.txt).
func bundled(rel string) string {
	if _, err := os.Stat(rel); err == nil {
		return rel
	}
	return filepath.Join("testdata", filepath.Base(rel))
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, se.String())
	}
	return so.String()
}

// TestGPUReferenceImages: bench/reference/unet.py, loading the checkpoint
// of a U-Net the trainer trained briefly on the GPU, draws the images
// sampler draws from the same weights, seed and scheduler settings (its
// own implementation of the U-Net, the schedules, the update rules and the
// Philox noise): within 1e-3 with f32 on both sides for each scheduler
// (guided, 24 images in runs of 16, so the last run is partial), and
// within bf16's error with bf16 activations on both sides.
func TestGPUReferenceImages(t *testing.T) {
	cudatest.RequireGPU(t)
	dir := requireData(t)
	bin := toolBin(t)
	work := t.TempDir()
	ck := filepath.Join(work, "unet", "model.safetensors")
	run(t, filepath.Join(bin, "trainer"), "run", "--model", "unet", "--data", dir, "--out", filepath.Join(work, "unet"),
		"--steps", "150", "--batch", "32", "--device", "cuda", "--precision", "bf16", "--log-every", "50")
	script := bundled(filepath.Join("..", "bench", "reference", "unet.py"))
	for _, c := range []struct {
		prec, scheduler, steps, eta string
		tol                         float64
	}{
		{"f32", "dpmsolver++", "10", "0", 1e-3},
		{"f32", "ddim", "10", "0.5", 1e-3},
		{"f32", "ddpm", "25", "0", 1e-3},
		{"bf16", "dpmsolver++", "10", "0", 5e-2},
	} {
		samples := filepath.Join(work, c.prec+"-"+c.scheduler+".safetensors")
		run(t, filepath.Join(bin, "sampler"), "sample", "--ckpt", ck, "--device", "cuda", "--precision", c.prec,
			"--scheduler", c.scheduler, "--steps", c.steps, "--eta", c.eta, "--guidance-scale", "3", "--n", "24", "--batch", "16",
			"--seed", "3", "--out", filepath.Join(work, "g.png"), "--force", "--save", samples)
		out := run(t, "python3", script, "compare", "--ckpt", ck, "--samples", samples, "--dtype", c.prec)
		var r struct {
			RelErr float64 `json:"rel_err"`
			MaxAbs float64 `json:"max_abs"`
		}
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
			t.Fatalf("unet.py compare: %q: %v", out, err)
		}
		t.Logf("%s %s: PyTorch vs sampler relative error %.3g, max |Δ| %.3g", c.prec, c.scheduler, r.RelErr, r.MaxAbs)
		if !(r.RelErr <= c.tol) {
			t.Errorf("%s %s: PyTorch's images differ from sampler's by %.3g (relative; max |Δ| %.3g)", c.prec, c.scheduler, r.RelErr, r.MaxAbs)
		}
	}
}
