package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/gif"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/data"
	"gpukit/libgpu/tensor"
)

func relDiff(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(a[i]) * float64(a[i])
	}
	if math.IsNaN(num) {
		return math.Inf(1)
	}
	return math.Sqrt(num / math.Max(den, 1e-30))
}

// toolBin returns a directory with gpupool, trainer and sampler: $GPUKIT_BIN
// (the GPU machine's bundle, which has no Go) or fresh builds.
func toolBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("GPUKIT_BIN"); bin != "" {
		return bin
	}
	bin := t.TempDir()
	for _, tool := range []string{"gpupool", "trainer", "sampler"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, tool), ".")
		cmd.Dir = filepath.Join("..", tool)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", tool, err, out)
		}
	}
	return bin
}

// requireData fails (not skips) without Fashion-MNIST (make deps installs
// it; GPUKIT_DATA_DIR names another directory).
func requireData(t *testing.T) string {
	t.Helper()
	dir := data.DefaultDir
	if d := os.Getenv("GPUKIT_DATA_DIR"); d != "" {
		dir = d
	}
	if _, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte.gz")); err != nil {
		t.Fatalf("Fashion-MNIST is not installed in %s (make deps, or set GPUKIT_DATA_DIR): %v", dir, err)
	}
	return dir
}

// TestPipeline runs examples/pipelines/diffusion-fashion.sh on the host
// with a tiny U-Net trained a few dozen steps through a gpupool daemon,
// and checks what it made: a PNG grid that image/png decodes; samples from
// the pool's weight snapshot equal, bit for bit, to samples from the
// checkpoint of the same step; an animated GIF that image/gif decodes
// with one frame per --frames, and the PNG frames; and the score line
// (class accuracy in [0, 1], a finite FD-MLP, a classifier that learnt).
func TestPipeline(t *testing.T) {
	pipeline(t, 4, 0, "DEVICE=host", "FRAMES=4")
}

// TestGPUPipeline is TestPipeline on the GPU with the default U-Net
// (64-128-256, bf16) trained 200 steps: the pool's snapshot gives the
// checkpoint's images within bf16 rounding (the two processes may pick
// different GEMM algorithms), and 1024 samples are scored.
func TestGPUPipeline(t *testing.T) {
	cudatest.RequireGPU(t)
	pipeline(t, 8, 2e-2, "DEVICE=cuda", "FRAMES=8", "STEPS=200", "BATCH=64", "SAMPLES=1024", "MIN_ACCURACY=0")
}

// pipeline runs the script with env and checks its outputs; tol bounds
// the relative difference of the samples drawn from the pool and from the
// checkpoint (0: bitwise equal).
func pipeline(t *testing.T, frames int, tol float64, env ...string) {
	dir := requireData(t)
	bin := toolBin(t)
	out := t.TempDir()
	cmd := exec.Command("bash", bundled(filepath.Join("..", "examples", "pipelines", "diffusion-fashion.sh")))
	cmd.Env = append(append(os.Environ(), "GPUKIT_BIN="+bin, "DATA="+dir, "OUT="+out, "TMPDIR="+t.TempDir()), env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("pipeline: %v\nstderr:\n%s", err, se.String())
	}
	lines := strings.Split(strings.TrimSpace(so.String()), "\n")
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Fatalf("stdout line is not JSON: %q", l)
		}
	}
	// The grid: 10 columns and 2 rows of 32×32 with 2-pixel gaps.
	f, err := os.Open(filepath.Join(out, "grid.png"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 10*34+2 || b.Dy() != 2*34+2 {
		t.Errorf("grid is %v, want 342×70", b)
	}
	// Pool snapshot == checkpoint.
	read := func(name string) []byte {
		c, err := ckpt.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		_, b, err := c.Bytes("samples")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := read("ckpt-samples.safetensors"), read("pool-samples.safetensors")
	if len(a) != 20*32*32*4 || len(b) != len(a) {
		t.Fatalf("%d and %d bytes of samples, want %d", len(a), len(b), 20*32*32*4)
	}
	if tol == 0 && !bytes.Equal(a, b) {
		t.Error("samples from the pool's snapshot differ from the checkpoint's")
	}
	if e := relDiff(tensor.BytesAs[float32](a), tensor.BytesAs[float32](b)); e > tol {
		t.Errorf("samples from the pool's snapshot differ from the checkpoint's by %.3g (relative)", e)
	}
	// The video.
	g, err := os.Open(filepath.Join(out, "video.gif"))
	if err != nil {
		t.Fatal(err)
	}
	anim, err := gif.DecodeAll(g)
	g.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(anim.Image) != frames || anim.Image[0].Bounds().Dx() != 32 {
		t.Errorf("GIF of %d frames of %v, want %d of 32×32", len(anim.Image), anim.Image[0].Bounds(), frames)
	}
	for i := 0; i < frames; i++ {
		if _, err := os.Stat(filepath.Join(out, "frames", fmt.Sprintf("frame_%04d.png", i))); err != nil {
			t.Error(err)
		}
	}
	// The score.
	var sc struct {
		Accuracy     *float64 `json:"accuracy"`
		FD           *float64 `json:"fd_mlp"`
		TestAccuracy float64  `json:"test_accuracy"`
		N            int      `json:"n"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sc); err != nil || sc.Accuracy == nil || sc.FD == nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	if *sc.Accuracy < 0 || *sc.Accuracy > 1 || math.IsNaN(*sc.FD) || *sc.FD < 0 || sc.TestAccuracy < 0.5 || sc.N < 100 {
		t.Errorf("score %+v (accuracy %v, FD %v)", sc, *sc.Accuracy, *sc.FD)
	}
}
