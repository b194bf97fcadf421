package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/tensor"
)

// mlpScript is the PyTorch reference. The GPU bundle, which has no source
// tree, carries it in testdata/ (scripts/gpu-files.txt).
const mlpScript = "../bench/reference/mlp.py"

// bundled returns rel when it exists (a source tree), else the copy the GPU
// bundle puts in testdata/.
func bundled(rel string) string {
	if _, err := os.Stat(rel); err == nil {
		return rel
	}
	return filepath.Join("testdata", filepath.Base(rel))
}

// TestClipAndBatchesOut (host): --clip puts grad_norm in every loss line,
// changes the losses after the first step, is stored in the checkpoint's
// config, and --batches-out writes one row of example indices per step.
func TestClipAndBatchesOut(t *testing.T) {
	dir := requireData(t)
	common := []string{"run", "--data", dir, "--limit", "640", "--batch", "32", "--epochs", "1", "--log-every", "1", "--device", "host"}
	plain, clipped := t.TempDir(), t.TempDir()
	batches := filepath.Join(t.TempDir(), "batches.safetensors")
	r1 := trainer(t, append(common, "--out", plain)...)
	mustOK(t, r1)
	r2 := trainer(t, append(common, "--out", clipped, "--clip", "0.05", "--batches-out", batches)...)
	mustOK(t, r2)
	l1, l2 := losses(parseLines(t, r1.stdout)), losses(parseLines(t, r2.stdout))
	if len(l1) != 20 || len(l2) != 20 || l1[0] != l2[0] || slices.Equal(l1, l2) {
		t.Fatalf("losses without clipping %v, with %v: want the same first loss and then others", l1, l2)
	}
	if n := bytes.Count([]byte(r2.stdout), []byte(`"grad_norm":`)); n != 20 {
		t.Fatalf("%d grad_norm fields in 20 loss lines", n)
	}
	if bytes.Contains([]byte(r1.stdout), []byte(`"grad_norm":`)) {
		t.Fatal("grad_norm without --clip")
	}
	f, err := ckpt.ReadFile(filepath.Join(clipped, "model.safetensors"))
	if err != nil || !bytes.Contains([]byte(f.Metadata["config"]), []byte(`"clip":0.05`)) {
		t.Fatalf("checkpoint config %q (%v)", f.Metadata["config"], err)
	}
	b, err := ckpt.ReadFile(batches)
	if err != nil {
		t.Fatal(err)
	}
	info, raw, err := b.Bytes("indices")
	if err != nil || !slices.Equal(info.Shape, []int{20, 32}) || b.Metadata["steps"] != strconv.Itoa(20) {
		t.Fatalf("batches file: %v %v %v", info.Shape, b.Metadata, err)
	}
	seen := map[int32]bool{}
	for _, i := range tensor.BytesAs[int32](raw) {
		if i < 0 || i >= 640 || seen[i] {
			t.Fatalf("index %d out of the limit or repeated within the epoch", i)
		}
		seen[i] = true
	}
}
